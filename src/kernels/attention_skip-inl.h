// Internal, per instruction set: the blocked forward's flushed tiles
// (attention_fused.cc). A row's p = exp(s - m) is exactly 0 where s - m <
// -40 (ExpUnclamped, ExpFlushed), and a row whose every score in a key
// block is that far below its running maximum m gets nothing from the
// block: m stays, l adds 0, O adds 0 * V. Such a tile of rows skips the
// block's score and P V products, with the same bits as computing them,
// when a bound proves it before any product (attention_flush_bound-inl.h:
// |q| max_k |k| plus the row's largest bias, with margins for every
// rounding on the way to s - m; a NaN or infinite q, k or m fails it). A
// block whose V holds a NaN or infinity (0 * inf is NaN, which the
// products would spread) is never skipped.
//
// For ALiBi the far blocks of the steep heads are where this holds: a head
// of slope 1/2 has its scores at 100 keys' distance 50 below the diagonal's.
// Also here: which of the score tile's two softmax paths a tile of rows
// takes (SoftmaxOnRegisters), which the skip must mirror.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_flush_bound-inl.h"
#include "kernels/attention_fused.h"     // count_block_norms
#include "kernels/attention_pack-inl.h"  // KeyRowAt, PackRow
#include "kernels/attention_params.h"
#include "kernels/attention_task-inl.h"
#include "kernels/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// What rows [rr, rr + R) of a block reach: the most keys any sees, whether
// each sees it from its first key, and whether each sees all cols.
struct TileReach {
  std::int64_t most = 0;
  bool from_first = true, whole = true;
};

template <int R>
HWY_INLINE TileReach ReachOf(const AttentionWork& w, std::int64_t rr, std::int64_t cols) {
  TileReach tr;
  for (std::int64_t x = rr; x < rr + R; ++x) {
    tr.most = std::max(tr.most, w.lim[static_cast<std::size_t>(x)]);
    tr.from_first = tr.from_first && w.first[static_cast<std::size_t>(x)] == 0;
    tr.whole = tr.whole && w.lim[static_cast<std::size_t>(x)] == cols;
  }
  return tr;
}

// Whether ScoreRowTile (attention_fused.cc) does the rows' softmax update
// on its registers (QKSoftmaxTile; else SoftmaxRows follows, which first folds each row's partial
// sums into its l, so a flushed tile that skips the block folds them too).
template <int R>
HWY_INLINE bool SoftmaxOnRegisters(const AttentionParams& p, const AttentionTask& t,
                                   const TileReach& tr, std::int64_t cols) {
  // The tile's chunk: kAttnVecs vectors of keys (the 64-key block on
  // AVX-512, 16 keys on AVX2).
  const std::int64_t chunk = kAttnVecs * AttnLanes(DF());
  if (cols % chunk != 0 || p.key_mask != nullptr || !tr.from_first || tr.most <= 0 ||
      p.bias == FusedBias::kDense || t.nh != 1) {
    return false;
  }
  if (tr.whole && (p.softcap == 0.0f || cols == chunk)) return true;
  return R == kFwdRows && p.softcap == 0.0f;
}

// Whether the task's tiles may skip flushed blocks: the blocked path with
// no bias or ALiBi, soft-capped or not (not a table or a dense bias, whose
// largest value over a block is not at hand), unless the call's plan
// turned it off.
HWY_INLINE bool SkipsFlushedTiles(const AttentionParams& p, const AttentionBlocking& bl,
                                  const AttentionTask& t) {
  if (!bl.skip_flushed || t.direct || t.nh != 1) return false;
  return p.bias == FusedBias::kNone || p.bias == FusedBias::kAlibi;
}

// The row of key (or value) c0 + c + 24 into the caches, when it is in the
// block and its elements are contiguous: the rows lie a kv head's stride
// apart (4 KiB and more), where the hardware's prefetchers lose them.
HWY_INLINE void PrefetchRowAhead(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                                 std::int64_t c, std::int64_t keys, bool values) {
  constexpr std::int64_t kAhead = 24;
  if (c + kAhead >= keys || (values ? p.v_stride[3] : p.k_stride[3]) != 1) return;
  const char* row =
      static_cast<const char*>(values ? p.v : p.k) +
      static_cast<std::size_t>(KeyRowAt(p, t, c0 + c + kAhead, values)) * dtype_size(p.kv_dtype);
  const std::int64_t bytes = p.d * static_cast<std::int64_t>(dtype_size(p.kv_dtype));
  for (std::int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(row + b);
}

// Row c of the block's keys (values with `values`) read where it is, in
// its dtype: f(v) for each vector of its d elements widened to float32 (d
// whole vectors and contiguous elements), else through the d floats of
// `row` (PackRow), then f over its vectors and `tail` over the rest.
template <class F, class Tail>
HWY_INLINE void ScanRow(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t c,
                        bool values, float* HWY_RESTRICT row, const F& f, const Tail& tail) {
  const std::int64_t lanes = AttnLanes(df), d = p.d;
  const void* base = values ? p.v : p.k;
  const std::int64_t at = KeyRowAt(p, t, c, values),
                     stride = values ? p.v_stride[3] : p.k_stride[3];
  if (stride == 1 && d % lanes == 0) {
    const auto scan = [&](const auto* src) {
      for (std::int64_t x = 0; x < d; x += lanes) f(LoadWide(df, src + x));
    };
    VisitKvType(p.kv_dtype, [&](auto tag) { scan(static_cast<const decltype(tag)*>(base) + at); });
    return;
  }
  PackRow(base, p.kv_dtype, at, stride, d, 1.0f, row);
  std::int64_t x = 0;
  for (; x + lanes <= d; x += lanes) f(hn::LoadU(df, row + x));
  for (; x < d; ++x) tail(row[x]);
}

// The largest |k| among the block's keys [c0, c0 + keys) that are not
// masked, read where they are (any dtype, stride, dense or paged layout);
// NaN if any is NaN.
HWY_INLINE float KeyRowsMaxNorm(DF df, const AttentionParams& p, const AttentionTask& t,
                                std::int64_t c0, std::int64_t keys, const AttentionWork& w,
                                float* HWY_RESTRICT row) {
  VF most = hn::Zero(df);
  bool nan = false;
  for (std::int64_t c = 0; c < keys; ++c) {
    PrefetchRowAhead(p, t, c0, c, keys, false);
    if (p.key_mask != nullptr && w.keep[c] == 0.0f) continue;
    VF acc = hn::Zero(df);
    float rest = 0.0f;
    ScanRow(
        df, p, t, c0 + c, false, row, [&](VF v) { acc = hn::MulAdd(v, v, acc); },
        [&](float x) { rest += x * x; });
    const VF sum = hn::Add(hn::SumOfLanes(df, acc), hn::Set(df, rest));
    nan = nan || !hn::AllFalse(df, hn::IsNaN(sum));
    most = hn::Max(most, sum);
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return std::sqrt(hn::GetLane(most));
}

// Whether the block's value rows [c0, c0 + keys) that are not masked are
// finite, read as KeyRowsMaxNorm reads the keys.
HWY_INLINE bool ValueRowsFinite(DF df, const AttentionParams& p, const AttentionTask& t,
                                std::int64_t c0, std::int64_t keys, const AttentionWork& w,
                                float* HWY_RESTRICT row) {
  auto finite = hn::FirstN(df, hn::Lanes(df));
  bool rest = true;
  for (std::int64_t c = 0; c < keys; ++c) {
    PrefetchRowAhead(p, t, c0, c, keys, true);
    if (p.key_mask != nullptr && w.keep[c] == 0.0f) continue;
    ScanRow(
        df, p, t, c0 + c, true, row, [&](VF v) { finite = hn::And(finite, hn::IsFinite(v)); },
        [&](float x) { rest = rest && std::isfinite(x); });
  }
  return rest && hn::AllTrue(df, finite);
}

// The largest |k| among the keys of a packed K^T [d][ld] (every column:
// those past the block's keys, and masked keys, are zeros); NaN if any
// norm is NaN. Vectors of keys, so no horizontal sum per key.
HWY_INLINE float PackedKeysMaxNorm(DF df, const float* HWY_RESTRICT kt, std::int64_t ld,
                                   std::int64_t d) {
  const std::int64_t lanes = AttnLanes(df);
  VF most = hn::Zero(df);
  auto nan = hn::FirstN(df, 0);
  for (std::int64_t c = 0; c < ld; c += lanes) {
    VF acc = hn::Zero(df);
    for (std::int64_t x = 0; x < d; ++x) {
      const VF v = hn::Load(df, kt + x * ld + c);
      acc = hn::MulAdd(v, v, acc);
    }
    nan = hn::Or(nan, hn::IsNaN(acc));
    most = hn::Max(most, acc);
  }
  if (!hn::AllFalse(df, nan)) return std::numeric_limits<float>::quiet_NaN();
  return std::sqrt(hn::GetLane(hn::MaxOfLanes(df, most)));
}

// Row x's headroom over the block (FlushHeadroom) from its running maximum
// m and its largest bias: ALiBi's at the row's nearest (or, for a negative
// slope, farthest) visible key, w.alibi_off holding the rows' anchors less
// the block's first key.
HWY_INLINE double RowHeadroom(const AttentionTask& t, const AttentionWork& w, std::int64_t x,
                              bool alibi) {
  const auto i = static_cast<std::size_t>(x);
  const double bias =
      alibi ? AlibiBiasMax(t.neg_slope, static_cast<double>(w.first[i]),
                           static_cast<double>(w.lim[i] - 1), static_cast<double>(w.alibi_off[x]))
            : 0.0;
  return FlushHeadroom(w.m[x], bias);
}

// Whether every row of [rr, rr + rows) that sees any key of the block
// scores each of them more than 41 below its running maximum: its q . k
// bound within its headroom (need, RowHeadroom; DotWithinHeadroom), kmax
// the block's largest key norm, w.qnorm the rows' scaled q norms. `seen`:
// whether any row sees a key of the block (a tile of rows that see none,
// above a causal diagonal or outside a window, has nothing to compute
// either).
HWY_INLINE bool TileFlushed(const AttentionWork& w, const double* need, std::int64_t rr,
                            std::int64_t rows, float kmax, float softcap, bool& seen) {
  seen = false;
  for (std::int64_t x = rr; x < rr + rows; ++x) {
    const auto i = static_cast<std::size_t>(x);
    if (w.lim[i] <= w.first[i]) continue;  // sees none of the block
    seen = true;
    if (!DotWithinHeadroom(w.qnorm[i], kmax, softcap, need[x])) return false;
  }
  return true;
}

// Where a call's keys are laid out by position (a paged or slab cache, a
// packed batch, a dense [b, len, hk, d] view: the hk rows of a key position
// side by side, hk * d elements), the test's reads of one kv head's rows (d
// elements of every hk * d) leave the hardware's stream prefetchers nothing
// to follow, where reading whole positions is a stream. On a Xeon (family
// 6 model 167, two threads) the test's scans read 13.8-15.3 GB/s a kv head
// at a time, 22.8 over whole positions, and 20.7-21.5 over a kv head's rows
// laid one after another; with its blocks measured here the bench's paged
// append took 0.93x the time (docs/performance-notes.md, forty-second
// round). So, before the tasks, the key blocks that most kv heads will test
// in place are measured for every kv head from whole positions: with
// ALiBi, a block at least kFlushDistance / slope from every query of its
// sequence for three quarters of the kv heads (each with its steepest
// slope; the bias alone puts such a block's scores 41 below the
// diagonal's, and no query computes it, so no packing holds its norms). A
// prefill, whose queries span its keys, computes every block near some
// query: nothing is measured. The tasks' tests (FlushedBlockTest) take the
// table's entries. The price: a kv head that would not have tested a
// measured block had its rows read for nothing (at most a quarter of
// them), and where the bound fails after all (keys of large norm) the
// block's values were read here and are read again to compute it. Returns
// whether any block was measured.
constexpr double kFlushDistance = 41.0;

// A key norm not measured (norms are >= 0 or NaN).
constexpr float kNormUnknown = -1.0f;

// Key rows [c0, c1) of sequence t0.bb, every kv head (t0: the sequence's
// kv head 0), of element type T: each kv head's largest key norm and
// whether its value rows are finite, into the table's entries of block kb.
template <typename T>
void MeasureBlockNorms(const AttentionParams& p, const AttentionTask& t0, std::int64_t c0,
                       std::int64_t c1, std::int64_t kb, float* HWY_RESTRICT most,
                       char* HWY_RESTRICT finite, BlockNormTable& table) {
  const DF df;
  const std::int64_t lanes = AttnLanes(df), d = p.d, hk = p.hk;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  std::fill(most, most + hk, 0.0f);
  std::fill(finite, finite + hk, 1);
  for (std::int64_t c = c0; c < c1; ++c) {
    const T* krow = k + KeyRowAt(p, t0, c, false);
    const T* vrow = v + KeyRowAt(p, t0, c, true);
    for (std::int64_t g = 0; g < hk; ++g) {
      VF acc = hn::Zero(df);
      auto ok = hn::FirstN(df, hn::Lanes(df));
      for (std::int64_t x = 0; x < d; x += lanes) {
        const VF kv = LoadWide(df, krow + g * d + x);
        acc = hn::MulAdd(kv, kv, acc);
        ok = hn::And(ok, hn::IsFinite(LoadWide(df, vrow + g * d + x)));
      }
      const float sum = hn::GetLane(hn::SumOfLanes(df, acc));
      float& m = most[g];
      m = std::isnan(sum) || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN()
                                           : std::max(m, sum);
      if (!hn::AllTrue(df, ok)) finite[g] = 0;
    }
  }
  for (std::int64_t g = 0; g < hk; ++g) {
    const auto at = static_cast<std::size_t>((t0.bb * hk + g) * table.nkb + kb);
    table.kmax[at] = std::sqrt(most[g]);  // NaN stays NaN
    table.v_finite[at] = finite[g] != 0 ? 1 : 0;
  }
}

bool FillBlockNorms(const AttentionParams& p, const AttentionBlocking& bl, bool parallel,
                    BlockNormTable& table) {
  const std::int64_t d = p.d, hk = p.hk;
  const bool by_position = p.k_stride[3] == 1 && p.v_stride[3] == 1 && p.k_stride[1] == d &&
                           p.v_stride[1] == d && p.k_stride[2] == hk * d && p.v_stride[2] == hk * d;
  const bool dtype = p.kv_dtype == DType::kFloat32 || p.kv_dtype == DType::kBFloat16 ||
                     p.kv_dtype == DType::kFloat16;
  if (!bl.skip_flushed || p.bias != FusedBias::kAlibi || bl.hg != 1 || hk < 2 ||
      p.key_mask != nullptr || !by_position || !dtype || d % AttnLanes(DF()) != 0) {
    return false;
  }
  // The blocks to measure: s * nkb + kb for key block kb of sequence s.
  const char* what = "the flushed tiles' table of measured key blocks";
  std::vector<std::int64_t> units;
  std::vector<double> steep;
  resize_scratch(units, p.b * bl.nkb, what, std::int64_t{0});
  resize_scratch(steep, hk, what, 0.0);
  std::int64_t n = 0;
  const std::int64_t group = p.h / hk;
  for (std::int64_t s = 0; s < p.b; ++s) {
    const Sequence sq = sequence(p, s);
    if (sq.i <= kDirectRows || sq.j == 0) continue;  // decode tasks do not test
    for (std::int64_t g = 0; g < hk; ++g) {
      float most = 0.0f;
      for (std::int64_t x = g * group; x < (g + 1) * group; ++x) {
        most = std::max(most, slope_of(p, s, x));
      }
      steep[static_cast<std::size_t>(g)] = most;
    }
    const std::int64_t q0 = sq.q_offset, q1 = sq.q_offset + sq.i - 1;
    const std::int64_t begin = visible_keys(p, sq.j, q0).begin;
    const std::int64_t end = visible_keys(p, sq.j, q1).end;
    for (std::int64_t kb = std::max<std::int64_t>(begin, 0) / bl.bk; kb * bl.bk < end; ++kb) {
      const std::int64_t c0 = kb * bl.bk, c1 = std::min(c0 + bl.bk, sq.j);
      const auto dist = static_cast<double>(std::max<std::int64_t>({0, q0 - (c1 - 1), c0 - q1}));
      std::int64_t far = 0;
      for (const double sl : steep) far += sl * dist >= kFlushDistance ? 1 : 0;
      if (4 * far >= 3 * hk) units[static_cast<std::size_t>(n++)] = s * bl.nkb + kb;
    }
  }
  if (n == 0) return false;
  table.nkb = bl.nkb;
  resize_scratch(table.kmax, p.b * hk * bl.nkb, what, kNormUnknown);
  resize_scratch(table.v_finite, p.b * hk * bl.nkb, what, static_cast<signed char>(-1));
  // Each thread's running maxima and finiteness, one per kv head (made
  // here: an allocation must not fail inside the parallel region).
  const int threads = parallel ? omp_get_max_threads() : 1;
  std::vector<float> most;
  std::vector<char> finite;
  resize_scratch(most, threads * hk, what, 0.0f);
  resize_scratch(finite, threads * hk, what, static_cast<char>(1));
#pragma omp parallel for schedule(dynamic, 4) if (parallel)
  for (std::int64_t u = 0; u < n; ++u) {
    const std::int64_t s = units[static_cast<std::size_t>(u)] / bl.nkb;
    const std::int64_t kb = units[static_cast<std::size_t>(u)] % bl.nkb;
    const AttentionTask t0 = DescribeTask(p, bl, s, 0, 1, 0);
    const std::int64_t c0 = kb * bl.bk, c1 = std::min(c0 + bl.bk, t0.sq.j);
    const std::size_t mine = static_cast<std::size_t>(omp_get_thread_num() * hk);
    float* m = most.data() + mine;
    char* f = finite.data() + mine;
    VisitKvType(p.kv_dtype, [&](auto tag) {
      MeasureBlockNorms<decltype(tag)>(p, t0, c0, c1, kb, m, f, table);
    });
  }
  count_block_norms(n);
  return true;
}

// The flushed-tile test of one key block [c0, c0 + keys) (the whole block
// where the head's packing is shared, else up to the rows' largest limit),
// before the block is packed: its largest key norm and its values'
// finiteness are looked at only when a tile would skip without them, from
// the block's packing where there is one (contiguous, and in the caches:
// PackedKeysMaxNorm, PackedValuesFinite), else from the rows in place
// (kept in the head's packing when it is shared). The rows' ALiBi anchors
// (BlockRowBias) are set for the block.
class FlushedBlockTest {
 public:
  FlushedBlockTest(const AttentionParams& p, const AttentionTask& t, const AttentionBlocking& bl,
                   std::int64_t kb, std::int64_t c0, std::int64_t keys, bool on, AttentionWork& w)
      : p_(p), t_(t), w_(w), kb_(static_cast<std::size_t>(kb)), c0_(c0), keys_(keys), on_(on) {
    if (!on_) return;
    if (t.use_pack) {
      kmax_ = w.pack.kmax[kb_];
      v_finite_ = w.pack.v_finite[kb_];
      if (w.pack.ready[kb_]) {  // an earlier task of the kv head packed it
        const HeadPackPlace place = HeadPackBlock(p, bl, kb, w);
        Packed(place.kt, bl.bkp, t.v_in_place ? nullptr : place.v, bl.dp);
      }
    }
    if (bl.norms != nullptr) {  // measured before the tasks (FillBlockNorms)
      const auto at = static_cast<std::size_t>(t.head * bl.norms->nkb + kb);
      if (kmax_ == kUnknown) kmax_ = bl.norms->kmax[at];
      if (v_finite_ < 0) v_finite_ = bl.norms->v_finite[at];
    }
    // Each row's headroom, once for the block: a row's m moves only when
    // its own tile computes the block, after its tests.
    const bool alibi = p.bias == FusedBias::kAlibi;
    for (std::int64_t x = 0; x < t.rows; ++x) {
      const auto i = static_cast<std::size_t>(x);
      if (w.lim[i] > w.first[i]) w.need[i] = RowHeadroom(t, w, x, alibi);
    }
  }

  // The block's packed K^T [d][ld] and V [keys][dp] (null: V is read in
  // place), for the tests still to come.
  void Packed(const float* kt, std::int64_t ld, const float* vp, std::int64_t dp) {
    kt_ = kt;
    ld_ = ld;
    vp_ = vp;
    dp_ = dp;
  }

  // Whether rows [rr, rr + rows) of the task skip the block; `seen`:
  // whether any of them sees a key of it.
  bool operator()(std::int64_t rr, std::int64_t rows, bool& seen) const {
    seen = false;
    if (!on_) return false;
    const double* need = w_.need.data();
    // No key norm helps a tile that fails the bound with q . k <= 0.
    if (!TileFlushed(w_, need, rr, rows, 0.0f, p_.softcap, seen)) return false;
    if (kmax_ == kUnknown) {
      kmax_ = kt_ != nullptr ? PackedKeysMaxNorm(DF(), kt_, ld_, p_.d)
                             : KeyRowsMaxNorm(DF(), p_, t_, c0_, keys_, w_, w_.row.get());
      if (t_.use_pack) w_.pack.kmax[kb_] = kmax_;
    }
    if (!TileFlushed(w_, need, rr, rows, kmax_, p_.softcap, seen)) return false;
    if (v_finite_ < 0) {
      const bool finite = vp_ != nullptr
                              ? PackedValuesFinite(DF(), vp_, keys_, dp_)
                              : ValueRowsFinite(DF(), p_, t_, c0_, keys_, w_, w_.row.get());
      v_finite_ = finite ? 1 : 0;
      if (t_.use_pack) w_.pack.v_finite[kb_] = v_finite_;
    }
    return v_finite_ == 1;
  }

  static constexpr float kUnknown = kNormUnknown;

 private:
  const AttentionParams& p_;
  const AttentionTask& t_;
  AttentionWork& w_;
  std::size_t kb_;
  std::int64_t c0_, keys_;
  bool on_;
  const float* kt_ = nullptr;
  std::int64_t ld_ = 0;
  const float* vp_ = nullptr;
  std::int64_t dp_ = 0;
  mutable float kmax_ = kUnknown;
  mutable signed char v_finite_ = -1;
};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_SKIP_INL_H_ toggle
