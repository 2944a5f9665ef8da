// safetensors reading and writing (see posbias/safetensors.h): where the
// bytes come from and go to. The format itself (the header's rules, entries
// to tensors and back) is safetensors_format.cc.
//
// Reading: from a buffer in memory; from a regular file, whose header is
// validated against the file size before each tensor is read straight into
// its storage; from a pipe or device, read only as far as the header claims.
// Writing: to a buffer, or to a temporary file beside the target that is
// fsynced and renamed over it, so that a failed write leaves nothing behind.
#include "posbias/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "checks.h"
#include "safetensors_format.h"

namespace posbias {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, void* dst, std::uint64_t offset, std::uint64_t bytes,
                const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const std::size_t chunk =
        static_cast<std::size_t>(std::min<std::uint64_t>(bytes, std::uint64_t{1} << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read safetensors file " + quoted_name(path) + ": " +
                               errno_text(errno));
    }
    if (got == 0) {
      throw std::runtime_error("cannot read safetensors file " + quoted_name(path) +
                               ": it became shorter while being read");
    }
    p += got;
    offset += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::uint64_t>(got);
  }
}

// Appends up to `want` bytes from a stream (fewer only at its end).
void read_stream(int fd, std::string& bytes, std::uint64_t want, const std::string& path) {
  char buf[1 << 16];
  while (want > 0) {
    const ssize_t got =
        ::read(fd, buf, static_cast<std::size_t>(std::min<std::uint64_t>(want, sizeof buf)));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read safetensors file " + quoted_name(path) + ": " +
                               errno_text(errno));
    }
    if (got == 0) return;
    bytes.append(buf, static_cast<std::size_t>(got));
    want -= static_cast<std::uint64_t>(got);
  }
}

void write_all(int fd, const void* data, std::size_t bytes, const std::string& tmp,
               const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(fd, p, std::min<std::size_t>(bytes, std::size_t{1} << 30));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot write safetensors file " + quoted_name(path) + " (writing " +
                               quoted_name(tmp) + "): " + errno_text(errno));
    }
    p += put;
    bytes -= static_cast<std::size_t>(put);
  }
}

}  // namespace

TensorMap parse_safetensors(const std::string& bytes, const std::string& what) {
  const std::uint64_t total = bytes.size();
  detail::check_total_size(total, what);
  const auto* base = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::uint64_t n = detail::check_prefix(base, total, what);
  const std::vector<detail::Entry> entries = detail::parse_header(
      std::string_view(bytes).substr(8, static_cast<std::size_t>(n)), total - 8 - n, what);
  const char* data = bytes.data() + 8 + n;
  TensorMap out;
  for (const detail::Entry& e : entries) {
    out.emplace(e.name, detail::load_entry(
                            e, what, [&](void* dst, std::uint64_t offset, std::uint64_t len) {
                              std::memcpy(dst, data + offset, static_cast<std::size_t>(len));
                            }));
  }
  return out;
}

TensorMap load_safetensors(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    throw std::runtime_error("cannot open safetensors file " + quoted_name(path) + ": " +
                             errno_text(errno));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw std::runtime_error("cannot stat safetensors file " + quoted_name(path) + ": " +
                             errno_text(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    throw std::runtime_error("cannot read safetensors file " + quoted_name(path) + ": " +
                             errno_text(EISDIR));
  }
  const std::string what = "file " + quoted_name(path);
  if (!S_ISREG(st.st_mode)) {
    // A pipe or device: no size to check against. Read only what the file
    // itself says it holds (the 8-byte length, the header, the data up to the
    // largest end offset the header names, plus one byte to detect trailing
    // data), never "until the end": /dev/zero or an endless pipe must not
    // make us read forever (issue 7). parse_safetensors then checks it all.
    std::string bytes;
    read_stream(f.fd, bytes, 8, path);
    if (bytes.size() < 8) return parse_safetensors(bytes, what);  // truncated
    const std::uint64_t n =
        detail::check_prefix(reinterpret_cast<const unsigned char*>(bytes.data()),
                             std::numeric_limits<std::uint64_t>::max(), what);
    read_stream(f.fd, bytes, n, path);
    if (bytes.size() < 8 + n) return parse_safetensors(bytes, what);  // truncated
    const std::uint64_t data = detail::claimed_data_bytes(std::string_view(bytes).substr(8));
    if (data > detail::physical_memory_bytes()) {
      throw std::length_error("safetensors " + what + ": the header claims " +
                              std::to_string(data) + " bytes of tensor data, more than this " +
                              "machine's " + std::to_string(detail::physical_memory_bytes()) +
                              " bytes of memory");
    }
    read_stream(f.fd, bytes, data + 1, path);
    return parse_safetensors(bytes, what);
  }
  // A regular file: validate the header against the file size, then read each
  // tensor straight into its storage (no second copy of the whole file).
  const auto total = static_cast<std::uint64_t>(st.st_size);
  detail::check_total_size(total, what);
  unsigned char first8[8];
  read_exact(f.fd, first8, 0, 8, path);
  const std::uint64_t n = detail::check_prefix(first8, total, what);
  std::string header(static_cast<std::size_t>(n), '\0');
  read_exact(f.fd, header.data(), 8, n, path);
  const std::vector<detail::Entry> entries = detail::parse_header(header, total - 8 - n, what);
  TensorMap out;
  for (const detail::Entry& e : entries) {
    out.emplace(e.name, detail::load_entry(e, what,
                                           [&](void* dst, std::uint64_t offset, std::uint64_t len) {
                                             read_exact(f.fd, dst, 8 + n + offset, len, path);
                                           }));
  }
  return out;
}

std::string serialize_safetensors(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<detail::Planned> plan;
  const std::string header = detail::build_header(tensors, metadata, &plan);
  std::uint64_t data_bytes = 0;
  for (const detail::Planned& p : plan) data_bytes += p.bytes;
  std::string out;
  out.reserve(static_cast<std::size_t>(8 + header.size() + data_bytes));
  char len[8];
  detail::write_u64_le(header.size(), len);
  out.append(len, 8);
  out += header;
  detail::emit_data(plan, [&](const void* data, std::size_t bytes) {
    out.append(static_cast<const char*>(data), bytes);
  });
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be wrong with the arguments is found here, before a
  // file exists.
  std::vector<detail::Planned> plan;
  const std::string header = detail::build_header(tensors, metadata, &plan);

  // The temporary file sits in the target's directory, so that rename() is
  // atomic (same file system) and replaces an existing file in one step.
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  static std::atomic<unsigned> counter{0};
  std::string tmp;
  Fd f;
  for (int attempt = 0; attempt < 100 && f.fd < 0; ++attempt) {
    tmp = (slash == std::string::npos ? std::string() : dir) + "." + base + ".tmp." +
          std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    // 0666 minus the umask: the permissions any new file would get.
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f.fd < 0 && errno != EEXIST) break;
  }
  if (f.fd < 0) {
    throw std::runtime_error("cannot write safetensors file " + quoted_name(path) +
                             ": cannot create a temporary file in " + quoted_name(dir) + ": " +
                             errno_text(errno));
  }
  // Removes the temporary file unless the rename happened.
  struct Cleanup {
    const std::string& tmp;
    bool done = false;
    ~Cleanup() {
      if (!done) ::unlink(tmp.c_str());
    }
  } cleanup{tmp};

  char len[8];
  detail::write_u64_le(header.size(), len);
  write_all(f.fd, len, 8, tmp, path);
  write_all(f.fd, header.data(), header.size(), tmp, path);
  detail::emit_data(
      plan, [&](const void* data, std::size_t bytes) { write_all(f.fd, data, bytes, tmp, path); });
  if (::fsync(f.fd) != 0) {
    throw std::runtime_error("cannot write safetensors file " + quoted_name(path) + " (fsync of " +
                             quoted_name(tmp) + "): " + errno_text(errno));
  }
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) {
    throw std::runtime_error("cannot write safetensors file " + quoted_name(path) + " (closing " +
                             quoted_name(tmp) + "): " + errno_text(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot write safetensors file " + quoted_name(path) + " (renaming " +
                             quoted_name(tmp) + "): " + errno_text(errno));
  }
  cleanup.done = true;
  // Make the rename itself durable; failing to is not an error of the write.
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) ::fsync(d.fd);
}

}  // namespace posbias
