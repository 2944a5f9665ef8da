// Internal, per instruction set: the bound behind every skip of flushed
// work (the forward's flushed tiles, attention_skip-inl.h; the backward's
// flushed blocks, attention_backward.cc). A weight p = exp(x) is exactly 0
// where x < -40 (ExpUnclamped, ExpFlushed), x being a score less the row's
// running maximum (forward) or its lse (backward). A score is
//
//   s = q . k + bias <= |q| max_k |k| + the row's largest bias over the keys
//
// (Cauchy-Schwarz on the scaled q row and the block's largest key norm;
// ALiBi's -slope |key - anchor| at the row's nearest visible key, or its
// farthest for a negative slope), so a row whose bound sits more than 41
// below that reference (one unit of margin) gets p = 0 from every key of
// the block. The margins cover every rounding on the way to x (the dot
// product's, the norms', the bias's FMA, the subtraction: together far
// below the 1e-3 relative and the 1 absolute used). The bound needs no
// trust in the data: a NaN or infinite q, k or reference fails it.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_FLUSH_BOUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_FLUSH_BOUND_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_FLUSH_BOUND_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_FLUSH_BOUND_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention_blocks-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// |x| of a float32 row of n elements; NaN if any element is NaN.
HWY_INLINE float RowNorm(DF df, const float* HWY_RESTRICT x, std::int64_t n) {
  const std::int64_t lanes = AttnLanes(df);
  VF acc = hn::Zero(df);
  std::int64_t c = 0;
  for (; c + lanes <= n; c += lanes) {
    const VF v = hn::LoadU(df, x + c);
    acc = hn::MulAdd(v, v, acc);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; c < n; ++c) sum += x[c] * x[c];
  return std::sqrt(sum);
}

// Whether the packed rows [0, rows) (dp floats each, a whole number of
// vectors, 64-byte aligned; zeros past d and in masked rows) are finite.
HWY_INLINE bool PackedValuesFinite(DF df, const float* HWY_RESTRICT vp, std::int64_t rows,
                                   std::int64_t dp) {
  const std::int64_t lanes = AttnLanes(df);
  auto finite = hn::FirstN(df, hn::Lanes(df));
  for (std::int64_t x = 0; x < rows * dp; x += lanes) {
    finite = hn::And(finite, hn::IsFinite(hn::Load(df, vp + x)));
  }
  return hn::AllTrue(df, finite);
}

// ALiBi's largest bias, neg_slope |c - anchor|, over keys c in [lo, hi]:
// at the nearest key for neg_slope <= 0, else at the farthest.
HWY_INLINE double AlibiBiasMax(double neg_slope, double lo, double hi, double anchor) {
  const double dist = neg_slope <= 0.0 ? std::max({lo - anchor, anchor - hi, 0.0})
                                       : std::max(std::abs(lo - anchor), std::abs(hi - anchor));
  return neg_slope * dist;
}

// A row's headroom: how far a q . k may reach, given the row's largest bias
// over the block and its reference (running maximum or lse), for every p
// of the block to be 0. NaN for a NaN reference, -inf for -inf: no dot
// product is below either.
HWY_INLINE double FlushHeadroom(double reference, double bias) {
  return reference - 40.0 - (bias + 1e-4 * (std::abs(bias) + std::abs(reference)) + 1.0);
}

// Whether |q| kmax (1 + 1e-3), the bound of a row's q . k over the block,
// is within its headroom `need` with 1e-4 of it to spare. With a soft-cap
// (> 0) the capped q . k, cap tanh(q . k / cap), is at most min(bound,
// cap); a non-finite bound is no bound (0 inf is a NaN score).
HWY_INLINE bool DotWithinHeadroom(float qnorm, float kmax, float softcap, double need) {
  double dot = static_cast<double>(qnorm) * static_cast<double>(kmax) * (1.0 + 1e-3);
  if (!std::isfinite(dot)) return false;
  if (softcap > 0.0f) dot = std::min(dot, static_cast<double>(softcap));
  return dot * (1.0 + 1e-4) < need;  // false for a NaN or -inf headroom
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_FLUSH_BOUND_INL_H_ toggle
