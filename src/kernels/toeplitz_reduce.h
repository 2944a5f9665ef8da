// Internal: the adjoint of the Toeplitz expansion (kernels/toeplitz.h), for
// float32. Not installed.
//
// toeplitz_expand writes row r of head h as a window of that head's table:
//
//     out[h][r][c] = table[h * table_stride + row_offset0 - r + c]
//
// so the gradient of a loss with respect to the table is the sum of the
// gradient rows over those same windows:
//
//     table[h * table_stride + e] = sum over (r, c) with row_offset0 - r + c = e
//                                   of grad[h][r][c]
//
// for every entry e in [row_offset0 - rows + 1, row_offset0 + cols - 1] (the
// entries the windows cover; the others are left as they are). One pass over
// grad, at memory speed: each row is added into a window of an accumulator
// that stays in L1.
#ifndef POSBIAS_SRC_KERNELS_TOEPLITZ_REDUCE_H_
#define POSBIAS_SRC_KERNELS_TOEPLITZ_REDUCE_H_

#include <cstdint>

namespace posbias::detail {

struct ToeplitzReduceParams {
  const float* grad = nullptr;  // contiguous [heads, rows, cols]
  std::int64_t heads = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  float* table = nullptr;         // heads tables
  std::int64_t table_stride = 0;  // entries between consecutive heads' tables
  std::int64_t row_offset0 = 0;   // window start of row 0 (>= rows - 1)
};

// The whole reduction, threaded (OpenMP) over fixed blocks of rows whose
// partial sums are added in a fixed order: the result is the same for every
// number of threads. float32 accumulation.
void toeplitz_reduce(const ToeplitzReduceParams& p);

// acc[k] += row[k] for k < n, on the calling thread with the best instruction
// set of this CPU (the kernel's inner step, exposed for tests of every
// compiled target).
void toeplitz_reduce_add_row(const float* row, float* acc, std::int64_t n);

// Rows [row_begin, row_end) of head h summed into a window accumulator of
// (row_end - row_begin) + cols - 1 entries: entry k of acc receives the
// elements at table offset row_offset0 - (row_end - 1) + k. acc is
// overwritten. On the calling thread.
void toeplitz_reduce_block(const ToeplitzReduceParams& p, std::int64_t h, std::int64_t row_begin,
                           std::int64_t row_end, float* acc);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_TOEPLITZ_REDUCE_H_
