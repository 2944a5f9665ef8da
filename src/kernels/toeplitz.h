// Internal: expansion of per-head "Toeplitz" tables into a dense bias.
// Not installed.
//
// Every relative-position bias in posbias (ALiBi, Dynamic Position Bias, T5
// buckets) depends on (query position - key position) only, so each row of
// the dense [heads, rows, cols] bias is a contiguous window of one per-head
// table: row r of head h is
//
//     out[h][r][0..cols) = table + h * table_stride + (row_offset0 - r) [0..cols)
//
// (windows move one element left per row). Writing the bias is then a copy
// from a table that stays in L1/L2 into the output, with streaming stores
// when the output is large: the same memory traffic as a fill, whatever the
// element type, and no per-element arithmetic.
#ifndef POSBIAS_SRC_KERNELS_TOEPLITZ_H_
#define POSBIAS_SRC_KERNELS_TOEPLITZ_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "posbias/dtype.h"

namespace posbias::detail {

// Outputs at least this large are written with non-temporal (streaming)
// stores: they would not stay in cache for the consumer anyway, and streaming
// skips the read-for-ownership of every destination line. 32 MiB (a named
// constant in toeplitz.cc, with its reason).
std::size_t stream_threshold_bytes();

// Converts n float32 values to `dtype` at dst, rounding once to nearest even.
void convert_floats(const float* src, std::size_t n, DType dtype, void* dst);

struct ToeplitzParams {
  const void* table = nullptr;    // heads tables, element_size bytes each entry
  std::int64_t table_stride = 0;  // entries between consecutive heads' tables
  std::int64_t row_offset0 = 0;   // window start of row 0 (>= rows - 1)
  std::int64_t heads = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::size_t element_size = 4;   // 2 or 4
  void* out = nullptr;            // contiguous [heads, rows, cols]
};

// Whole output, threaded over rows (OpenMP, contiguous ranges).
void toeplitz_expand(const ToeplitzParams& p, bool stream);

// Rows [row_begin, row_end) of the flattened heads*rows row space, on the
// calling thread (best instruction set of this CPU).
void toeplitz_expand_rows(const ToeplitzParams& p, std::int64_t row_begin,
                          std::int64_t row_end, bool stream);

// The common tail of every relative-position bias. `table` holds, for each of
// `heads` heads, rows + cols - 1 float32 values, where row r of the output
// reads entries [rows - 1 - r, rows - 1 - r + cols) (entry k is the value at
// query - key distance cols - 1 - k for bottom-right alignment). Rounds the
// table once to `dtype` and expands it into contiguous [heads, rows, cols] at
// `out`, with streaming stores when `stream`.
void expand_float_table(const float* table, std::int64_t heads, std::int64_t rows,
                        std::int64_t cols, DType dtype, void* out, bool stream);

// Produces entries [k0, k0 + n) of every head's table (entry k as in
// expand_float_table) as float32 at dst[h * n + (k - k0)]. The value of an
// entry must not depend on k0 and n. May be called from several threads at
// once (for different ranges).
using TableFill = std::function<void(std::int64_t k0, std::int64_t n, float* dst)>;

// Whether the whole table of expand_float_table (heads * (rows + cols - 1)
// float32 values, plus their 16-bit copy for a 16-bit dtype) is at most 1/8
// of the output's bytes.
bool whole_table_is_small(std::int64_t rows, std::int64_t cols, DType dtype);

// The same result as expand_float_table on the table `fill` produces, with
// bounded scratch. When whole_table_is_small, the table is produced at once
// and expanded (threaded, streaming). Otherwise (few rows or few columns:
// decode steps, tall narrow outputs) the whole table would be about as large
// as the output (heads 1, rows 2e7, cols 1: 80 MB beside an 80 MB result), so
// the output is written in tiles of at most kTableTile rows (tall) or
// columns (wide), each from its own table of tile + min(rows, cols) - 1
// entries per head, one tile per thread at a time (OpenMP): scratch
// O(threads * heads * kTableTile), and every entry still produced about once.
void expand_generated_table(std::int64_t heads, std::int64_t rows, std::int64_t cols, DType dtype,
                            void* out, bool stream, const TableFill& fill);
constexpr std::int64_t kTableTile = std::int64_t{1} << 18;

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_TOEPLITZ_H_
