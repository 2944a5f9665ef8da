#include "posbias/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "checks.h"
#include "dtype_dispatch.h"

namespace posbias {
namespace detail {

double load_element(const void* base, DType dtype, std::int64_t index) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[index];
    case DType::kBFloat16:
      return to_float(static_cast<const bfloat16*>(base)[index]);
    case DType::kFloat16:
      return to_float(static_cast<const float16*>(base)[index]);
    case DType::kFloat64:
      return static_cast<const double*>(base)[index];
    case DType::kInt32:
      return static_cast<const std::int32_t*>(base)[index];
    case DType::kUInt8:
    case DType::kBool:
      return static_cast<const std::uint8_t*>(base)[index];
  }
  return 0.0;
}

// An integer dtype stores the value rounded to the nearest integer and
// clamped to its range (NaN as 0); bool stores v != 0.
void store_element(void* base, DType dtype, std::int64_t index, double v) {
  const auto integral = [v](double lo, double hi) {
    return std::isnan(v) ? 0.0 : std::clamp(std::nearbyint(v), lo, hi);
  };
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[index] = static_cast<float>(v);
      break;
    case DType::kBFloat16:
      static_cast<bfloat16*>(base)[index] = to_bfloat16(static_cast<float>(v));
      break;
    case DType::kFloat16:
      static_cast<float16*>(base)[index] = to_float16(static_cast<float>(v));
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[index] = v;
      break;
    case DType::kInt32:
      static_cast<std::int32_t*>(base)[index] =
          static_cast<std::int32_t>(integral(-2147483648.0, 2147483647.0));
      break;
    case DType::kUInt8:
      static_cast<std::uint8_t*>(base)[index] = static_cast<std::uint8_t>(integral(0.0, 255.0));
      break;
    case DType::kBool:
      static_cast<std::uint8_t*>(base)[index] = v != 0.0 ? 1 : 0;
      break;
  }
}

}  // namespace detail

namespace {

using detail::load_element;
using detail::store_element;

std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& shape) {
  // A tensor with a zero extent may have other extents whose product
  // overflows int64 (Tensor::empty({0, 1 << 62, 1 << 30}) is legal): its
  // strides are never used to address anything, so they saturate instead of
  // overflowing (found by UBSan, tests/unit/tensor_limits_test.cc).
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) {
    if (__builtin_mul_overflow(strides[d], std::max<std::int64_t>(shape[d], 1), &strides[d - 1])) {
      strides[d - 1] = std::numeric_limits<std::int64_t>::max();
    }
  }
  return strides;
}

float load_as_float(const void* base, DType dtype, std::int64_t index) {
  return static_cast<float>(load_element(base, dtype, index));
}

void store_from_float(void* base, DType dtype, std::int64_t index, float v) {
  store_element(base, dtype, index, v);
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  if constexpr (std::is_same_v<T, bfloat16>) return DType::kBFloat16;
  if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::kInt32;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::kUInt8;
  return DType::kFloat16;
}

// Calls fn(storage_index) for every element in row-major order.
template <typename Fn>
void for_each_index(const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>& strides, std::int64_t offset, Fn&& fn) {
  for (std::int64_t e : shape) {
    if (e == 0) return;
  }
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t pos = offset;
  while (true) {
    fn(pos);
    std::size_t d = nd;
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) {
        pos += strides[d];
        break;
      }
      pos -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 0) return;
  }
}

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Freed large blocks kept for reuse, oldest first: a call that allocates
// its output (an attention's [b, h, i, d], a bias) and a caller that drops
// it before the next call would otherwise map, fault in (zeroing every huge
// page), and unmap (a TLB shootdown on every core) the same bytes each
// call: 3-4% of a prefill's samples on a Zen 5 VM (clear_page_erms and the
// hypervisor's interrupt path). malloc keeps freed heap memory the same way.
// Blocks up to kCachedBlockMax are kept, kCachedTotalMax in all; the oldest
// go back to the system first. Leaked on purpose: a tensor freed during
// static destruction must still find it.
constexpr std::size_t kCachedBlockMax = std::size_t{64} << 20;
constexpr std::size_t kCachedTotalMax = std::size_t{128} << 20;

struct StorageCache {
  std::mutex mu;
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::size_t bytes = 0;
};

StorageCache& storage_cache() {
  static auto* cache = new StorageCache;  // NOLINT(cppcoreguidelines-owning-memory)
  return *cache;
}

// A kept block of exactly len bytes (the newest), or null.
void* take_cached(std::size_t len) {
  StorageCache& c = storage_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  for (std::size_t x = c.blocks.size(); x-- > 0;) {
    if (c.blocks[x].second == len) {
      void* p = c.blocks[x].first;
      c.blocks.erase(c.blocks.begin() + static_cast<std::ptrdiff_t>(x));
      c.bytes -= len;
      return p;
    }
  }
  return nullptr;
}

void free_large(void* p, std::size_t len) {
  if (len > kCachedBlockMax) {
    munmap(p, len);
    return;
  }
  StorageCache& c = storage_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  c.blocks.emplace_back(p, len);
  c.bytes += len;
  while (c.bytes > kCachedTotalMax) {
    munmap(c.blocks.front().first, c.blocks.front().second);
    c.bytes -= c.blocks.front().second;
    c.blocks.erase(c.blocks.begin());
  }
}

// Storage for `bytes` bytes, 64-byte aligned. Large blocks come from the
// freed blocks kept (of the same length) or straight from mmap, aligned to
// 2 MiB and advised as transparent huge pages: a freshly
// allocated bias is written once, and with 4 KiB pages the page faults (one
// per 4 KiB, expensive under virtualisation) cost far more than the writes.
std::shared_ptr<void> allocate_storage(std::size_t bytes, const std::vector<std::int64_t>& shape) {
  const auto fail = [&] {
    return detail::allocation_error(bytes, "a tensor of shape " + detail::shape_string(shape));
  };
  if (bytes >= 2 * kHugePage) {
    const std::size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const auto release = [len](void* q) { free_large(q, len); };
    if (void* kept = take_cached(len)) return std::shared_ptr<void>(kept, release);
    void* raw =
        mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw fail();
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) munmap(raw, aligned - start);
    const std::uintptr_t tail = start + len + kHugePage - (aligned + len);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + len), tail);
    void* p = reinterpret_cast<void*>(aligned);
    madvise(p, len, MADV_HUGEPAGE);  // advisory: ignore failure
    return std::shared_ptr<void>(p, release);
  }
  // Round up to whole cache lines so vector kernels may store full vectors.
  const std::size_t rounded = std::max<std::size_t>((bytes + 63) / 64 * 64, 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw fail();
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

std::size_t release_cached_storage() {
  StorageCache& c = storage_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  const std::size_t released = c.bytes;
  for (const auto& [p, len] : c.blocks) munmap(p, len);
  c.blocks.clear();
  c.bytes = 0;
  return released;
}

Tensor::Tensor() : shape_{0}, strides_{1} {}

Tensor Tensor::empty(const std::vector<std::int64_t>& shape, DType dtype) {
  const std::int64_t n = detail::checked_numel(shape, dtype);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = row_major_strides(shape);
  t.storage_ = allocate_storage(static_cast<std::size_t>(n) * dtype_size(dtype), shape);
  return t;
}

Tensor Tensor::from_blob(void* data, const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& strides, DType dtype,
                         std::shared_ptr<void> owner) {
  if (shape.size() != strides.size()) {
    throw std::invalid_argument("Tensor::from_blob: " + std::to_string(shape.size()) +
                                " extents but " + std::to_string(strides.size()) + " strides");
  }
  std::int64_t n = 1;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0 || strides[k] < 0) {
      throw std::invalid_argument("Tensor::from_blob: negative extent or stride in dimension " +
                                  std::to_string(k));
    }
    // Saturates: a view may describe more elements than int64 counts (a
    // stride-0 broadcast of a huge extent); n is only compared with 0 and
    // printed.
    if (__builtin_mul_overflow(n, shape[k], &n)) n = std::numeric_limits<std::int64_t>::max();
  }
  if (data == nullptr && n != 0) {
    throw std::invalid_argument("Tensor::from_blob: null data for " + std::to_string(n) +
                                " elements");
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = strides;
  t.storage_ = std::shared_ptr<void>(std::move(owner), data);
  return t;
}

Tensor Tensor::full(const std::vector<std::int64_t>& shape, float value, DType dtype) {
  Tensor t = empty(shape, dtype);
  const std::int64_t n = t.numel();
  for (std::int64_t k = 0; k < n; ++k) store_from_float(t.raw_mutable_data(), dtype, k, value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<std::int64_t>& shape,
                           const std::vector<float>& values) {
  Tensor t = empty(shape, DType::kFloat32);
  if (t.numel() != static_cast<std::int64_t>(values.size())) {
    throw std::invalid_argument("from_vector: shape " + detail::shape_string(shape) + " holds " +
                                std::to_string(t.numel()) + " elements, got " +
                                std::to_string(values.size()));
  }
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t nd = dim();
  const std::int64_t k = d < 0 ? d + nd : d;
  if (k < 0 || k >= nd) {
    throw std::invalid_argument("dimension " + std::to_string(d) + " out of range for a " +
                                std::to_string(nd) + "-d tensor");
  }
  return shape_[static_cast<std::size_t>(k)];
}

std::int64_t Tensor::numel() const {
  // Zero first: the other extents of an empty tensor may overflow together.
  for (std::int64_t e : shape_) {
    if (e == 0) return 0;
  }
  std::int64_t n = 1;
  for (std::int64_t e : shape_) n *= e;
  return n;
}

bool Tensor::is_contiguous() const { return strides_ == row_major_strides(shape_) || numel() == 0; }

template <typename T>
const T* Tensor::data() const {
  // uint8_t reads kBool too (one byte, 0 or 1).
  const bool byte_bool = std::is_same_v<T, std::uint8_t> && dtype_ == DType::kBool;
  if (dtype_of<T>() != dtype_ && !byte_bool) {
    throw std::invalid_argument("Tensor::data<" + dtype_name(dtype_of<T>()) + ">() on a " +
                                dtype_name(dtype_) + " tensor");
  }
  return static_cast<const T*>(storage_.get()) + offset_;
}

template <typename T>
T* Tensor::mutable_data() {
  return const_cast<T*>(static_cast<const Tensor*>(this)->data<T>());
}

template const float* Tensor::data<float>() const;
template const bfloat16* Tensor::data<bfloat16>() const;
template const float16* Tensor::data<float16>() const;
template float* Tensor::mutable_data<float>();
template bfloat16* Tensor::mutable_data<bfloat16>();
template float16* Tensor::mutable_data<float16>();
template const double* Tensor::data<double>() const;
template const std::int32_t* Tensor::data<std::int32_t>() const;
template const std::uint8_t* Tensor::data<std::uint8_t>() const;
template double* Tensor::mutable_data<double>();
template std::int32_t* Tensor::mutable_data<std::int32_t>();
template std::uint8_t* Tensor::mutable_data<std::uint8_t>();

const void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<const char*>(storage_.get()) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

void* Tensor::raw_mutable_data() { return const_cast<void*>(raw_data()); }

float Tensor::at(const std::vector<std::int64_t>& index) const {
  if (index.size() != shape_.size()) {
    throw std::invalid_argument("Tensor::at: index " + detail::shape_string(index) +
                                " for a tensor of shape " + detail::shape_string(shape_));
  }
  std::int64_t pos = offset_;
  for (std::size_t d = 0; d < index.size(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d]) {
      throw std::invalid_argument("Tensor::at: index " + detail::shape_string(index) +
                                  " out of range for shape " + detail::shape_string(shape_));
    }
    pos += index[d] * strides_[d];
  }
  return load_as_float(storage_.get(), dtype_, pos);
}

Tensor Tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end) const {
  const std::int64_t extent = size(d);
  const std::size_t k = static_cast<std::size_t>(d < 0 ? d + dim() : d);
  if (start < 0 || end < start || end > extent) {
    throw std::invalid_argument("Tensor::slice: [" + std::to_string(start) + ", " +
                                std::to_string(end) + ") out of range for extent " +
                                std::to_string(extent));
  }
  Tensor t = *this;
  // An empty tensor addresses nothing (and its strides may be saturated).
  if (numel() != 0) t.offset_ += start * strides_[k];
  t.shape_[k] = end - start;
  return t;
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  const std::int64_t n = dim();
  if (d0 < -n || d0 >= n || d1 < -n || d1 >= n) {
    throw std::invalid_argument("Tensor::transpose: dimensions (" + std::to_string(d0) + ", " +
                                std::to_string(d1) + ") out of range for " + std::to_string(n) +
                                "-d tensor");
  }
  const auto a = static_cast<std::size_t>(d0 < 0 ? d0 + n : d0);
  const auto b = static_cast<std::size_t>(d1 < 0 ? d1 + n : d1);
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::contiguous_copy() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  Tensor out = empty(shape_, dtype);
  std::int64_t k = 0;
  void* dst = out.raw_mutable_data();
  for_each_index(shape_, strides_, offset_, [&](std::int64_t pos) {
    store_element(dst, dtype, k++, load_element(storage_.get(), dtype_, pos));
  });
  // 16-bit -> 16-bit of the same type copies bits exactly: the float32
  // round trip of a bfloat16 or float16 value is exact.
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  std::vector<float> values;
  values.reserve(static_cast<std::size_t>(numel()));
  for_each_index(shape_, strides_, offset_, [&](std::int64_t pos) {
    values.push_back(load_as_float(storage_.get(), dtype_, pos));
  });
  return values;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return storage_ && storage_ == other.storage_;
}

// ---------------------------------------------------------------- printing

std::string format_float_roundtrip(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, res.ptr);
}

void write_json(std::ostream& out, const Tensor& t) {
  out << "{\"shape\": [";
  for (std::size_t d = 0; d < t.shape().size(); ++d) {
    if (d) out << ", ";
    out << t.shape()[d];
  }
  out << "], \"data\": [";
  // Row by row through a small buffer: no copy of the whole tensor.
  const std::int64_t n = t.numel();
  const std::int64_t row = t.dim() > 0 ? std::max<std::int64_t>(t.shape().back(), 1) : 1;
  std::string buf;
  std::int64_t k = 0;
  const void* base = t.raw_data();
  for_each_index(t.shape(), t.strides(), 0, [&](std::int64_t pos) {
    const float v = load_as_float(base, t.dtype(), pos);
    if (k++ > 0) buf += ", ";
    if (std::isfinite(v)) {
      buf += format_float_roundtrip(v);
    } else {
      buf += "\"" + format_float_roundtrip(v) + "\"";
    }
    if (k % row == 0 || k == n) {
      out << buf;
      buf.clear();
    }
  });
  out << "]}";
}

std::string to_json(const Tensor& t) {
  std::ostringstream s;
  write_json(s, t);
  return s.str();
}

namespace {

// PyTorch's print options: precision 4, threshold 1000, edgeitems 3,
// linewidth 80 (torch/_tensor_str.py).
constexpr int kPrecision = 4;
constexpr std::int64_t kThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;
constexpr int kLineWidth = 80;

class Formatter {
 public:
  explicit Formatter(const std::vector<float>& shown) {
    std::vector<float> nonzero_finite;
    for (float v : shown) {
      if (std::isfinite(v) && v != 0.0f) nonzero_finite.push_back(std::fabs(v));
    }
    int_mode_ = true;
    for (float v : nonzero_finite) {
      if (v != std::ceil(v)) {
        int_mode_ = false;
        break;
      }
    }
    if (!nonzero_finite.empty()) {
      const double mx = *std::max_element(nonzero_finite.begin(), nonzero_finite.end());
      const double mn = *std::min_element(nonzero_finite.begin(), nonzero_finite.end());
      if (int_mode_) {
        sci_mode_ = mx / mn > 1000.0 || mx > 1.0e8;
      } else {
        sci_mode_ = mx / mn > 1000.0 || mx > 1.0e8 || mn < 1.0e-4;
      }
    }
    for (float v : shown) width_ = std::max(width_, format_raw(v).size());
  }

  std::string format(float v) const {
    std::string s = format_raw(v);
    return std::string(width_ - s.size(), ' ') + s;
  }
  std::size_t width() const { return width_; }

 private:
  std::string format_raw(float v) const {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    if (sci_mode_) {
      std::snprintf(buf, sizeof buf, "%.*e", kPrecision, static_cast<double>(v));
    } else if (int_mode_) {
      std::snprintf(buf, sizeof buf, "%.0f.", static_cast<double>(v));
    } else {
      std::snprintf(buf, sizeof buf, "%.*f", kPrecision, static_cast<double>(v));
    }
    return buf;
  }

  bool int_mode_ = true;
  bool sci_mode_ = false;
  std::size_t width_ = 1;
};

// Indices of dimension `extent` that are shown: all, or the first and last
// kEdgeItems with a gap marker (-1) between.
std::vector<std::int64_t> shown_indices(std::int64_t extent, bool summarize) {
  std::vector<std::int64_t> idx;
  if (summarize && extent > 2 * kEdgeItems) {
    for (std::int64_t k = 0; k < kEdgeItems; ++k) idx.push_back(k);
    idx.push_back(-1);
    for (std::int64_t k = extent - kEdgeItems; k < extent; ++k) idx.push_back(k);
  } else {
    for (std::int64_t k = 0; k < extent; ++k) idx.push_back(k);
  }
  return idx;
}

void collect_shown(const Tensor& t, std::size_t d, std::vector<std::int64_t>& index, bool summarize,
                   std::vector<float>& out) {
  if (d == t.shape().size()) {
    out.push_back(t.at(index));
    return;
  }
  for (std::int64_t k : shown_indices(t.shape()[d], summarize)) {
    if (k < 0) continue;
    index[d] = k;
    collect_shown(t, d + 1, index, summarize, out);
  }
}

std::string format_rec(const Tensor& t, std::size_t d, std::vector<std::int64_t>& index,
                       bool summarize, const Formatter& fmt, int indent) {
  const std::size_t nd = t.shape().size();
  if (d + 1 == nd) {
    std::vector<std::string> items;
    for (std::int64_t k : shown_indices(t.shape()[d], summarize)) {
      if (k < 0) {
        items.push_back(" ...");
        continue;
      }
      index[d] = k;
      items.push_back(fmt.format(t.at(index)));
    }
    const std::size_t element_length = fmt.width() + 2;
    const std::size_t per_line = std::max<std::size_t>(
        1, static_cast<std::size_t>((kLineWidth - indent) / static_cast<int>(element_length)));
    std::string s = "[";
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (k > 0) {
        s += (k % per_line == 0) ? ",\n" + std::string(static_cast<std::size_t>(indent) + 1, ' ')
                                 : ", ";
      }
      s += items[k];
    }
    return s + "]";
  }
  std::string sep =
      "," + std::string(nd - d - 1, '\n') + std::string(static_cast<std::size_t>(indent) + 1, ' ');
  std::string s = "[";
  bool first = true;
  for (std::int64_t k : shown_indices(t.shape()[d], summarize)) {
    if (!first) s += sep;
    first = false;
    if (k < 0) {
      s += "...";
      continue;
    }
    index[d] = k;
    s += format_rec(t, d + 1, index, summarize, fmt, indent + 1);
  }
  return s + "]";
}

}  // namespace

std::string format_tensor(const Tensor& t) {
  // As torch names dtypes: "torch.bfloat16".
  std::string suffix;
  if (t.dtype() != DType::kFloat32) suffix = ", dtype=torch." + dtype_name(t.dtype());
  if (t.numel() == 0) {
    // torch 1.13: "tensor([])" for an empty 1-D tensor, the size otherwise.
    if (t.shape().size() == 1) return "tensor([]" + suffix + ")";
    std::string size = "(";
    for (std::size_t d = 0; d < t.shape().size(); ++d) {
      if (d) size += ", ";
      size += std::to_string(t.shape()[d]);
    }
    size += ")";
    return "tensor([], size=" + size + suffix + ")";
  }
  const bool summarize = t.numel() > kThreshold;
  std::vector<std::int64_t> index(t.shape().size(), 0);
  std::vector<float> shown;
  collect_shown(t, 0, index, summarize, shown);
  const Formatter fmt(shown);
  if (t.shape().empty()) return "tensor(" + fmt.format(t.at({})) + suffix + ")";
  return "tensor(" + format_rec(t, 0, index, summarize, fmt, 7) + suffix + ")";
}

}  // namespace posbias
