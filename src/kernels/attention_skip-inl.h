// Internal, per instruction set: the blocked forward's flushed tiles
// (attention_fused.cc). A row's p = exp(s - m) is exactly 0 where s - m <
// -40 (ExpUnclamped, ExpFlushed), and a row whose every score in a key
// block is that far below its running maximum m gets nothing from the
// block: m stays, l adds 0, O adds 0 * V. Such a tile of rows skips the
// block's score and P V products, with the same bits as computing them,
// when a bound proves it before any product:
//
//   s = q . k + bias <= |q| max_k |k| + max over the row's visible keys of
//   the bias
//
// (Cauchy-Schwarz on the scaled q row and the block's largest key norm;
// ALiBi's -slope |key - anchor| at the row's nearest visible key), with
// margins for every rounding on the way to s - m (the dot product's, the
// norms', the bias's FMA, the subtraction: together far below the 1e-3
// relative and the 1 absolute used) and one unit of the threshold (-41,
// not -40). The bound needs no trust in the data: a NaN or infinite q, k
// or m fails it (no skip), and a block whose V holds a NaN or infinity
// (0 * inf is NaN, which the products would spread) is never skipped.
//
// For ALiBi the far blocks of the steep heads are where this holds: a head
// of slope 1/2 has its scores at 100 keys' distance 50 below the diagonal's.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_pack-inl.h"
#include "kernels/attention_params.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether the task's tiles may skip flushed blocks: the blocked path with
// no bias or ALiBi added by the score tile (no soft-cap, table or dense
// bias, whose largest value over a block is not at hand), unless the
// call's plan turned it off.
HWY_INLINE bool SkipsFlushedTiles(const AttentionParams& p, const AttentionBlocking& bl,
                                  const AttentionTask& t) {
  if (!bl.skip_flushed || t.direct || t.nh != 1) return false;
  return t.alibi_fold || (p.bias == FusedBias::kNone && p.softcap == 0.0f);
}

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

// The largest |k| among the columns of a packed K^T block (d rows of ld
// floats, ld whole vectors; columns past the block's keys are zero); NaN
// if any column's sum of squares is NaN.
HWY_INLINE float KeyBlockMaxNorm(DF df, const float* HWY_RESTRICT kt, std::int64_t d,
                                 std::int64_t ld) {
  const std::int64_t lanes = AttnLanes(df);
  VF most = hn::Zero(df);
  bool nan = false;
  for (std::int64_t c = 0; c < ld; c += lanes) {
    VF acc = hn::Zero(df);
    for (std::int64_t x = 0; x < d; ++x) {
      const VF v = hn::Load(df, kt + x * ld + c);
      acc = hn::MulAdd(v, v, acc);
    }
    nan = nan || !hn::AllFalse(df, hn::IsNaN(acc));
    most = hn::Max(most, acc);
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return std::sqrt(hn::GetLane(hn::MaxOfLanes(df, most)));
}

// Whether rows [0, keys) of value rows ld elements apart are finite in
// their first n elements (n whole vectors).
template <typename T>
HWY_INLINE bool ValueRowsFinite(DF df, const T* HWY_RESTRICT v, std::int64_t ld, std::int64_t keys,
                                std::int64_t n) {
  const std::int64_t lanes = AttnLanes(df);
  auto finite = hn::FirstN(df, hn::Lanes(df));
  for (std::int64_t c = 0; c < keys; ++c) {
    for (std::int64_t x = 0; x < n; x += lanes) {
      finite = hn::And(finite, hn::IsFinite(LoadWide(df, v + c * ld + x)));
    }
  }
  return hn::AllTrue(df, finite);
}

// Whether every row of [rr, rr + rows) that sees any key of the block
// scores each of them more than 41 below its running maximum (the bound
// above): kmax is the block's largest key norm, w.qnorm the rows' scaled q
// norms, w.alibi_off their ALiBi anchors less the block's first key (with
// `alibi`). `seen`: whether any row sees a key of the block (a tile of
// rows that see none, above a causal diagonal or outside a window, has
// nothing to compute either).
HWY_INLINE bool TileFlushed(const AttentionTask& t, const AttentionWork& w, std::int64_t rr,
                            std::int64_t rows, float kmax, bool alibi, bool& seen) {
  seen = false;
  for (std::int64_t x = rr; x < rr + rows; ++x) {
    const auto i = static_cast<std::size_t>(x);
    const std::int64_t first = w.first[i], lim = w.lim[i];
    if (lim <= first) continue;  // sees none of the block
    seen = true;
    const double m = w.m[x];
    const double dot = static_cast<double>(w.qnorm[i]) * static_cast<double>(kmax) * (1.0 + 1e-3);
    double bias = 0.0;
    if (alibi) {
      const double off = w.alibi_off[x];
      const double lo = static_cast<double>(first), hi = static_cast<double>(lim - 1);
      const double ns = t.neg_slope;
      // -slope |c - off| is largest at the nearest visible key (slope >= 0)
      // or, for a negative slope, at the farthest.
      const double dist = ns <= 0.0 ? std::max({lo - off, off - hi, 0.0})
                                    : std::max(std::abs(lo - off), std::abs(hi - off));
      bias = ns * dist;
    }
    const double upper = dot + bias + 1e-4 * (dot + std::abs(bias) + std::abs(m)) + 1.0;
    if (!(upper < m - 40.0)) return false;  // also for NaN and m = -inf
  }
  return true;
}

// The flushed-tile test of one key block (`keys` keys: the whole block
// where the head's packing is shared, else the rows' largest limit): its
// largest key norm found once per packing, its values' finiteness looked
// at only when a tile would skip, both kept in the head's packing when it
// is shared.
class FlushedBlockTest {
 public:
  FlushedBlockTest(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t kb,
                   std::int64_t keys, const KeyBlockOperands& op, bool on, AttentionWork& w)
      : p_(p), t_(t), op_(op), w_(w), keys_(keys), on_(on) {
    if (!on_) return;
    if (t.use_pack) {
      kb_ = static_cast<std::size_t>(kb);
      float& kmax = w.pack.kmax[kb_];
      if (kmax < 0.0f) kmax = KeyBlockMaxNorm(df, op.kt, p.d, op.ld);  // NaN stays NaN
      kmax_ = kmax;
      v_finite_ = w.pack.v_finite[kb_];
    } else {
      kmax_ = KeyBlockMaxNorm(df, op.kt, p.d, op.ld);
    }
  }

  // Whether rows [rr, rr + rows) of the task skip the block; `seen`:
  // whether any of them sees a key of it.
  bool operator()(std::int64_t rr, std::int64_t rows, bool& seen) const {
    seen = false;
    if (!on_ || !TileFlushed(t_, w_, rr, rows, kmax_, t_.alibi_fold, seen)) return false;
    if (v_finite_ < 0) {
      v_finite_ = ValuesFinite() ? 1 : 0;
      if (t_.use_pack) w_.pack.v_finite[kb_] = v_finite_;
    }
    return v_finite_ == 1;
  }

 private:
  bool ValuesFinite() const {
    const DF df;
    if (op_.v_rows == nullptr)
      return ValueRowsFinite(df, op_.vp, AttnRoundUp(df, p_.d), keys_, AttnRoundUp(df, p_.d));
    switch (p_.kv_dtype) {  // in place: d is whole vectors
      case DType::kBFloat16:
        return ValueRowsFinite(df, static_cast<const bfloat16*>(op_.v_rows), op_.ldv, keys_, p_.d);
      case DType::kFloat16:
        return ValueRowsFinite(df, static_cast<const float16*>(op_.v_rows), op_.ldv, keys_, p_.d);
      default:
        return ValueRowsFinite(df, static_cast<const float*>(op_.v_rows), op_.ldv, keys_, p_.d);
    }
  }

  const AttentionParams& p_;
  const AttentionTask& t_;
  const KeyBlockOperands& op_;
  AttentionWork& w_;
  std::int64_t keys_;
  bool on_;
  std::size_t kb_ = 0;
  float kmax_ = 0.0f;
  mutable signed char v_finite_ = -1;
};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_ toggle
