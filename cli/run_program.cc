#include "run_program.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>

namespace posbias::cli {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// One read(2), retried when a signal interrupts it: the bytes read, 0 at the
// end, -1 on an error.
ssize_t read_some(int fd, char* buf, std::size_t size) {
  for (;;) {
    const ssize_t n = read(fd, buf, size);
    if (n >= 0 || errno != EINTR) return n;
  }
}

}  // namespace

std::string own_directory() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  const std::string exe(path, static_cast<std::size_t>(n));
  const std::size_t slash = exe.find_last_of('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash == 0 ? 1 : slash);
}

std::string find_program(const std::string& name, const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    if (dir.empty()) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0) {
      return path;
    }
  }
  return "";
}

int run_program(const std::string& path, const std::vector<std::string>& args, std::ostream& out) {
  std::vector<std::string> words = {path};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);

  // output: the child's stdout; exec_error: closed by a successful exec
  // (O_CLOEXEC), or carrying the errno of a failed one.
  int output[2];
  int exec_error[2];
  if (pipe(output) != 0) throw std::runtime_error(errno_text("could not run " + path + ": pipe"));
  if (pipe2(exec_error, O_CLOEXEC) != 0) {
    close(output[0]);
    close(output[1]);
    throw std::runtime_error(errno_text("could not run " + path + ": pipe"));
  }
  out.flush();
  std::cerr.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    close(output[0]);
    close(exec_error[0]);
    if (dup2(output[1], STDOUT_FILENO) < 0) _exit(127);
    close(output[1]);
    execv(argv[0], argv.data());
    const int error = errno;
    (void)!write(exec_error[1], &error, sizeof error);
    _exit(127);
  }
  close(output[1]);
  close(exec_error[1]);
  if (pid < 0) {
    close(output[0]);
    close(exec_error[0]);
    throw std::runtime_error(errno_text("could not run " + path + ": fork"));
  }
  int child_errno = 0;
  const bool exec_failed =
      read_some(exec_error[0], reinterpret_cast<char*>(&child_errno), sizeof child_errno) ==
      static_cast<ssize_t>(sizeof child_errno);
  close(exec_error[0]);
  char buf[4096];
  for (ssize_t n; (n = read_some(output[0], buf, sizeof buf)) > 0;) {
    out.write(buf, n);
    out.flush();
  }
  close(output[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(errno_text("waiting for " + path));
  }
  if (exec_failed) {
    throw std::runtime_error("could not run " + path + ": " + std::strerror(child_errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace posbias::cli
