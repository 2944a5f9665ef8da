// Reading and writing tensors in the safetensors format (the format of
// Hugging Face's `safetensors` library, which PyTorch users save state dicts
// with): an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (plus an
// optional "__metadata__" object of strings), then the raw little-endian data;
// offsets count from the start of the data.
//
// The reader checks everything before trusting it (the rules of the reference
// Rust implementation) and throws std::invalid_argument, with a message that
// starts "safetensors <file or what>: " and names the tensor and what was
// expected, for: a file shorter than 8 bytes or than its header claims
// (truncated), a header length over 100,000,000 bytes, a header that is not
// JSON or not exactly the layout above (every entry an object with exactly the
// keys dtype, shape and data_offsets; no duplicate keys; extents integers
// >= 0; metadata values strings), an unknown or unsupported dtype, offsets
// that do not hold exactly dtype size x element count bytes, offsets past the
// data, tensors that overlap, gaps between tensors, and bytes after the last
// tensor (oversized). Values are not checked; modules' load_state_dict()
// rejects non-finite parameters. I/O failures (missing file, unreadable)
// throw std::runtime_error with the path and the system's reason.
//
// Example:
//
//   posbias::TensorMap weights = posbias::load_safetensors("model.safetensors");
//   const posbias::Tensor& w = weights.at("mlp.0.weight");  // e.g. [64, 1]
//   posbias::save_safetensors("copy.safetensors", weights, {{"format", "pt"}});
#ifndef POSBIAS_SAFETENSORS_H_
#define POSBIAS_SAFETENSORS_H_

#include <map>
#include <string>

#include "posbias/tensor.h"

namespace posbias {

/// Named tensors, in name order (as safetensors files store them).
using TensorMap = std::map<std::string, Tensor>;

/// Reads every tensor of a safetensors file. F32, BF16 and F16 tensors load
/// with their dtype; F64 tensors are converted to float32 (rounded once; a
/// finite F64 value beyond float32's range throws std::invalid_argument naming
/// the tensor, the element and the value, e.g. "1e+300 overflows float32",
/// instead of becoming inf; inf and NaN load as they are). Other
/// dtypes (I64, U8, ...) are rejected with their name. Every tensor is a new
/// contiguous allocation; the header is validated before any data is read, and
/// the data is read straight into the tensors (no copy of the whole file).
/// The metadata is validated but not returned.
TensorMap load_safetensors(const std::string& path);

/// Parses safetensors bytes already in memory (`what` names them in errors).
TensorMap parse_safetensors(const std::string& bytes, const std::string& what = "buffer");

/// Writes tensors (any layout; stored contiguous) to `path`, with optional
/// string metadata, as dtypes F32, BF16 and F16. Layout (the reference
/// writer's): compact JSON with "__metadata__" first (omitted when empty), then
/// the tensors in name order with keys dtype, shape, data_offsets; padded with
/// spaces to a multiple of 8 bytes; then the data in the same order.
/// Writes to a temporary file in the same directory, fsyncs it and renames it
/// over `path`, so a failed write never leaves a half-written or temporary
/// file, and an existing file is replaced whole or not at all. Throws
/// std::invalid_argument (before creating anything) for a tensor named
/// "__metadata__" or a name or metadata string that is not valid UTF-8, and
/// std::runtime_error with the path and the system's reason when writing
/// fails.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The bytes save_safetensors would write (same checks).
std::string serialize_safetensors(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace posbias

#endif  // POSBIAS_SAFETENSORS_H_
