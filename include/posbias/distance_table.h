// Distance tables: the Toeplitz expansion of a per-head table into a dense
// [heads, i, j] bias, and its adjoint (the backward of the expansion).
//
// Every relative-position bias (ALiBi, Dynamic Position Bias, T5 buckets, any
// bias that depends on q_r - c only) is a table of one value per distance.
// A table [heads, n], n odd, is read at its CENTRE C = (n - 1) / 2:
//
//   bias[h][r][c] = table[h][C + (q_r - c)],   q_r = j - i + r  (bottom-right)
//
// so entry C is distance 0, C + d the query d positions after the key (a past
// key) and C - d a future key. One table built for the longest sequence
// serves every shorter one; with n = 2j - 1 (C = j - 1) this is the
// [heads, 2j - 1] table that DynamicPositionBias::distance_table,
// RelativePositionBias::distance_table and the fused attention use. A call
// (i, j) reads the distances 1 - i .. j - 1, so it needs
// C >= max(i, j) - 1, i.e. n >= 2 max(i, j) - 1 (i > j is allowed).
//
// Both calls are the posbias Toeplitz kernels: the expansion copies each
// output row as a window of the (reversed) table, at memory speed, with
// streaming stores for outputs of 32 MiB and more; the reduction reads the
// gradient once, adding each row into a window of a small accumulator.
// Threads: OpenMP inside each call (results do not depend on the number of
// threads); concurrent calls on distinct outputs are safe.
//
//   posbias::Tensor table = dpb.distance_table(4096);             // [8, 8191]
//   posbias::Tensor bias = posbias::expand_distance_table(table, 1, 100);  // [8, 1, 100]
//   posbias::Tensor grad_table = posbias::reduce_distance_table(grad_bias, 8191);
#ifndef POSBIAS_DISTANCE_TABLE_H_
#define POSBIAS_DISTANCE_TABLE_H_

#include <cstdint>

#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias {

/// The dense bias [heads, i, j] of a distance table [heads, n] read at its
/// centre (see the file comment): bias[h][r][c] = table[h][(n - 1) / 2 + (j - i
/// + r - c)], contiguous, in `dtype`. The table may have any of the three
/// dtypes (16-bit values are widened exactly) and any strides (including a
/// stride-0 head dimension); values are rounded once from float32 to `dtype`.
/// i, j >= 0; i = 0 or j = 0 gives an empty tensor.
///
/// Throws std::invalid_argument, with the values, when the table is not 2-d,
/// i or j is negative, n is even, or the table is too short for (i, j)
/// ((n - 1) / 2 < max(i, j) - 1); std::length_error when heads * i * j
/// elements of `dtype` overflow or exceed physical memory (checked before
/// allocating). Cost: one copy per output row from a reversed float32 (and,
/// for a 16-bit dtype, 16-bit) copy of the i + j - 1 entries each head reads;
/// that scratch is at most 1/8 of the output, else (few rows or columns: decode
/// steps) written in tiles of at most 2^18 entries per head and thread.
///
/// float64 (a float64 table or dtype kFloat64): the reference path, exact in
/// double (the table read in double, a float64 output is the entry itself, a
/// narrower one its rounding); one plain pass, not fast.
Tensor expand_distance_table(const Tensor& table, std::int64_t i, std::int64_t j,
                             DType dtype = DType::kFloat32);

/// As expand_distance_table(), into caller-owned contiguous memory of
/// heads * i * j elements of `dtype` (any alignment; null only when there are
/// none: std::invalid_argument otherwise). Same checks, made before anything
/// is written.
void expand_distance_table_into(const Tensor& table, std::int64_t i, std::int64_t j, DType dtype,
                                void* out);

/// The adjoint of expand_distance_table (its backward): the gradient of a
/// loss with respect to a [heads, n] table given the gradient `grad` of the
/// expanded bias [heads, i, j]. Entry (n - 1) / 2 + s of head h is the sum of
/// grad[h][r][c] over the diagonal q_r - c = s (s = 1 - i .. j - 1); the
/// entries no (r, c) reads are 0. Returns a new contiguous float32 [heads, n]
/// tensor, accumulated in float32 in an order fixed by the shape (the same
/// result for every thread count). grad: any of the three dtypes and any
/// strides (a copy to contiguous float32 is made when it is not already so).
/// A float64 grad takes the reference path: a float64 [heads, n] of double
/// sums (each diagonal in row order), exact in double, not fast.
///
/// Throws std::invalid_argument, with the values, when grad is not 3-d, n is
/// even or negative, or n is too short for (i, j) as above; std::length_error
/// when [heads, n] float32 does not fit in memory. Cost: one pass over grad;
/// memory beyond the result: partial sums of about max(64, heads) * (i / 64 +
/// j) floats.
Tensor reduce_distance_table(const Tensor& grad, std::int64_t n);

}  // namespace posbias

#endif  // POSBIAS_DISTANCE_TABLE_H_
