// Internal, per instruction set: the fused forward's online softmax over
// one key block (attention_fused.cc, attention_task-inl.h):
//
//   OnlineSoftmaxRow  one row over its stored, biased and masked scores
//                     (the general path: any bias, mask, window)
//   QKSoftmaxTile     the register tile: q K^T, softcap, bias, the causal
//                     diagonal, and the softmax update of R rows without
//                     storing the scores first; it keeps each row's running
//                     maximum while a block exceeds it by at most
//                     kAttnStaleMax
//
// The backward recomputes P from the saved log-sum-exp and needs neither.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_exp-inl.h"
#include "kernels/attention_params.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How far a block's row maximum may exceed the row's running maximum m and
// the register softmax tile still keep m (FlashAttention-4's conditional
// rescaling): its terms exp(s - m) are then at most 256, and the row's
// state and O need no rescale. ln 256.
constexpr float kAttnStaleMax = 5.5451774f;

// The bias of the register softmax tile (QKSoftmaxTile): ALiBi's fold, or
// each row's distance-table entries from the block's first key (null: the
// row sees none of the block and reads none).
struct TileBias {
  AlibiFold alibi;
  const float* const* table_rows = nullptr;
};

// Forward, one row's online-softmax update with this block's biased and
// masked scores s (first `lim` visible, row max `row_max`): s becomes
// p = exp(s - m_new) over the visible vectors; m, l move to the new max and
// sum; returns the factor exp(m_old - m_new) for the row's accumulated O.
// A row without a finite score yet contributes nothing (its `lim` becomes
// 0); a NaN score makes its l NaN.
HWY_INLINE float OnlineSoftmaxRow(DF df, float* HWY_RESTRICT s, std::int64_t& lim, float row_max,
                                  float& m, float& l) {
  const float m_old = m;
  const float m_new = std::max(m_old, row_max);
  if (m_new == kAttnNegInf) {
    // The vector max may have dropped NaN scores (x86 max returns one
    // operand), so look for them: they poison the row's sum.
    for (std::int64_t c = 0; c < lim; ++c) {
      if (std::isnan(s[c])) l = std::numeric_limits<float>::quiet_NaN();
    }
    lim = 0;
    return 1.0f;
  }
  const float alpha = m_old == kAttnNegInf ? 0.0f : std::exp(m_old - m_new);
  const VF vm = hn::Set(df, m_new);
  VF sum = hn::Zero(df);
  const std::int64_t span = AttnRoundUp(df, lim);
  for (std::int64_t x = 0; x < span; x += AttnLanes(df)) {
    const VF e = SafeExp(df, hn::Sub(hn::Load(df, s + x), vm));
    hn::Store(e, df, s + x);
    sum = hn::Add(sum, e);
  }
  l = l * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
  m = m_new;
  return alpha;
}

// The score tile of R rows over a key block of V vectors that every row
// sees from its first key (no mask, window edge or dense bias; with kCap
// soft-capped first, then ALiBi or the distance table added, the order of
// BiasMaskMaxRow); with kPartial, row r sees the block's first lim[r] keys
// only (the causal diagonal) and its other scores become -inf. With
// the online-softmax update done on the registers: each row's
// max, p = exp(s - m_new) and its sum, and the rescale factor alpha, as
// OnlineSoftmaxRow computes them; P is stored at s. Done per row pass over
// the stored scores (BiasMaskMax, then OnlineSoftmaxRow) this cost about
// 70 cycles per row and 64-key block on a Zen 5, a sixth of the prefill.
// A row whose max is -inf (no finite score) takes OnlineSoftmaxRow itself.
template <int R, int V, FusedBias kBias, bool kCap, bool kPartial>
HWY_INLINE void QKSoftmaxTile(DF df, const float* HWY_RESTRICT q, std::int64_t ldq, std::int64_t d,
                              const float* HWY_RESTRICT kt, std::int64_t ld, float* HWY_RESTRICT s,
                              std::int64_t lds, const TileBias& bias, float softcap,
                              const std::int64_t* lim, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                              float* HWY_RESTRICT lv, float* HWY_RESTRICT alpha) {
  const std::int64_t n = AttnLanes(df);
  VF acc[R][V];
  QKAccumulate<R, V>(df, q, ldq, d, kt, ld, 0, acc);
  if constexpr (kCap) {  // cap tanh(s / cap), before the bias (as BiasMaskMaxRow<true>)
    const VF cap = hn::Set(df, softcap);
    const VF inv_cap = hn::Set(df, 1.0f / softcap);
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < V; ++u) {
        acc[r][u] = hn::Mul(cap, hn::Tanh(df, hn::Mul(acc[r][u], inv_cap)));
      }
    }
  } else {
    (void)softcap;
  }
  if constexpr (kBias == FusedBias::kAlibi) AddAlibiFold<R, V>(df, 0, bias.alibi, acc);
  if constexpr (kBias == FusedBias::kTable) {  // a row that sees none of the block reads none
    for (int r = 0; r < R; ++r) {
      if (bias.table_rows[r] == nullptr) continue;
      for (int u = 0; u < V; ++u) {
        acc[r][u] = hn::Add(acc[r][u], hn::LoadU(df, bias.table_rows[r] + u * n));
      }
    }
  }
  if constexpr (kPartial) {  // keys past a row's lim: -inf (a NaN there reaches nothing)
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < V; ++u) {
        const std::int64_t seen = std::clamp<std::int64_t>(lim[r] - u * n, 0, n);
        acc[r][u] = hn::IfThenElse(hn::FirstN(df, static_cast<std::size_t>(seen)), acc[r][u],
                                   hn::Set(df, kAttnNegInf));
      }
    }
  } else {
    (void)lim;
  }
  float row_max[R];
  bool stale = true;  // every row's max at most kAttnStaleMax above its running m
  for (int r = 0; r < R; ++r) {
    VF mx = acc[r][0];
    for (int u = 1; u < V; ++u) mx = hn::Max(mx, acc[r][u]);
    row_max[r] = hn::GetLane(hn::MaxOfLanes(df, mx));
    // False for a NaN maximum and for a row without a finite score yet.
    stale = stale && m[r] != kAttnNegInf && row_max[r] <= m[r] + kAttnStaleMax;
  }
  if (stale) {
    // The running maxima stay: p = exp(s - m) <= e^kAttnStaleMax, alpha = 1.
    // The branch is predicted, so the exps start without waiting for the
    // row maxima (a chain of shuffles per row, then the rescale's exp).
    for (int r = 0; r < R; ++r) {
      float* srow = s + r * lds;
      const VF vm = hn::Set(df, m[r]);
      VF sum = hn::Zero(df);
      for (int u = 0; u < V; ++u) {
        const VF e = ExpUnclamped(df, hn::Sub(acc[r][u], vm));
        hn::Store(e, df, srow + u * n);
        sum = hn::Add(sum, e);
      }
      hn::Store(hn::Add(hn::Load(df, lv + r * n), sum), df, lv + r * n);
      alpha[r] = 1.0f;
    }
    return;
  }
  // The rescale factors exp(m_old - m_new) of all R rows in one vector
  // exp (a scalar std::exp per row was 2% of a prefill on a Zen 5): an
  // m_old of -inf gives exactly 0 (as does a difference below -40, where
  // the old terms are below 4e-18 of the new maximum's), NaN stays NaN, a
  // row without a finite score (m_new = -inf) takes the general update.
  constexpr std::size_t kLanes = hn::MaxLanes(DF());
  constexpr std::size_t kRowsPadded = (R + kLanes - 1) / kLanes * kLanes;
  HWY_ALIGN float rescale[kRowsPadded];
  for (int r = 0; r < R; ++r) {
    const float m_new = std::max(m[r], row_max[r]);
    rescale[r] = m_new == kAttnNegInf ? 0.0f : m[r] - m_new;
  }
  for (std::size_t r = R; r < kRowsPadded; ++r) rescale[r] = 0.0f;
  for (std::int64_t x = 0; x < R; x += n) {
    hn::Store(SafeExp(df, hn::Load(df, rescale + x)), df, rescale + x);
  }
  for (int r = 0; r < R; ++r) {
    float* srow = s + r * lds;
    const float m_new = std::max(m[r], row_max[r]);
    if (m_new == kAttnNegInf) {  // no finite score: the general update
      for (int u = 0; u < V; ++u) hn::Store(acc[r][u], df, srow + u * n);
      l[r] += hn::GetLane(hn::SumOfLanes(df, hn::Load(df, lv + r * n)));
      hn::Store(hn::Zero(df), df, lv + r * n);
      std::int64_t span = V * n;
      alpha[r] = OnlineSoftmaxRow(df, srow, span, row_max[r], m[r], l[r]);
      continue;
    }
    const float a = rescale[r];
    const VF vm = hn::Set(df, m_new);
    VF sum = hn::Zero(df);
    for (int u = 0; u < V; ++u) {
      const VF e = ExpUnclamped(df, hn::Sub(acc[r][u], vm));
      hn::Store(e, df, srow + u * n);
      sum = hn::Add(sum, e);
    }
    l[r] *= a;
    const VF av = hn::Set(df, a);
    hn::Store(hn::MulAdd(av, hn::Load(df, lv + r * n), sum), df, lv + r * n);
    m[r] = m_new;
    alpha[r] = a;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_ toggle
