// The fused attention kernel, compiled once per instruction set by Highway
// and chosen at run time (HWY_DYNAMIC_DISPATCH). See attention_fused.h.
//
// Shape of the computation (FlashAttention-2): a task owns one (batch, head,
// query block) and walks the key blocks it can see, keeping per row a
// running max m, a running sum l and a float32 accumulator O rescaled by
// exp(m_old - m_new) whenever the max grows. Per key block:
//
//   1. pack K^T (d x block_k) and V (block_k x d) into float32 buffers
//      (converting 16-bit inputs exactly and gathering strided rows once);
//   2. S = (scale q) K^T with a register-tiled micro-kernel (R rows x V
//      vectors of keys, broadcast-FMA over d); ALiBi is added as the tile
//      is stored (-slope |distance|, one FMA per vector, no extra pass);
//   3. one pass per row adds any other bias (a forward window of the
//      reversed distance table, or the dense tensor; ALiBi on the decode
//      path), masks the keys the row cannot see, takes the max; a second
//      pass forms p = exp(s - m) and its sum;
//   4. O = alpha O + P V with a second micro-kernel (R rows x V vectors of
//      d, broadcast-FMA over keys).
//
// Decode (at most 4 query rows per head) takes a direct path instead: S by
// dot products over the key rows in place (nothing transposed), and with
// grouped-query attention one task holds the rows of several query heads
// of one kv head, so each key and value row is read once for all of them.
//
// Each row multiplies only the keys it can see (per-row key limits in step
// 4), so a NaN in a masked value never reaches it. Causal key blocks past
// a query block's last visible key are never visited.
//
// Our own micro-kernels rather than sgemm on blocks: the blocks are small
// (256 x 64 x d), the product with V needs per-row key limits for the mask,
// and packing already happens for the dtype conversion; this keeps the
// library free of a BLAS dependency.

// The per-block steps (packing, the score tile, bias and mask, the online
// softmax update, the P V product) are in attention_blocks-inl.h, shared
// with the backward; the blocked path's key block operands (K^T and V
// packed, or V in place) in attention_pack-inl.h; the visible keys and the
// key blocks a query block visits in attention_params.h; the call's plan
// (blocking, the task list, how the threads share it) in
// attention_plan-inl.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_fused.cc"
// foreach_target.h before any other Highway header (math-inl.h includes
// highway.h): otherwise clang compiles the static target twice. The
// clang-format guard keeps include sorting from moving it.
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// clang-format on
#include "kernels/attention_fused.h"

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_decode-inl.h"
#include "kernels/attention_pack-inl.h"
#include "kernels/attention_plan-inl.h"
#include "kernels/attention_skip-inl.h"
#include "kernels/attention_softmax-inl.h"
#include "kernels/attention_task-inl.h"
#include "kernels/decode_prefetch.h"
#include "kernels/float_store.h"
#include "kernels/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The task's query rows times scale into w.q, and a fresh softmax state.
void StartTask(const AttentionParams& p, const AttentionBlocking& bl, const AttentionTask& t,
               AttentionWork& w) {
  const std::int64_t d = p.d;
  for (std::int64_t x = 0; x < t.rows; ++x) {
    PackRow(p.q, p.dtype,
            t.bb * p.q_stride[0] + (t.hh + x / t.br) * p.q_stride[1] +
                (t.sq.q_row0 + t.r0 + x % t.br) * p.q_stride[2],
            p.q_stride[3], d, p.scale, w.q.get() + x * d);
    w.qnorm[static_cast<std::size_t>(x)] = RowNorm(DF(), w.q.get() + x * d, d);
    // bfloat16 key rows read in place are read in pair order (DecLoadVec).
    if (DecRowsPaired(p, t, false)) {
      DecPairOrder<bfloat16>(w.q.get() + x * d, d, true);
    }
    const KeyRange kr = visible_keys(p, t.sq.j, TaskPosition(t, t.r0 + x % t.br));
    w.vis_begin[static_cast<std::size_t>(x)] = kr.begin;
    w.vis_end[static_cast<std::size_t>(x)] = kr.end;
    w.vis_begin_max = x == 0 ? kr.begin : std::max(w.vis_begin_max, kr.begin);
    w.vis_end_min = x == 0 ? kr.end : std::min(w.vis_end_min, kr.end);
    w.m[x] = kAttnNegInf;
    w.l[x] = 0.0f;
    hn::Store(hn::Zero(DF()), DF(), w.lv.get() + x * AttnLanes(DF()));
  }
  std::fill(w.o.get(), w.o.get() + t.rows * bl.dp, 0.0f);
  if (!t.use_pack) return;
  if (!w.pack.kt) {
    w.pack.kt =
        allocate_scratch<float>(bl.nkb * d * bl.bkp, "the attention's packed K^T of a head");
    w.pack.v =
        allocate_scratch<float>(bl.nkb * bl.bk * bl.dp, "the attention's packed V of a head");
    w.pack.ready.assign(static_cast<std::size_t>(bl.nkb), 0);
    w.pack.kmax.assign(static_cast<std::size_t>(bl.nkb), FlushedBlockTest::kUnknown);
    w.pack.v_finite.assign(static_cast<std::size_t>(bl.nkb), -1);
  }
  if (w.pack.head != t.head) {
    w.pack.head = t.head;
    std::fill(w.pack.ready.begin(), w.pack.ready.end(), 0);
    std::fill(w.pack.kmax.begin(), w.pack.kmax.end(), FlushedBlockTest::kUnknown);
    std::fill(w.pack.v_finite.begin(), w.pack.v_finite.end(), -1);
  }
}

// Visible keys [first, lim) of each row in the block [c0, c0 + bc) (as
// offsets from c0; both 0 when none) into w.first, w.lim, from the rows'
// visible keys that StartTask found; returns the largest lim.
std::int64_t BlockLimits(const AttentionTask& t, std::int64_t c0, std::int64_t bc,
                         AttentionWork& w) {
  const auto rows = static_cast<std::ptrdiff_t>(t.rows);
  if (w.vis_begin_max <= c0 && w.vis_end_min >= c0 + bc) {  // every row sees the whole block
    std::fill(w.lim.begin(), w.lim.begin() + rows, bc);
    std::fill(w.first.begin(), w.first.begin() + rows, 0);
    return bc;
  }
  std::int64_t max_lim = 0;
  for (std::size_t x = 0; x < static_cast<std::size_t>(t.rows); ++x) {
    std::int64_t lim = std::clamp<std::int64_t>(w.vis_end[x] - c0, 0, bc);
    std::int64_t first = std::clamp<std::int64_t>(w.vis_begin[x] - c0, 0, bc);
    if (lim <= first) lim = first = 0;
    w.lim[x] = lim;
    w.first[x] = first;
    max_lim = std::max(max_lim, lim);
  }
  return max_lim;
}

// The key mask of the block [c0, c0 + bc) into w.keep (1 attend, 0 masked;
// zeros up to a whole vector); returns whether any key is attended.
bool BlockKeep(const AttentionParams& p, const AttentionTask& t, std::int64_t c0, std::int64_t bc,
               std::int64_t bcp, AttentionWork& w) {
  bool any = false;
  for (std::int64_t c = 0; c < bc; ++c) {
    const bool on = !KeyMasked(p, t, c0 + c);
    w.keep[c] = on ? 1.0f : 0.0f;
    any = any || on;
  }
  for (std::int64_t c = bc; c < bcp; ++c) w.keep[c] = 0.0f;
  return any;
}

// O = alpha O + P V for rows [rr, rr + R) of the task over the block.
template <int R>
HWY_INLINE void PVRowTile(DF df, const AttentionParams& p, const AttentionBlocking& bl,
                          const KeyBlockOperands& op, std::int64_t rr, std::int64_t cols,
                          AttentionWork& w) {
  if (op.v_rows == nullptr) {
    PVRows<R, kAttnVecs>(df, w, rr, w.s.get(), cols, op.vp, bl.dp, bl.dp);
    return;
  }
  VisitKvType(p.kv_dtype, [&](auto tag) {
    PVRows<R, kAttnVecs>(df, w, rr, w.s.get(), cols, static_cast<const decltype(tag)*>(op.v_rows),
                         op.ldv, bl.dp);
  });
}

// S = (scale q) K^T for rows [rr, rr + R) over the keys they can see (on
// the causal diagonal that halves the product). Where the block is whole
// chunks of the register tile (kAttnVecs vectors of keys) and every row
// sees all of it, the scores need no pass of their own (no mask, window
// edge or dense bias; ALiBi, a distance table and, in one chunk, a
// soft-cap are applied on the registers): the tile also does the rows'
// softmax update on its registers (and returns true); else SoftmaxRows
// follows. So does the main tile where each row sees the block from its
// first key up to its own last (the causal diagonal), over the vectors
// its rows reach, the keys past each row's last masked on the registers.
template <int R>
HWY_INLINE bool ScoreRowTile(DF df, const AttentionParams& p, const AttentionTask& t,
                             const KeyBlockOperands& op, std::int64_t rr, std::int64_t cols,
                             AttentionWork& w) {
  const std::int64_t d = p.d, n = AttnLanes(df);
  const AlibiFold fold{w.alibi_off.get() + rr, t.neg_slope};
  float* srow = w.s.get() + rr * cols;
  const TileReach tr = ReachOf<R>(w, rr, cols);
  const std::int64_t most = tr.most;
  const bool whole = tr.whole;
  const std::int64_t chunk = kAttnVecs * n;
  if (SoftmaxOnRegisters<R>(p, t, tr, cols)) {  // every branch below returns true
    float* m = w.m.get() + rr;
    float* l = w.l.get() + rr;
    float* lv = w.lv.get() + rr * n;
    float* alpha = w.alpha.get() + rr;
    const std::int64_t* lim = w.lim.data() + rr;
    const TileBias tb{fold, w.table_rows.data() + rr};
    // `chunks` chunks of V vectors of keys (the first chunks V n) with the
    // call's bias; the tags are std::integral_constant.
    const auto tile = [&](auto vecs, auto cap_tag, auto partial_tag, std::int64_t chunks) {
      const auto run = [&](auto kind_tag) {
        QKSoftmaxTile<R, decltype(vecs)::value, decltype(kind_tag)::value, decltype(cap_tag)::value,
                      decltype(partial_tag)::value>(df, w.q.get() + rr * d, d, d, op.kt, op.ld,
                                                    srow, cols, tb, p.softcap, lim, chunks, m, l,
                                                    lv, alpha);
      };
      switch (p.bias) {
        case FusedBias::kAlibi:
          run(std::integral_constant<FusedBias, FusedBias::kAlibi>());
          break;
        case FusedBias::kTable:
          run(std::integral_constant<FusedBias, FusedBias::kTable>());
          break;
        default:
          run(std::integral_constant<FusedBias, FusedBias::kNone>());
          break;
      }
    };
    const std::true_type yes;
    const std::false_type no;
    const std::integral_constant<int, kAttnVecs> all;
    const std::int64_t chunks = cols / chunk;
    if (whole && p.softcap == 0.0f) {
      tile(all, no, no, chunks);
      return true;
    }
    // Soft-capped, only in one chunk: on AVX2 the capped chunk (twelve
    // accumulators and the tanh's constants in sixteen registers) took
    // 0.48-0.50 over the plain call, the stored path 0.27-0.33 (Zen 3).
    if (whole && chunks == 1) {
      tile(all, yes, no, chunks);
      return true;
    }
    // The causal diagonal: the main tile over the vectors its rows reach,
    // without a soft-cap. In one chunk (AVX-512), as many vectors as QKRows
    // would compute: reach is 1 to kAttnVecs (most is 1 to cols), and the
    // row tiles' dispatch turns it into a compile-time count. In several,
    // the chunks the rows reach.
    if constexpr (R == kFwdRows) {
      if (p.softcap == 0.0f) {
        const std::int64_t reach = (most + n - 1) / n;
        if (chunks == 1) {
          RemainderRowTile<kAttnVecs>(reach, 0,
                                      [&](auto vecs, std::int64_t) { tile(vecs, no, yes, 1); });
        } else {
          tile(all, no, yes, (reach + kAttnVecs - 1) / kAttnVecs);
        }
        return true;
      }
    }
  }
  const std::int64_t vis = AttnRoundUp(df, most);
  if (t.alibi_fold) {
    QKRows<R, true>(df, w.q.get() + rr * d, d, d, op.kt, op.ld, vis, srow, cols, fold);
  } else {
    QKRows<R, false>(df, w.q.get() + rr * d, d, d, op.kt, op.ld, vis, srow, cols, fold);
  }
  return false;
}

// The first key block a blocked task visits: the one holding its last
// row's position (clamped to [kb0, kb1)). RunTask walks from it down to kb0,
// then up from the block after it: ALiBi's bias, and so most rows' scores,
// peaks at the row's own position, so a row meets its largest scores early
// and its running maximum rarely moves after (each move rescales the row's
// sum and the block's P so far; left to right, the steep heads' maxima moved
// on most chunks up to the diagonal). Decode tasks keep the ascending walk
// that their prefetching follows. On a Zen 3 (AVX2), the bench's prefill
// shapes alternated call by call in one process, the median call took
// 0.953-0.990 (causal) and 0.981-0.991 (non-causal) of the ascending walk's
// time (docs/performance-notes.md, twenty-first round).
std::int64_t FirstKeyBlock(const AttentionBlocking& bl, const AttentionTask& t, std::int64_t kb0,
                           std::int64_t kb1) {
  if (t.direct || kb1 <= kb0) return kb0;
  const std::int64_t last = std::max<std::int64_t>(TaskPosition(t, t.r0 + t.br - 1), 0);
  return std::clamp<std::int64_t>(last / bl.bk, kb0, kb1 - 1);
}

// The task over key blocks [kb0, kb1), in FirstKeyBlock's order: leaves
// m, l, O (unnormalised) per row in w. A blocked key block goes tile by
// tile: each group of kFwdRows rows takes its scores, its softmax update
// and its P V product in turn (the P V one tile later), while its rows of
// S are in L1 (all the rows'
// scores first, then all the softmax, then all of P V sent the 64 KB of S
// through L2 twice). A tile whose rows a bound proves get p = 0 from every
// key of the block skips it (attention_skip-inl.h: the same bits).
void RunTask(const AttentionParams& p, const AttentionBlocking& bl, const AttentionTask& t,
             std::int64_t kb0, std::int64_t kb1, AttentionWork& w) {
  const DF df;
  StartTask(p, bl, t, w);
  const bool skips = SkipsFlushedTiles(p, bl, t);
  std::int64_t skipped = 0;
  const std::int64_t first = FirstKeyBlock(bl, t, kb0, kb1);
  // Whether the last block step was a direct one (its value pass
  // prefetched this block's key rows: DirectBlock's cross-pass prefetch).
  bool after_direct = false;
  for (std::int64_t step = 0; step < kb1 - kb0; ++step) {
    const bool prefetched = after_direct;
    after_direct = false;  // until a direct step below runs
    const std::int64_t kb = step <= first - kb0 ? first - step : kb0 + step;
    const std::int64_t c0 = kb * bl.bk;
    const std::int64_t bc = std::min(bl.bk, t.sq.j - c0);
    const std::int64_t max_lim = BlockLimits(t, c0, bc, w);
    if (max_lim == 0) continue;
    // A block whose keys are all masked is skipped.
    if (p.key_mask != nullptr && !BlockKeep(p, t, c0, bc, bl.bkp, w)) continue;
    const std::int64_t cols = AttnRoundUp(df, max_lim);
    if (t.direct) {  // in ascending order (FirstKeyBlock)
      const std::int64_t next_c0 = c0 + bl.bk;
      const std::int64_t next_keys =
          kb + 1 < kb1 ? std::max<std::int64_t>(std::min(bl.bk, t.sq.j - next_c0), 0) : 0;
      DirectBlock(df, p, t, bl.dp, c0, max_lim, cols, next_c0, next_keys, !prefetched, w);
      after_direct = true;
      continue;
    }
    BlockRowBias(p, t, c0, w);
    FlushedBlockTest flushed(p, t, bl, kb, c0, t.use_pack ? bc : max_lim, skips, w);
    // A tile the test passes skips the block with the same bits as its
    // products, even l's rounding: where SoftmaxRows would have run, it
    // folds the rows' partial sums.
    const auto fold_skipped = [&](auto rows_tag, std::int64_t rr) {
      constexpr int R = decltype(rows_tag)::value;
      if (!SoftmaxOnRegisters<R>(p, t, ReachOf<R>(w, rr, cols), cols)) {
        for (std::int64_t x = rr; x < rr + R; ++x) FoldRowSums(df, w, x);
      }
    };
    if (skips) {  // a block that every tile skips is not packed either
      bool all = true;
      std::int64_t seen_tiles = 0;
      ForRowTiles<kFwdRows>(t.br, [&](auto rows_tag, std::int64_t rr) {
        bool seen = false;
        all = all && flushed(rr, decltype(rows_tag)::value, seen);
        seen_tiles += seen ? 1 : 0;
      });
      if (all) {
        ForRowTiles<kFwdRows>(t.br, fold_skipped);
        skipped += seen_tiles;
        continue;
      }
    }
    const KeyBlockOperands op = PackedKeyBlock(p, bl, t, kb, max_lim, cols, w);
    flushed.Packed(op.kt, op.ld, op.vp, bl.dp);
    // Software-pipelined by one tile: a tile's P V goes after the next
    // tile's scores and softmax, so that its FMAs do not wait on its own
    // softmax's chain (max, compare, exp, store) and the next tile's score
    // FMAs overlap that chain. Prefill 0.985x and 0.996x the time
    // non-causal, 0.98x causal (a Sapphire Rapids class Xeon, alternated
    // scratch builds, 5 rounds each; docs/performance-notes.md,
    // twenty-seventh round): small, but it cost nothing.
    std::int64_t pending = -1;  // rows [pending, pending + kFwdRows) await P V
    ForRowTiles<kFwdRows>(t.br, [&](auto rows_tag, std::int64_t rr) {
      constexpr int R = decltype(rows_tag)::value;
      bool seen = false;
      if (flushed(rr, R, seen)) {
        fold_skipped(rows_tag, rr);
        skipped += seen ? 1 : 0;
        return;
      }
      if (!ScoreRowTile<R>(df, p, t, op, rr, cols, w))
        SoftmaxRows(df, p, t, c0, cols, rr, rr + R, w);
      if (pending >= 0) PVRowTile<kFwdRows>(df, p, bl, op, pending, cols, w);
      pending = -1;
      if constexpr (R == kFwdRows) {
        pending = rr;
      } else {
        PVRowTile<R>(df, p, bl, op, rr, cols, w);
      }
    });
    if (pending >= 0) PVRowTile<kFwdRows>(df, p, bl, op, pending, cols, w);
  }
  if (skipped > 0) count_flushed_tiles(skipped);
}

// log-sum-exp of a row from its softmax state (max m, sum l of exp(s - m)).
// ALiBi rows before the first key (qpos < 0) were scored from the first
// key's anchor (AlibiAnchor): add back the constant slope * qpos.
float AttentionRowLse(const AttentionParams& p, std::int64_t s, std::int64_t hh, std::int64_t qpos,
                      float m, float l) {
  if (std::isnan(l)) return l;
  if (l == 0.0f || m == kAttnNegInf) return kAttnNegInf;
  float lse = m + std::log(l);
  if (p.bias == FusedBias::kAlibi && qpos < 0) {
    lse += slope_of(p, s, hh) * static_cast<float>(qpos);
  }
  return lse;
}

// Where row x of a task goes: out and lse offsets.
struct AttentionRowPlace {
  std::int64_t s, hh, r, out, lse;
};

AttentionRowPlace RowPlace(const AttentionParams& p, const AttentionTask& t, std::int64_t x) {
  AttentionRowPlace at;
  at.s = t.bb;
  at.hh = t.hh + x / t.br;
  at.r = t.r0 + x % t.br;
  const std::int64_t row = t.sq.q_row0 + at.r;
  at.out = at.s * p.out_stride[0] + at.hh * p.out_stride[1] + row * p.out_stride[2];
  at.lse = at.s * p.lse_stride[0] + at.hh * p.lse_stride[1] + row * p.lse_stride[2];
  return at;
}

// Normalises and stores one finished row (float32 accumulator o, softmax
// state m, l).
void StoreOutputRow(const AttentionParams& p, const AttentionTask& t, std::int64_t x, float* o,
                    float m, float l) {
  const AttentionRowPlace at = RowPlace(p, t, x);
  if (l == 0.0f) std::fill(o, o + p.d, 0.0f);  // no visible key
  store_floats_at(o, static_cast<std::size_t>(p.d), l == 0.0f ? 0.0f : 1.0f / l, p.dtype, p.out,
                  static_cast<std::size_t>(at.out));
  if (p.lse) p.lse[at.lse] = AttentionRowLse(p, at.s, at.hh, TaskPosition(t, at.r), m, l);
}

// Split partial states: [tasks][rows_per_task] m and l, and O with dp
// floats per row.
struct AttentionSplitParts {
  std::vector<float> m, l, o;
};

AttentionTask TaskOf(const AttentionParams& p, const AttentionBlocking& bl,
                     const AttentionTaskRef& ref) {
  return DescribeTask(p, bl, ref.s, ref.slot * bl.hg, bl.hg, ref.qb);
}

// Merges the key splits of every row: M = max m_s, L = sum l_s e^(m_s - M),
// O = sum O_s e^(m_s - M) / L.
void MergeSplits(const AttentionParams& p, const AttentionBlocking& bl,
                 const std::vector<AttentionTaskRef>& list, const AttentionSplitParts& parts,
                 bool parallel) {
  const std::int64_t rows_per_task = bl.hg * bl.bq;
  const auto base_tasks = static_cast<std::int64_t>(list.size());
  const std::int64_t dp = bl.dp;
#pragma omp parallel if (parallel)
  {
    std::vector<float> acc(static_cast<std::size_t>(dp));
#pragma omp for schedule(static)
    for (std::int64_t bt = 0; bt < base_tasks; ++bt) {
      const AttentionTask t = TaskOf(p, bl, list[static_cast<std::size_t>(bt)]);
      for (std::int64_t x = 0; x < t.rows; ++x) {
        const auto part = [&](std::int64_t sp) {
          return static_cast<std::size_t>((bt * bl.splits + sp) * rows_per_task + x);
        };
        float mx = kAttnNegInf;
        for (std::int64_t sp = 0; sp < bl.splits; ++sp) mx = std::max(mx, parts.m[part(sp)]);
        std::fill(acc.begin(), acc.end(), 0.0f);
        float l = 0.0f;
        for (std::int64_t sp = 0; sp < bl.splits; ++sp) {
          // NaN scores seen, maybe no finite one.
          if (std::isnan(parts.l[part(sp)])) l = parts.l[part(sp)];
        }
        if (mx != kAttnNegInf) {
          for (std::int64_t sp = 0; sp < bl.splits; ++sp) {
            const std::size_t at = part(sp);
            if (parts.m[at] == kAttnNegInf) continue;  // this part saw nothing
            const float f = std::exp(parts.m[at] - mx);
            l += parts.l[at] * f;
            const float* po = parts.o.data() + at * static_cast<std::size_t>(dp);
            for (std::int64_t y = 0; y < p.d; ++y) acc[static_cast<std::size_t>(y)] += f * po[y];
          }
        }
        StoreOutputRow(p, t, x, acc.data(), mx, l);
      }
    }
  }
}

// One task of Run: its key blocks, then its rows stored (or its partial
// state kept for the merge of a key split).
void RunOneTask(const AttentionParams& p, const AttentionBlocking& bl,
                const std::vector<AttentionTaskRef>& list, std::int64_t task,
                AttentionSplitParts& parts, AttentionWork& w) {
  const std::int64_t rows_per_task = bl.hg * bl.bq;
  const std::int64_t split = task % bl.splits;
  const AttentionTaskRef& ref = list[static_cast<std::size_t>(task / bl.splits)];
  const AttentionTask t = TaskOf(p, bl, ref);
  const std::int64_t span = ref.kbs.end - ref.kbs.begin;
  RunTask(p, bl, t, ref.kbs.begin + span * split / bl.splits,
          ref.kbs.begin + span * (split + 1) / bl.splits, w);
  for (std::int64_t x = 0; x < t.rows; ++x) {
    FoldRowSums(DF(), w, x);
    // The value pass left O in the read order of bfloat16 value rows read
    // in place (DecLoadVec): back to element order.
    if (DecRowsPaired(p, t, true)) {
      DecPairOrder<bfloat16>(w.o.get() + x * bl.dp, p.d, false);
    }
  }
  if (bl.splits > 1) {
    const std::size_t at = static_cast<std::size_t>(task * rows_per_task);
    std::copy(w.m.get(), w.m.get() + t.rows, parts.m.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(w.l.get(), w.l.get() + t.rows, parts.l.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(w.o.get(), w.o.get() + t.rows * bl.dp,
              parts.o.begin() + static_cast<std::ptrdiff_t>(at * static_cast<std::size_t>(bl.dp)));
    return;
  }
  for (std::int64_t x = 0; x < t.rows; ++x) {
    StoreOutputRow(p, t, x, w.o.get() + x * bl.dp, w.m[x], w.l[x]);
  }
}

// The calling thread's block buffers for a call of these sizes. Kept from
// call to call (per thread, grown to the largest sizes seen, at most
// kKeptWorkBytes): allocating and freeing them on every call cost a small
// decode more than its arithmetic (glibc returned the memory to the kernel
// on free, and each madvise or brk shrink flushed the TLB of both cores:
// 0.5 ms per grouped-query decode call over 1024 keys on a Zen 5 VM, a
// third of it with the other thread waiting). The head packing is
// per call (its size follows the call's keys).
constexpr double kKeptWorkBytes = 4.0 * (1 << 20);

AttentionWork& ThreadAttentionWork(std::int64_t bq, std::int64_t bkp, std::int64_t d,
                                   std::int64_t dp) {
  struct Kept {
    std::unique_ptr<AttentionWork> work;
    std::int64_t bq = 0, bkp = 0, d = 0, dp = 0;
  };
  static thread_local Kept kept;
  static thread_local std::unique_ptr<AttentionWork> once;  // a call too large to keep
  once.reset();                                             // the previous call's, if it was one
  if (kept.work && bq <= kept.bq && bkp <= kept.bkp && d <= kept.d && dp <= kept.dp) {
    kept.work->pack = AttentionHeadPack();
    return *kept.work;
  }
  const std::int64_t nbq = std::max(bq, kept.bq), nbkp = std::max(bkp, kept.bkp);
  const std::int64_t nd = std::max(d, kept.d), ndp = std::max(dp, kept.dp);
  const double bytes = 4.0 * (static_cast<double>(nbq) * static_cast<double>(nd + nbkp + ndp) +
                              static_cast<double>(nbkp) * static_cast<double>(nd + ndp));
  if (bytes > kKeptWorkBytes) {
    once = std::make_unique<AttentionWork>(bq, bkp, d, dp);
    return *once;
  }
  kept.work.reset();
  kept.work = std::make_unique<AttentionWork>(nbq, nbkp, nd, ndp);
  kept.bq = nbq;
  kept.bkp = nbkp;
  kept.d = nd;
  kept.dp = ndp;
  return *kept.work;
}

void Run(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k,
         std::int64_t splits) {
  if (p.b == 0 || p.h == 0 || p.i == 0) return;
  const int threads = omp_get_max_threads();
  // Tasks with one query head each, for the split decision.
  std::int64_t units = 0;
  const std::int64_t bq0 = std::min(block_q, p.i);
  for (std::int64_t s = 0; s < p.b; ++s) units += (sequence(p, s).i + bq0 - 1) / bq0 * p.h;
  AttentionBlocking bl = PlanBlocking(p, block_q, block_k, splits, units, threads);
  const std::vector<AttentionTaskRef> list = ListTasks(p, bl);
  const std::int64_t rows_per_task = bl.hg * bl.bq;
  const std::int64_t tasks = static_cast<std::int64_t>(list.size()) * bl.splits;
  AttentionSplitParts parts;
  if (bl.splits > 1) {
    const char* what = "the attention's key-split partial states";
    resize_scratch(parts.m, tasks * rows_per_task, what, kAttnNegInf);
    resize_scratch(parts.l, tasks * rows_per_task, what, 0.0f);
    resize_scratch(parts.o, tasks * rows_per_task * bl.dp, what, 0.0f);
  }
  double flops = 0.0;
  for (const AttentionTaskRef& t : list) flops += t.cost;
  flops *= static_cast<double>(bl.bk) * static_cast<double>(bl.hg) * static_cast<double>(p.d);
  const bool parallel = tasks > 1 && flops >= 65536.0 && threads > 1;

  // The key blocks most kv heads will test, measured from whole positions.
  BlockNormTable norms;
  if (FillBlockNorms(p, bl, parallel, norms)) bl.norms = &norms;

  // Whole kv heads per thread where each thread packs a head's keys.
  const std::vector<std::int64_t> runs = KvHeadRuns(p, bl, list, parallel ? threads : 1);
  std::vector<std::atomic<std::int64_t>> claimed(runs.empty() ? 0 : runs.size() - 1);
  for (auto& c : claimed) c.store(0, std::memory_order_relaxed);

  // An allocation that fails on a thread is rethrown after the region (an
  // exception must not leave it); every thread still meets the loop.
  ThreadErrors errors;
#pragma omp parallel if (parallel)
  {
    AttentionWork* work = nullptr;
    errors.run([&] { work = &ThreadAttentionWork(rows_per_task, bl.bkp, p.d, bl.dp); });
    const auto one = [&](std::int64_t task) {
      if (errors.failed()) return;
      errors.run([&] { RunOneTask(p, bl, list, task, parts, *work); });
    };
    if (!runs.empty()) {
      ForOwnRunsFirst(runs, claimed, omp_get_thread_num(), omp_get_num_threads(), one);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t task = 0; task < tasks; ++task) one(task);
    }
  }
  errors.rethrow();
  if (bl.splits > 1) MergeSplits(p, bl, list, parts, parallel);
}

// The softmax's exp variants and the soft-cap's tanh over n values (tests).
void SoftmaxExp(SoftmaxExpKind kind, const float* x, float* out, std::int64_t n) {
  const DF df;
  const std::int64_t lanes = AttnLanes(df);
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  for (std::int64_t at = 0; at < n; at += lanes) {
    const std::int64_t count = std::min(lanes, n - at);
    for (std::int64_t u = 0; u < lanes; ++u) buf[u] = u < count ? x[at + u] : 0.0f;
    VF v = hn::Load(df, buf);
    switch (kind) {
      case SoftmaxExpKind::kUnclamped:
        v = ExpUnclamped(df, v);
        break;
      case SoftmaxExpKind::kFlushed:
        v = ExpFlushed(df, v);
        break;
      case SoftmaxExpKind::kSoftcapTanh:
        v = SoftcapTanh(df, v);
        break;
      default:
        v = SafeExp(df, v);
        break;
    }
    hn::Store(v, df, buf);
    for (std::int64_t u = 0; u < count; ++u) out[at + u] = buf[u];
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posbias::detail {

HWY_EXPORT(Run);
HWY_EXPORT(SoftmaxExp);

namespace {
std::atomic<std::int64_t> flushed_tiles{0};
std::atomic<std::int64_t> block_norms{0};
}  // namespace

std::int64_t flushed_tiles_skipped() { return flushed_tiles.load(std::memory_order_relaxed); }

void count_flushed_tiles(std::int64_t tiles) {
  flushed_tiles.fetch_add(tiles, std::memory_order_relaxed);
}

std::int64_t block_norms_measured() { return block_norms.load(std::memory_order_relaxed); }

void count_block_norms(std::int64_t blocks) {
  block_norms.fetch_add(blocks, std::memory_order_relaxed);
}

void softmax_exp(SoftmaxExpKind kind, const float* x, float* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(SoftmaxExp)(kind, x, out, n);
}

void fused_attention_blocked(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k,
                             std::int64_t splits) {
  // Found here, before the threads start: a bad POSBIAS_DECODE_PREFETCH
  // throws, and an exception must not leave a parallel region.
  (void)decode_prefetch();
  HWY_DYNAMIC_DISPATCH(Run)(p, block_q, block_k, splits);
}

void fused_attention(const AttentionParams& p) {
  // 256 query rows x 64 keys measured best on AVX-512 (b1 h16 i=j=2048 d64:
  // the packed K^T / V block is reused by 4x more rows than with 64, which
  // is what the L2 -> L1 traffic wants). Halve the query block while that
  // leaves fewer than two tasks per thread.
  const std::int64_t threads = omp_get_max_threads();
  std::int64_t bq = 256;
  while (bq > 64 && p.b * p.h * ((p.i + bq - 1) / bq) < 2 * threads) bq /= 2;
  // Decode (direct tasks, i <= kDirectRows = 4) walks 256 keys per block:
  // a quarter of the switches between the K and V streams (fewer keys for
  // a task over several kv heads side by side: PlanBlocking).
  fused_attention_blocked(p, bq, p.i <= 4 ? 256 : 64, 0);
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
