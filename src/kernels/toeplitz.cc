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
#include "kernels/float_store.h"

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

#include <algorithm>
#include <vector>

#include "kernels/scratch.h"

namespace posbias::detail {

// 32 MiB: larger than the private caches of all cores together, and than
// what a consumer could expect to find still cached in a shared last level
// (at 16 MiB ordinary and streaming stores measure the same here). A fixed
// constant, not an environment variable: the threshold only changes speed,
// never results, and a kernel's behaviour should not depend on the process
// environment.
constexpr std::size_t kStreamThresholdBytes = std::size_t{32} << 20;

std::size_t stream_threshold_bytes() { return kStreamThresholdBytes; }

void convert_floats(const float* src, std::size_t n, DType dtype, void* dst) {
  store_floats(src, n, 1.0f, dtype, dst);
}

void expand_float_table(const float* table, std::int64_t heads, std::int64_t rows,
                        std::int64_t cols, DType dtype, void* out, bool stream) {
  if (heads == 0 || rows == 0 || cols == 0) return;
  const std::int64_t len = rows + cols - 1;
  const std::size_t count = static_cast<std::size_t>(heads * len);
  std::vector<std::uint16_t> table16;
  const void* src = table;
  if (dtype != DType::kFloat32) {
    resize_scratch(table16, heads * len, "the distance table in a 16-bit dtype");
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

bool whole_table_is_small(std::int64_t rows, std::int64_t cols, DType dtype) {
  // Scratch bytes per table entry: 4 (float32), 6 (float32 + 16-bit copy);
  // rows * cols * es cannot overflow (the output exists).
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t scratch = dtype == DType::kFloat32 ? 4 : 6;
  return 8 * scratch * (rows + cols - 1) <= rows * cols * es;
}

namespace {

// What every tile of expand_generated_table shares.
struct GeneratedTable {
  std::int64_t heads, rows, cols;
  DType dtype;
  unsigned char* out;
  bool stream;
  bool tall;  // tiles of rows (else of columns)
  const TableFill* fill;
};

// Produces the table entries tile [at, at + span) needs (into table, and
// table16 for 16-bit outputs) and writes its part of the output.
void generate_tile(const GeneratedTable& g, std::int64_t at, std::int64_t span,
                   std::vector<float>& table, std::vector<std::uint16_t>& table16) {
  const std::size_t es = dtype_size(g.dtype);
  const char* what = "a tile of the distance table";
  if (g.tall) {
    // Rows [at, at + span) read entries [rows - at - span, rows - at + cols - 1).
    const std::int64_t n = span + g.cols - 1;
    resize_scratch(table, g.heads * n, what);
    (*g.fill)(g.rows - at - span, n, table.data());
    const void* src = table.data();
    if (g.dtype != DType::kFloat32) {
      resize_scratch(table16, g.heads * n, what);
      convert_floats(table.data(), table.size(), g.dtype, table16.data());
      src = table16.data();
    }
    for (std::int64_t h = 0; h < g.heads; ++h) {
      ToeplitzParams p;
      p.table = static_cast<const unsigned char*>(src) + static_cast<std::size_t>(h * n) * es;
      p.table_stride = n;
      p.row_offset0 = span - 1;
      p.heads = 1;
      p.rows = span;
      p.cols = g.cols;
      p.element_size = es;
      p.out = g.out + static_cast<std::size_t>((h * g.rows + at) * g.cols) * es;
      toeplitz_expand_rows(p, 0, span, g.stream);
    }
    return;
  }
  // Columns [at, at + span) read entries [at, at + span + rows - 1);
  // row r of head h copies (and rounds) span of them from rows - 1 - r.
  const std::int64_t n = span + g.rows - 1;
  resize_scratch(table, g.heads * n, what);
  (*g.fill)(at, n, table.data());
  for (std::int64_t flat = 0; flat < g.heads * g.rows; ++flat) {
    const std::int64_t h = flat / g.rows;
    const std::int64_t r = flat - h * g.rows;
    convert_floats(table.data() + h * n + (g.rows - 1 - r), static_cast<std::size_t>(span),
                   g.dtype, g.out + static_cast<std::size_t>(flat * g.cols + at) * es);
  }
}

}  // namespace

void expand_generated_table(std::int64_t heads, std::int64_t rows, std::int64_t cols, DType dtype,
                            void* out, bool stream, const TableFill& fill) {
  if (heads == 0 || rows == 0 || cols == 0) return;
  const std::int64_t len = rows + cols - 1;
  if (whole_table_is_small(rows, cols, dtype)) {
    std::vector<float> table;
    resize_scratch(table, heads * len, "the distance table");
    fill(0, len, table.data());
    expand_float_table(table.data(), heads, rows, cols, dtype, out, stream);
    return;
  }
  // Tiles along the long dimension, produced and written by one thread each
  // (no serial gaps between parallel regions), at most kTableTile long and
  // at least as many as there are threads.
  const GeneratedTable g{heads, rows, cols, dtype, static_cast<unsigned char*>(out),
                         stream, rows >= cols, &fill};
  const std::int64_t along = g.tall ? rows : cols;
  const std::size_t out_bytes =
      static_cast<std::size_t>(heads * rows) * static_cast<std::size_t>(cols) * dtype_size(dtype);
  const std::int64_t threads =
      out_bytes >= (std::size_t{256} << 10) ? std::max(1, omp_get_max_threads()) : 1;
  const std::int64_t tile = std::min(kTableTile, (along + threads - 1) / threads);
  const std::int64_t tiles = (along + tile - 1) / tile;
  // An error on one thread (a failed allocation here or in `fill`) must not
  // leave the region (std::terminate): the other threads skip their
  // remaining tiles and the first error is rethrown after it.
  ThreadErrors errors;
#pragma omp parallel if (threads > 1 && tiles > 1)
  {
    std::vector<float> table;
    std::vector<std::uint16_t> table16;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tiles; ++t) {
      if (errors.failed()) continue;
      errors.run([&] {
        generate_tile(g, t * tile, std::min(tile, along - t * tile), table, table16);
      });
    }
  }
  errors.rethrow();
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
