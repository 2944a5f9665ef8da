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

// The scores of one chunk of the register tile, on the registers: rows
// [0, R) of q against columns [x, x + V N) of kt; with kCap soft-capped
// first, then ALiBi or the distance table added (the order of
// BiasMaskMaxRow); with kPartial, the columns at or past a row's lim[r]
// (from the block's first key) become -inf.
template <int R, int V, FusedBias kBias, bool kCap, bool kPartial>
HWY_INLINE void TileChunkScores(DF df, const float* HWY_RESTRICT q, std::int64_t ldq,
                                std::int64_t d, const float* HWY_RESTRICT kt, std::int64_t ld,
                                std::int64_t x, const TileBias& bias, float softcap,
                                const std::int64_t* lim, VF (&acc)[R][V]) {
  const std::int64_t n = AttnLanes(df);
  QKAccumulate<R, V>(df, q, ldq, d, kt, ld, x, acc);
  if constexpr (kCap) {  // cap tanh(s / cap), before the bias (as BiasMaskMaxRow<true>)
    const VF cap = hn::Set(df, softcap);
    const VF inv_cap = hn::Set(df, 1.0f / softcap);
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < V; ++u) {
        acc[r][u] = hn::Mul(cap, SoftcapTanh(df, hn::Mul(acc[r][u], inv_cap)));
      }
    }
  } else {
    (void)softcap;
  }
  if constexpr (kBias == FusedBias::kAlibi) AddAlibiFold<R, V>(df, x, bias.alibi, acc);
  if constexpr (kBias == FusedBias::kTable) {  // a row that sees none of the block reads none
    for (int r = 0; r < R; ++r) {
      if (bias.table_rows[r] == nullptr) continue;
      for (int u = 0; u < V; ++u) {
        acc[r][u] = hn::Add(acc[r][u], hn::LoadU(df, bias.table_rows[r] + x + u * n));
      }
    }
  }
  if constexpr (kPartial) {  // keys past a row's lim: -inf (a NaN there reaches nothing)
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < V; ++u) {
        const std::int64_t seen = std::clamp<std::int64_t>(lim[r] - x - u * n, 0, n);
        acc[r][u] = hn::IfThenElse(hn::FirstN(df, static_cast<std::size_t>(seen)), acc[r][u],
                                   hn::Set(df, kAttnNegInf));
      }
    }
  } else {
    (void)lim;
  }
}

// The score tile of R rows over the first `chunks` V N keys of a key block
// that every row sees from its first key (no mask, window edge or dense
// bias; softcap and bias as TileChunkScores); with kPartial, row r sees the
// block's first lim[r] keys only (the causal diagonal) and its other
// scores become -inf. With the online-softmax update done on the registers,
// chunk by chunk (V N keys: the whole 64-key block on AVX-512, a quarter
// of it on AVX2's 16 registers): p = exp(s - m) and its sum, stored at s;
// alpha[r], the factor for the row's O, is the product of the chunks'
// rescale factors. Done per row pass over the stored scores (BiasMaskMax,
// then OnlineSoftmaxRow) this cost about 70 cycles per row and 64-key block
// on a Zen 5, a sixth of the prefill (on a Zen 3, AVX2: 21%).
//
// A chunk whose rows' scores are each at most kAttnStaleMax above the row's
// running maximum (a compare per vector, no horizontal maximum) keeps the
// maxima: alpha 1, l unchanged. Else each row's maximum is found and moves
// up: l, the partial sums lv and the P already stored for the block's
// earlier chunks are rescaled. A row with no finite score yet stores P = 0
// (a NaN among its scores makes l NaN).
template <int R, int V, FusedBias kBias, bool kCap, bool kPartial>
HWY_INLINE void QKSoftmaxTile(DF df, const float* HWY_RESTRICT q, std::int64_t ldq, std::int64_t d,
                              const float* HWY_RESTRICT kt, std::int64_t ld, float* HWY_RESTRICT s,
                              std::int64_t lds, const TileBias& bias, float softcap,
                              const std::int64_t* lim, std::int64_t chunks, float* HWY_RESTRICT m,
                              float* HWY_RESTRICT l, float* HWY_RESTRICT lv,
                              float* HWY_RESTRICT alpha) {
  const std::int64_t n = AttnLanes(df);
  for (int r = 0; r < R; ++r) alpha[r] = 1.0f;
  for (std::int64_t x = 0; x < chunks * V * n; x += V * n) {
    VF acc[R][V];
    TileChunkScores<R, V, kBias, kCap, kPartial>(df, q, ldq, d, kt, ld, x, bias, softcap, lim, acc);
    // Every score at most kAttnStaleMax above its row's m; false for a row
    // without a finite m yet (its bound is NaN). A NaN score may pass (the
    // vector max may drop it): its exp, so the row's sum, is NaN, as it
    // must be.
    auto kept = hn::FirstN(df, hn::Lanes(df));
    for (int r = 0; r < R; ++r) {
      VF mx = acc[r][0];
      for (int u = 1; u < V; ++u) mx = hn::Max(mx, acc[r][u]);
      const float bound =
          m[r] == kAttnNegInf ? std::numeric_limits<float>::quiet_NaN() : m[r] + kAttnStaleMax;
      kept = hn::And(kept, hn::Le(mx, hn::Set(df, bound)));
    }
    if (hn::AllTrue(df, kept)) {
      // The running maxima stay: p = exp(s - m) <= e^kAttnStaleMax. The
      // branch is predicted, so the exps start without a row maximum.
      for (int r = 0; r < R; ++r) {
        float* srow = s + r * lds + x;
        const VF vm = hn::Set(df, m[r]);
        VF sum = hn::Zero(df);
        for (int u = 0; u < V; ++u) {
          const VF e = ExpUnclamped(df, hn::Sub(acc[r][u], vm));
          hn::Store(e, df, srow + u * n);
          sum = hn::Add(sum, e);
        }
        hn::Store(hn::Add(hn::Load(df, lv + r * n), sum), df, lv + r * n);
      }
      continue;
    }
    // The rows' maxima, then their rescale factors exp(m_old - m_new) in
    // one vector exp (a scalar std::exp per row was 2% of a prefill on a
    // Zen 5): an m_old of -inf gives exactly 0 (as does a difference below
    // -40, where the old terms are below 4e-18 of the new maximum's), NaN
    // stays NaN.
    constexpr std::size_t kLanes = hn::MaxLanes(DF());
    constexpr std::size_t kRowsPadded = (R + kLanes - 1) / kLanes * kLanes;
    HWY_ALIGN float rescale[kRowsPadded];
    float m_new[R];
    for (int r = 0; r < R; ++r) {
      VF mx = acc[r][0];
      for (int u = 1; u < V; ++u) mx = hn::Max(mx, acc[r][u]);
      m_new[r] = std::max(m[r], hn::GetLane(hn::MaxOfLanes(df, mx)));
      rescale[r] = m_new[r] == kAttnNegInf ? 0.0f : m[r] - m_new[r];
    }
    for (std::size_t r = R; r < kRowsPadded; ++r) rescale[r] = 0.0f;
    for (std::int64_t y = 0; y < R; y += n) {
      hn::Store(SafeExp(df, hn::Load(df, rescale + y)), df, rescale + y);
    }
    for (int r = 0; r < R; ++r) {
      float* srow = s + r * lds;
      if (m_new[r] == kAttnNegInf) {  // no finite score yet: P = 0, and a NaN poisons l
        for (int u = 0; u < V; ++u) {
          if (!hn::AllFalse(df, hn::IsNaN(acc[r][u])))
            l[r] = std::numeric_limits<float>::quiet_NaN();
          hn::Store(hn::Zero(df), df, srow + x + u * n);
        }
        continue;
      }
      const float a = rescale[r];
      const VF av = hn::Set(df, a);
      if (a != 1.0f) {  // the block's P so far, to the new maximum
        for (std::int64_t y = 0; y < x; y += n) {
          hn::Store(hn::Mul(av, hn::Load(df, srow + y)), df, srow + y);
        }
      }
      const VF vm = hn::Set(df, m_new[r]);
      VF sum = hn::Zero(df);
      for (int u = 0; u < V; ++u) {
        const VF e = ExpUnclamped(df, hn::Sub(acc[r][u], vm));
        hn::Store(e, df, srow + x + u * n);
        sum = hn::Add(sum, e);
      }
      l[r] *= a;
      hn::Store(hn::MulAdd(av, hn::Load(df, lv + r * n), sum), df, lv + r * n);
      m[r] = m_new[r];
      alpha[r] *= a;
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_SOFTMAX_INL_H_ toggle
