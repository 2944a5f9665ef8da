// Reading and writing tensors in the safetensors format (the format of
// Hugging Face's `safetensors` library, which PyTorch users save state dicts
// with): an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (plus an
// optional "__metadata__" object of strings), then the raw little-endian data.
//
// The reader checks everything before trusting it and throws
// std::invalid_argument naming the file, the tensor and what was expected for:
// a file shorter than its header claims (truncated), bytes beyond the last
// tensor (oversized), a header that is not JSON or not the layout above, an
// unknown dtype, offsets that do not match dtype x shape, overlapping or
// out-of-range data, and (for float tensors) non-finite values when asked.
// I/O failures (missing file, unreadable) throw std::runtime_error with the
// path and the system's reason.
#ifndef POSBIAS_SAFETENSORS_H_
#define POSBIAS_SAFETENSORS_H_

#include <map>
#include <string>

#include "posbias/tensor.h"

namespace posbias {

/// Named tensors, in name order (as safetensors files store them).
using TensorMap = std::map<std::string, Tensor>;

/// Reads every tensor of a safetensors file. F32, BF16 and F16 tensors load
/// with their dtype; F64 tensors are converted to float32 (rounded once). Other
/// dtypes are rejected with their name.
TensorMap load_safetensors(const std::string& path);

/// Parses safetensors bytes already in memory (`what` names them in errors).
TensorMap parse_safetensors(const std::string& bytes, const std::string& what = "buffer");

/// Writes tensors (any layout; stored contiguous) to `path`, with optional
/// string metadata. Writes to a temporary file in the same directory and
/// renames it, so a failed write never leaves a half-written file.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The bytes save_safetensors would write.
std::string serialize_safetensors(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace posbias

#endif  // POSBIAS_SAFETENSORS_H_
