// Internal: the kernel that writes ALiBi-style bias matrices. Not installed.
//
// One call writes `heads` planes of rows x cols values,
//
//     value(h, r, c) = scale[h] * dist(q0 + r, c)   (then +0.0 if canonical_zero)
//     dist(q, c)     = |c - q|         (kAbs)
//                      max(q - c, 0)   (kCausalClamp)
//
// converted to `dtype` (16-bit: rounded once, to nearest even) and stored
// contiguously at `out`. The caller has checked every argument.
#ifndef POSBIAS_SRC_KERNELS_ALIBI_FILL_H_
#define POSBIAS_SRC_KERNELS_ALIBI_FILL_H_

#include <cstddef>
#include <cstdint>

#include "posbias/dtype.h"

namespace posbias::detail {

enum class DistanceKind : std::uint8_t { kAbs, kCausalClamp };

struct AlibiFillParams {
  const float* scale = nullptr;  // [heads]
  std::int64_t heads = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t q0 = 0;  // position of row 0
  DistanceKind kind = DistanceKind::kAbs;
  bool canonical_zero = true;  // turn -0.0 into +0.0
  DType dtype = DType::kFloat32;
  void* out = nullptr;
};

// The value of one element: scale * dist(q, c) in float32 (+0.0 for a zero
// when canonical_zero). Every path of the kernel produces exactly this.
inline float alibi_value(float scale, std::int64_t q, std::int64_t c, DistanceKind kind,
                         bool canonical_zero) {
  const std::int64_t diff = c - q;
  const std::int64_t dist =
      kind == DistanceKind::kAbs ? (diff < 0 ? -diff : diff) : (diff < 0 ? -diff : 0);
  float v = scale * static_cast<float>(dist);
  if (canonical_zero) v += 0.0f;
  return v;
}

// Writes the bias with the best instruction set of this CPU (Highway dynamic
// dispatch), threads over rows (OpenMP). `stream` selects non-temporal stores.
//
// Two paths, chosen by alibi_fill_uses_table(rows, cols):
//  - table: each head's rows + cols - 1 values are computed once, in the
//    output dtype, and expanded (kernels/toeplitz.h): a copy per row instead
//    of arithmetic and rounding per element (measured 2-4x faster than the
//    direct path at 8 heads x 4096 x 16, 1.7-2x at 32 x 32). Its scratch is
//    heads * (rows + cols - 1) elements of the output dtype.
//  - direct: each element computed from its row and column, no scratch.
// The table is used only when its scratch is at most 1/8 of the output,
// 8 (rows + cols - 1) <= rows * cols, and rows >= kTableMinRows. Decode
// steps (few rows) and tall, narrow outputs (few columns) would otherwise
// allocate about as much scratch as output: heads 1, i = 2e7, j = 1 built an
// 80 MB table beside the 80 MB result (CLI peak RSS 165 MB; a request that
// passed the "fits in memory" check could then fail to allocate); now the
// direct path writes it (peak RSS 88 MB; 49 MB in bfloat16). Peak memory is
// at most 1.125x the output. Why this rule rather than also requiring
// cols >= 16: it bounds the memory itself and keeps the table for tall
// outputs of 9-15 columns, where it was 2-3x faster; what it gives up is the
// table for 2-8 columns (measured 1.3-2x faster there, at 1/4 to 1/2 of the
// output in scratch).
void alibi_fill(const AlibiFillParams& p, bool stream);
constexpr std::int64_t kTableMinRows = 16;

// Whether alibi_fill takes the table path for this shape (see above).
bool alibi_fill_uses_table(std::int64_t rows, std::int64_t cols);

// The direct path, on the current thread only (no OpenMP region): rows
// [row_begin, row_end) of the flattened heads*rows row space. Used by
// alibi_fill and by tests that check every compiled target.
void alibi_fill_rows(const AlibiFillParams& p, std::int64_t row_begin, std::int64_t row_end,
                     bool stream);

// The table path of alibi_fill, whatever the shape, exposed for tests.
void alibi_fill_by_table(const AlibiFillParams& p, bool stream);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ALIBI_FILL_H_
