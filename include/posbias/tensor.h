// posbias::Tensor: a small, reference-counted, strided n-d array.
//
// It exists so that results can be handed out without copies: a bias served
// from a module's cache is a *view* (shape, strides, offset) into the cached
// storage, and the storage lives as long as any Tensor refers to it. Replacing
// a module's cache therefore never invalidates a result a caller holds.
//
// Copying a Tensor copies the handle, not the data (like torch::Tensor).
// Writing through data pointers of a view writes into the shared storage,
// including a module's cache; treat results from a module as read-only or
// take `contiguous_copy()` first.
//
// Thread safety: distinct Tensor handles may be used from distinct threads
// even when they share storage (the reference count is atomic); concurrent
// writes to the same elements are the caller's business.
#ifndef POSBIAS_TENSOR_H_
#define POSBIAS_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "posbias/dtype.h"

namespace posbias {

/// A reference-counted, strided n-d array (see the file comment).
class Tensor {
 public:
  /// An empty, 0-d, zero-element float32 tensor that owns nothing.
  Tensor();

  /// A new contiguous row-major tensor of the given shape and dtype, its
  /// storage aligned to 64 bytes and left uninitialised. Throws
  /// std::invalid_argument for a negative extent and std::length_error when
  /// the byte count overflows or exceeds the machine's physical memory (the
  /// message gives the shape and the bytes), before allocating.
  static Tensor empty(const std::vector<std::int64_t>& shape, DType dtype);

  /// Like empty(), with every element set to `value` (rounded once to dtype).
  static Tensor full(const std::vector<std::int64_t>& shape, float value,
                     DType dtype = DType::kFloat32);

  /// A contiguous float32 tensor holding a copy of `values`; `shape` must
  /// have values.size() elements (std::invalid_argument otherwise).
  static Tensor from_vector(const std::vector<std::int64_t>& shape,
                            const std::vector<float>& values);

  /// A view of memory the caller owns (no copy), e.g. a torch::Tensor's
  /// data: `shape` and `strides` (in elements, >= 0, one per dimension) of
  /// `dtype` elements starting at `data`. `owner` is kept alive by every
  /// handle to the view (pass the owning object, or nothing when the memory
  /// outlives every handle). std::invalid_argument for a negative extent or
  /// stride or mismatched ranks; a null `data` only with zero elements.
  static Tensor from_blob(void* data, const std::vector<std::int64_t>& shape,
                          const std::vector<std::int64_t>& strides, DType dtype,
                          std::shared_ptr<void> owner = {});

  /// Element type, number of dimensions, and extents.
  DType dtype() const { return dtype_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  /// Strides in elements (not bytes), one per dimension.
  const std::vector<std::int64_t>& strides() const { return strides_; }
  /// Extent of dimension `d` (negative `d` counts from the end).
  std::int64_t size(std::int64_t d) const;
  /// Number of elements (the product of the extents).
  std::int64_t numel() const;
  /// True when the elements are laid out row-major without gaps.
  bool is_contiguous() const;

  /// Pointer to the first element (offset applied). T must match dtype():
  /// float for kFloat32, bfloat16, float16, double for kFloat64, int32_t for
  /// kInt32, uint8_t for kUInt8 and kBool (std::invalid_argument otherwise).
  template <typename T>
  const T* data() const;
  template <typename T>
  T* mutable_data();
  /// Untyped pointer to the first element.
  const void* raw_data() const;
  void* raw_mutable_data();

  /// Element at a full index, converted to float32.
  float at(const std::vector<std::int64_t>& index) const;

  /// A view of [start, end) along dimension `d`; shares storage, O(1).
  Tensor slice(std::int64_t d, std::int64_t start, std::int64_t end) const;

  /// A view with dimensions `d0` and `d1` swapped (extents and strides;
  /// negative dimensions count from the end); shares storage, O(1). E.g. a
  /// `[b, len, h, d]` buffer as the `[b, h, len, d]` view that
  /// attention_forward() takes: `x.transpose(1, 2)`.
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;

  /// A contiguous tensor with the same values, always a fresh allocation.
  Tensor contiguous_copy() const;

  /// A contiguous copy converted to `dtype` (float32 -> 16-bit rounds once to
  /// nearest even; float64 -> 16-bit rounds through float32, as PyTorch;
  /// to an integer dtype: nearest integer, clamped to its range, NaN as 0;
  /// to kBool: value != 0).
  Tensor to(DType dtype) const;

  /// All elements, row-major, converted to float32.
  std::vector<float> to_float_vector() const;

  /// True when both handles refer to the same storage block.
  bool shares_storage_with(const Tensor& other) const;

  /// Number of handles sharing this tensor's storage (0 for an empty Tensor).
  long storage_use_count() const { return storage_.use_count(); }

 private:
  std::shared_ptr<void> storage_;
  std::int64_t offset_ = 0;  // in elements
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  DType dtype_ = DType::kFloat32;
};

/// Returns to the system the freed storage that posbias keeps for reuse,
/// and returns its size in bytes. Storage of 4 MiB and up (mapped in 2 MiB
/// huge pages) is not unmapped when its last Tensor goes: blocks of up to
/// 64 MiB, 128 MiB in all, are kept and handed to the next Tensor::empty of
/// the same rounded size (as malloc keeps freed heap memory), so a call
/// that allocates its output each time does not fault it in again. Call
/// this to give that memory back, e.g. after a model is unloaded.
/// Thread-safe.
std::size_t release_cached_storage();

/// Formats a tensor the way PyTorch's `print(tensor)` does: nested brackets,
/// a common number format (`0.`, `-0.2500` or scientific) chosen from the
/// values, and, past 1000 elements, only the first and last 3 entries of each
/// dimension with `...`. A non-float32 dtype is named at the end as torch
/// names it, e.g. `tensor([1., 2.], dtype=torch.bfloat16)`. An empty tensor
/// is `tensor([])` (1-D) or `tensor([], size=(8, 0, 5))`.
std::string format_tensor(const Tensor& t);

/// Shortest decimal text that reads back as exactly the same float32
/// ("0.1", "-0.25", "1e-07", "inf", "nan").
std::string format_float_roundtrip(float value);

/// `{"shape": [..], "data": [..]}`: row-major, every value as
/// format_float_roundtrip (non-finite values as the strings "inf", "-inf",
/// "nan", since JSON has no literal for them).
std::string to_json(const Tensor& t);

/// The same text as to_json, written to `out` as it is produced (no string of
/// the whole tensor is built: use it for large tensors).
void write_json(std::ostream& out, const Tensor& t);

}  // namespace posbias

#endif  // POSBIAS_TENSOR_H_
