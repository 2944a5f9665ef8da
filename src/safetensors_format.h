// Internal: the safetensors format itself, apart from where the bytes come
// from or go to (see posbias/safetensors.h for the format and its rules).
//
// safetensors_format.cc knows what the bytes mean: the 8-byte length prefix,
// the header's JSON layout and every rule a valid header obeys, how an entry
// becomes a tensor (byte order, F64 -> float32) and how tensors become a
// header and data. safetensors.cc moves the bytes: a buffer in memory, a
// regular file read tensor by tensor, a pipe or device read only as far as
// the header claims, and the atomic write of a new file. Not installed.
#ifndef POSBIAS_SRC_SAFETENSORS_FORMAT_H_
#define POSBIAS_SRC_SAFETENSORS_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "posbias/safetensors.h"

namespace posbias::detail {

// The reference implementation's cap on the header (MAX_HEADER_SIZE): a
// corrupted length must not make us allocate gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// Element types as safetensors names them, with what they load as.
struct StoredType {
  const char* name;
  std::size_t size;  // bytes per element in the file
  DType dtype;       // what it loads as
};

// One tensor as the header describes it, after validation.
struct Entry {
  std::string name;
  const StoredType* type = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // relative to the data buffer
  std::uint64_t end = 0;
};

// One tensor to write: its name, the tensor and its byte size.
struct Planned {
  const std::string* name;
  const Tensor* tensor;
  std::uint64_t bytes;
};

// Throws std::invalid_argument for a file of `total` bytes shorter than the
// 8-byte length prefix.
void check_total_size(std::uint64_t total, const std::string& what);

// Checks the 8-byte prefix against the total size (and the header cap);
// returns the header length.
std::uint64_t check_prefix(const unsigned char* first8, std::uint64_t total,
                           const std::string& what);

// The tensors of a header, sorted by position in a data buffer of
// `buffer_size` bytes, after checking every rule of the layout and that they
// cover the buffer exactly.
std::vector<Entry> parse_header(std::string_view header, std::uint64_t buffer_size,
                                const std::string& what);

// The largest end offset a header names (0 when it is not an object of
// entries with data_offsets): how many data bytes a stream should hold. Only
// a bound for reading; parse_header() validates the header afterwards.
std::uint64_t claimed_data_bytes(std::string_view header);

// Copies `bytes` bytes of the data buffer starting at `offset` into dst.
using ReadData = std::function<void(void* dst, std::uint64_t offset, std::uint64_t bytes)>;

// Builds the tensor of `e` from the data `read` delivers: in host byte
// order, F64 rounded once to float32 (a finite value past float32's range
// throws std::invalid_argument naming the element).
Tensor load_entry(const Entry& e, const std::string& what, const ReadData& read);

// The padded header (without the 8-byte length) and the tensors in order.
// Throws std::invalid_argument for a tensor named "__metadata__" or a name or
// metadata string that is not valid UTF-8.
std::string build_header(const TensorMap& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::vector<Planned>* plan);

// The 8 little-endian bytes of v at p.
void write_u64_le(std::uint64_t v, char* p);

// Calls emit(data, bytes) with each planned tensor's little-endian row-major
// bytes, in order.
void emit_data(const std::vector<Planned>& plan,
               const std::function<void(const void* data, std::size_t bytes)>& emit);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_SAFETENSORS_FORMAT_H_
