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
// With at least kTableMinRows rows it builds each head's values once, in the
// output dtype, as a table of rows + cols - 1 entries, and expands it
// (kernels/toeplitz.h): a copy per row instead of arithmetic and rounding per
// element. With fewer rows (decode steps) the table would be as large as the
// output, so each element is computed directly.
void alibi_fill(const AlibiFillParams& p, bool stream);
constexpr std::int64_t kTableMinRows = 16;

// The direct path, on the current thread only (no OpenMP region): rows
// [row_begin, row_end) of the flattened heads*rows row space. Used by
// alibi_fill and by tests that check every compiled target.
void alibi_fill_rows(const AlibiFillParams& p, std::int64_t row_begin,
                     std::int64_t row_end, bool stream);

// The table path of alibi_fill, exposed for tests.
void alibi_fill_by_table(const AlibiFillParams& p, bool stream);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ALIBI_FILL_H_
