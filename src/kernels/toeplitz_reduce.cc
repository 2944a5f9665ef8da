// Toeplitz reduction (see toeplitz_reduce.h), compiled per instruction set by
// Highway and dispatched at run time.
//
// Why it looks like this: the gradient of a gathered bias is as large as the
// bias (heads * rows * cols floats) and is read exactly once, so the kernel is
// a streaming read with one vector add per input vector into an accumulator
// window that stays in L1. Rows are split into fixed blocks per head, each
// with its own small accumulator; the blocks' sums are then added per head
// in block order, so threads never share an accumulator and the result does
// not depend on how many threads ran.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/toeplitz_reduce.cc"
#include "kernels/toeplitz_reduce.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE void AddRowImpl(const float* HWY_RESTRICT row, float* HWY_RESTRICT acc, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t k = 0;
  for (; k + 2 * lanes <= n; k += 2 * lanes) {
    const auto a0 = hn::Add(hn::LoadU(d, acc + k), hn::LoadU(d, row + k));
    const auto a1 = hn::Add(hn::LoadU(d, acc + k + lanes), hn::LoadU(d, row + k + lanes));
    hn::StoreU(a0, d, acc + k);
    hn::StoreU(a1, d, acc + k + lanes);
  }
  for (; k + lanes <= n; k += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, acc + k), hn::LoadU(d, row + k)), d, acc + k);
  }
  for (; k < n; ++k) acc[k] += row[k];
}

void AddRow(const float* row, float* acc, std::int64_t n) { AddRowImpl(row, acc, n); }

void ReduceBlock(const ToeplitzReduceParams& p, std::int64_t h, std::int64_t row_begin,
                 std::int64_t row_end, float* acc) {
  const std::int64_t len = row_end - row_begin + p.cols - 1;
  std::fill(acc, acc + len, 0.0f);
  const float* g = p.grad + (h * p.rows + row_begin) * p.cols;
  // Row r's window starts (row_end - 1 - r) entries into acc.
  for (std::int64_t r = row_begin; r < row_end; ++r, g += p.cols) {
    AddRowImpl(g, acc + (row_end - 1 - r), p.cols);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <vector>

namespace posbias::detail {

HWY_EXPORT(AddRow);
HWY_EXPORT(ReduceBlock);

void toeplitz_reduce_add_row(const float* row, float* acc, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRow)(row, acc, n);
}

void toeplitz_reduce_block(const ToeplitzReduceParams& p, std::int64_t h, std::int64_t row_begin,
                           std::int64_t row_end, float* acc) {
  HWY_DYNAMIC_DISPATCH(ReduceBlock)(p, h, row_begin, row_end, acc);
}

void toeplitz_reduce(const ToeplitzReduceParams& p) {
  if (p.heads == 0 || p.rows == 0 || p.cols == 0) return;
  // About kTargetBlocks blocks in all, none shorter than kMinBlockRows rows:
  // enough to keep every thread busy, few enough that the partial sums (one
  // window of block_rows + cols - 1 floats each) stay small. A function of
  // the shape only.
  constexpr std::int64_t kTargetBlocks = 64;
  constexpr std::int64_t kMinBlockRows = 32;
  const std::int64_t max_per_head = (p.rows + kMinBlockRows - 1) / kMinBlockRows;
  const std::int64_t per_head =
      std::clamp<std::int64_t>((kTargetBlocks + p.heads - 1) / p.heads, 1, max_per_head);
  const std::int64_t blocks = p.heads * per_head;
  // Block b of head h covers rows [rows * b / per_head, rows * (b + 1) / per_head).
  const auto row_at = [&](std::int64_t b) { return p.rows * b / per_head; };
  std::vector<std::int64_t> offset(static_cast<std::size_t>(blocks) + 1, 0);
  for (std::int64_t k = 0; k < blocks; ++k) {
    const std::int64_t b = k % per_head;
    offset[static_cast<std::size_t>(k) + 1] =
        offset[static_cast<std::size_t>(k)] + row_at(b + 1) - row_at(b) + p.cols - 1;
  }
  std::vector<float> partial(static_cast<std::size_t>(offset.back()));
  const std::size_t bytes = static_cast<std::size_t>(p.heads) * static_cast<std::size_t>(p.rows) *
                            static_cast<std::size_t>(p.cols) * sizeof(float);
  const bool parallel =
      blocks > 1 && bytes >= (std::size_t{256} << 10) && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t k = 0; k < blocks; ++k) {
    const std::int64_t h = k / per_head;
    const std::int64_t b = k % per_head;
    toeplitz_reduce_block(p, h, row_at(b), row_at(b + 1),
                          partial.data() + offset[static_cast<std::size_t>(k)]);
  }
  // Per head: the covered range, then each block's window added in order.
  const std::int64_t first = p.row_offset0 - (p.rows - 1);
  const std::int64_t span = p.rows + p.cols - 1;
#pragma omp parallel for schedule(static) if (parallel && p.heads > 1)
  for (std::int64_t h = 0; h < p.heads; ++h) {
    float* t = p.table + h * p.table_stride + first;
    std::fill(t, t + span, 0.0f);
    for (std::int64_t b = 0; b < per_head; ++b) {
      const std::int64_t k = h * per_head + b;
      const std::int64_t r0 = row_at(b);
      const std::int64_t r1 = row_at(b + 1);
      if (r1 == r0) continue;
      // Entry 0 of the block's window is at table offset row_offset0 - (r1 - 1).
      toeplitz_reduce_add_row(partial.data() + offset[static_cast<std::size_t>(k)],
                              t + (p.rows - r1), r1 - r0 + p.cols - 1);
    }
  }
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
