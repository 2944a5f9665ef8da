#include "child_measure.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>

namespace posbias::bench {
namespace {

// One message of the child: a time, the peak growth, or a failure (its
// message follows in `length` bytes).
struct Record {
  enum Kind : std::int32_t { kTime = 0, kPeak = 1, kFailed = 2 };
  std::int32_t kind;
  std::int32_t length;
  double value;
};

bool write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void send(int fd, Record::Kind kind, double value, const std::string& text = "") {
  const Record r{kind, static_cast<std::int32_t>(text.size()), value};
  if (!write_all(fd, &r, sizeof r) || !write_all(fd, text.data(), text.size())) _exit(3);
}

[[noreturn]] void child_main(int fd, const std::function<void(ChildReport&)>& work) {
  try {
    ChildReport report(fd);
    report.restart_peak();
    work(report);
    const double high = proc_status_bytes("VmHWM");
    send(fd, Record::kPeak,
         high >= 0 && report.base_bytes() >= 0 ? high - report.base_bytes() : -1);
  } catch (const std::exception& e) {
    send(fd, Record::kFailed, 0, std::string("the run threw: ") + e.what());
  } catch (...) {
    send(fd, Record::kFailed, 0, "the run threw");
  }
  close(fd);
  _exit(0);
}

}  // namespace

double proc_status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) {
      return std::strtod(line.c_str() + prefix.size(), nullptr) * 1024.0;  // kB
    }
  }
  return -1;
}

ChildReport::ChildReport(int fd) : fd_(fd) {}

void ChildReport::time_ms(double ms) { send(fd_, Record::kTime, ms); }

void ChildReport::restart_peak() {
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
  }
  base_bytes_ = proc_status_bytes("VmRSS");
}

ChildResult run_in_child(const std::function<void(ChildReport&)>& work,
                         const std::function<void(double ms)>& on_time) {
  ChildResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    result.error = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child_main(fds[1], work);
  }
  close(fds[1]);
  if (pid < 0) {
    result.error = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    return result;
  }
  bool peak_sent = false;
  Record r{};
  while (read_all(fds[0], &r, sizeof r)) {
    if (r.kind == Record::kTime) {
      result.times_ms.push_back(r.value);
      if (on_time) on_time(r.value);
    } else if (r.kind == Record::kPeak) {
      result.peak_growth = r.value;
      peak_sent = true;
    } else {
      std::string text(static_cast<std::size_t>(r.length > 0 ? r.length : 0), '\0');
      result.error = read_all(fds[0], text.data(), text.size()) ? text : "the run threw";
    }
  }
  close(fds[0]);
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  const bool exited_zero = waited == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  result.ok = result.error.empty() && peak_sent && exited_zero;
  if (!result.ok && result.error.empty()) result.error = "the child process failed";
  return result;
}

}  // namespace posbias::bench
