// Toeplitz table expansion (see toeplitz.h), compiled per instruction set by
// Highway and dispatched at run time. Byte-oriented: the element type only
// fixes the row length in bytes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/toeplitz.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "kernels/toeplitz.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Copies `bytes` bytes from src (any alignment) to dst. With `stream`, the
// destination is written with non-temporal stores from its first vector-
// aligned byte on; the unaligned head and the tail are plain copies.
HWY_INLINE void CopyRow(const std::uint8_t* HWY_RESTRICT src, std::uint8_t* HWY_RESTRICT dst,
                        std::size_t bytes, bool stream) {
  const hn::ScalableTag<std::uint8_t> d;
  const std::size_t n = hn::Lanes(d);
  std::size_t k = 0;
  if (stream) {
    const std::size_t mis = reinterpret_cast<std::uintptr_t>(dst) % n;
    const std::size_t head = mis == 0 ? 0 : n - mis;
    if (head >= bytes) {
      std::memcpy(dst, src, bytes);
      return;
    }
    std::memcpy(dst, src, head);
    k = head;
    // Four vectors per iteration: enough independent loads in flight.
    for (; k + 4 * n <= bytes; k += 4 * n) {
      const auto v0 = hn::LoadU(d, src + k);
      const auto v1 = hn::LoadU(d, src + k + n);
      const auto v2 = hn::LoadU(d, src + k + 2 * n);
      const auto v3 = hn::LoadU(d, src + k + 3 * n);
      hn::Stream(v0, d, dst + k);
      hn::Stream(v1, d, dst + k + n);
      hn::Stream(v2, d, dst + k + 2 * n);
      hn::Stream(v3, d, dst + k + 3 * n);
    }
    for (; k + n <= bytes; k += n) hn::Stream(hn::LoadU(d, src + k), d, dst + k);
  } else {
    for (; k + n <= bytes; k += n) hn::StoreU(hn::LoadU(d, src + k), d, dst + k);
  }
  if (k < bytes) std::memcpy(dst + k, src + k, bytes - k);
}

void ExpandRows(const ToeplitzParams& p, std::int64_t row_begin, std::int64_t row_end,
                bool stream) {
  const auto* table = static_cast<const std::uint8_t*>(p.table);
  auto* out = static_cast<std::uint8_t*>(p.out);
  const std::size_t es = p.element_size;
  const std::size_t row_bytes = static_cast<std::size_t>(p.cols) * es;
  for (std::int64_t flat = row_begin; flat < row_end; ++flat) {
    const std::int64_t h = flat / p.rows;
    const std::int64_t r = flat - h * p.rows;
    const std::int64_t start = h * p.table_stride + p.row_offset0 - r;
    CopyRow(table + static_cast<std::size_t>(start) * es,
            out + static_cast<std::size_t>(flat) * row_bytes, row_bytes, stream);
  }
  if (stream) hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <cstdlib>
#include <vector>

namespace posbias::detail {

std::size_t stream_threshold_bytes() {
  // Larger than the private caches of all cores together, and than what a
  // consumer could expect to find still cached in a shared last level (at
  // 16 MiB ordinary and streaming stores measure the same here).
  static const std::size_t bytes = [] {
    if (const char* env = std::getenv("POSBIAS_STREAM_THRESHOLD")) {
      return static_cast<std::size_t>(std::strtoull(env, nullptr, 10));
    }
    return std::size_t{32} << 20;
  }();
  return bytes;
}

void convert_floats(const float* src, std::size_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case DType::kBFloat16:
      for (std::size_t k = 0; k < n; ++k) static_cast<bfloat16*>(dst)[k] = to_bfloat16(src[k]);
      break;
    case DType::kFloat16:
      for (std::size_t k = 0; k < n; ++k) static_cast<float16*>(dst)[k] = to_float16(src[k]);
      break;
  }
}

void expand_float_table(const float* table, std::int64_t heads, std::int64_t rows,
                        std::int64_t cols, DType dtype, void* out, bool stream) {
  if (heads == 0 || rows == 0 || cols == 0) return;
  const std::int64_t len = rows + cols - 1;
  const std::size_t count = static_cast<std::size_t>(heads * len);
  std::vector<std::uint16_t> table16;
  const void* src = table;
  if (dtype != DType::kFloat32) {
    table16.resize(count);
    convert_floats(table, count, dtype, table16.data());
    src = table16.data();
  }
  ToeplitzParams p;
  p.table = src;
  p.table_stride = len;
  p.row_offset0 = rows - 1;
  p.heads = heads;
  p.rows = rows;
  p.cols = cols;
  p.element_size = dtype_size(dtype);
  p.out = out;
  toeplitz_expand(p, stream);
}

HWY_EXPORT(ExpandRows);

void toeplitz_expand_rows(const ToeplitzParams& p, std::int64_t row_begin,
                          std::int64_t row_end, bool stream) {
  HWY_DYNAMIC_DISPATCH(ExpandRows)(p, row_begin, row_end, stream);
}

void toeplitz_expand(const ToeplitzParams& p, bool stream) {
  const std::int64_t total_rows = p.heads * p.rows;
  if (total_rows == 0 || p.cols == 0) return;
  const std::size_t bytes =
      static_cast<std::size_t>(total_rows) * static_cast<std::size_t>(p.cols) * p.element_size;
  // Below ~256 KiB a parallel region costs more than it saves.
  if (bytes < (std::size_t{256} << 10) || omp_get_max_threads() == 1) {
    toeplitz_expand_rows(p, 0, total_rows, stream);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    toeplitz_expand_rows(p, total_rows * t / nt, total_rows * (t + 1) / nt, stream);
  }
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
