// Internal, per instruction set: what a task of the fused forward is
// (attention_fused.cc) -- its blocking, per-thread buffers, rows, keys and
// their addresses in a dense or paged cache -- and the P V product both the
// blocked and the decode paths end with.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_TASK_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_TASK_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_TASK_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_params.h"
#include "kernels/attention_softmax-inl.h"
#include "kernels/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows at or below this count use the direct (dot product) path.
constexpr std::int64_t kDirectRows = 4;

// Types here are per instruction set but not file-local (HWY_NAMESPACE is
// shared by every kernel file): names are unique across src/kernels so that
// their inline members never collide (an ODR violation ASan caught in Debug).
// The flushed tiles' largest key norm and value finiteness of a call's key
// blocks, per (b * hk + kv head, key block), measured before the tasks
// from whole key positions (FillBlockNorms, attention_skip-inl.h); -1
// where a block was not measured.
struct BlockNormTable {
  std::int64_t nkb = 0;
  std::vector<float> kmax;
  std::vector<signed char> v_finite;
};

struct AttentionBlocking {
  std::int64_t bq, bk, bkp, splits, nqb, nkb, dp;
  // Query heads per task: 1, or on the decode path (i <= kDirectRows) the
  // query heads of one kv head (grouped-query), so that each key and value
  // row is read once for all of them rather than once per query head.
  std::int64_t hg;
  bool pack_heads;  // share one K^T / V packing per (batch, kv head)
  // Flushed tiles skip their blocks (attention_skip-inl.h); off with
  // POSBIAS_FLUSHED_TILES=0 in the environment, read at each call.
  bool skip_flushed = true;
  // The blocks measured before the tasks, or null (FillBlockNorms).
  const BlockNormTable* norms = nullptr;
};

// Most rows (query heads x query rows) of one decode task.
constexpr std::int64_t kMaxGroupRows = 32;

// Most keys past a decode block whose rows the block's passes prefetch
// (attention_decode-inl.h): k_at and v_at hold them after the block's.
constexpr std::int64_t kDecMaxAhead = 64;

// Per-thread bytes allowed for a head's packed K^T and V.
constexpr double kMaxPackBytes = 32.0 * (1 << 20);

// Per-thread buffers, 64-byte aligned.
// Packed K^T and V of one (batch, kv head), block by block as they are
// first needed: the query blocks of a head then share one packing instead
// of transposing every key block again for each of them (the transposition
// costs about as much as a 64-row block product).
struct AttentionHeadPack {
  std::int64_t head = -1;                    // b * hk + kv head, -1: none
  hwy::AlignedFreeUniquePtr<float[]> kt, v;  // [nkb][d][bkp], [nkb * bk][dp]
  std::vector<char> ready;                   // per key block
  // Per key block, for the flushed tiles (attention_skip-inl.h): the
  // largest key norm (-1: not yet known) and whether V is finite (-1: not
  // yet known, else 0 or 1).
  std::vector<float> kmax;
  std::vector<signed char> v_finite;
};

struct AttentionWork {
  hwy::AlignedFreeUniquePtr<float[]> row, q, kt, v, s, o, m, l, alpha, alibi_off;
  // Per row, one vector of partial sums of l (the register softmax tile's
  // sums, kept unreduced: l of the row is l + the sum of its lanes).
  hwy::AlignedFreeUniquePtr<float[]> lv;
  std::vector<std::int64_t> lim, first;  // per row: visible keys [first, lim) of the block
  std::vector<float> qnorm;              // per row: |q| of its scaled row (attention_skip-inl.h)
  std::vector<double> need;              // per row: its headroom over the block (the same)
  // Per row: its distance-table entries from the block's first key (the
  // score tile's table bias; null where the row sees none of the block).
  std::vector<const float*> table_rows;
  std::vector<std::int64_t> vis_begin, vis_end;     // per row: its visible keys of the sequence
  std::int64_t vis_begin_max = 0, vis_end_min = 0;  // over the task's rows
  hwy::AlignedFreeUniquePtr<float[]> keep;  // key mask of the block (1 / 0), when there is one
  std::vector<std::int64_t> k_at, v_at;     // decode: where the block's key and value rows are
  AttentionHeadPack pack;
  AttentionWork(std::int64_t bq, std::int64_t bkp, std::int64_t d, std::int64_t dp)
      : row(allocate_scratch<float>(static_cast<std::int64_t>(hn::MaxLanes(DF())) * d, kWhat)),
        q(allocate_scratch<float>(bq * d, kWhat)),
        kt(allocate_scratch<float>(d * bkp, kWhat)),
        v(allocate_scratch<float>(bkp * dp, kWhat)),
        s(allocate_scratch<float>(bq * bkp, kWhat)),
        o(allocate_scratch<float>(bq * dp, kWhat)),
        m(allocate_scratch<float>(bq, kWhat)),
        l(allocate_scratch<float>(bq, kWhat)),
        alpha(allocate_scratch<float>(bq, kWhat)),
        alibi_off(allocate_scratch<float>(bq, kWhat)),
        lv(allocate_scratch<float>(bq * static_cast<std::int64_t>(hn::MaxLanes(DF())), kWhat)),
        lim(static_cast<std::size_t>(bq)),
        first(static_cast<std::size_t>(bq)),
        qnorm(static_cast<std::size_t>(bq)),
        need(static_cast<std::size_t>(bq)),
        table_rows(static_cast<std::size_t>(bq)),
        vis_begin(static_cast<std::size_t>(bq)),
        vis_end(static_cast<std::size_t>(bq)),
        keep(allocate_scratch<float>(bkp, kWhat)),
        k_at(static_cast<std::size_t>(bkp + kDecMaxAhead)),
        v_at(static_cast<std::size_t>(bkp + kDecMaxAhead)) {}
  static constexpr const char* kWhat = "the attention's per-thread block buffers";
};

// One task: a (batch, query heads [hh, hh + nh), query block) over some key
// blocks. Row x of the task is query row r0 + x % br of head hh + x / br;
// nh > 1 only on the direct (decode) path, where the heads share one kv
// head.
struct AttentionTask {
  std::int64_t bb = 0, hh = 0, nh = 1, r0 = 0, br = 0, rows = 0;
  Sequence sq;                              // the sequence bb: rows, keys, offsets
  std::int64_t kvh = 0;                     // the kv head
  std::int64_t k_base = 0, v_base = 0;      // the kv head's key 0 in k, v (dense layout)
  std::int64_t head = 0;                    // b * hk + kv head
  bool direct = false;                      // dot products over key rows in place
  bool use_pack = false;                    // the head's shared K^T / V packing
  bool alibi_fold = false;                  // the score tile adds ALiBi
  bool k_direct = false, v_direct = false;  // rows read in place, in their dtype
  bool v_in_place = false;                  // blocked: P V reads the value rows in place
  float neg_slope = 0.0f;
};

AttentionTask DescribeTask(const AttentionParams& p, const AttentionBlocking& bl, std::int64_t bb,
                           std::int64_t hh, std::int64_t nh, std::int64_t qb) {
  AttentionTask t;
  t.bb = bb;
  t.hh = hh;
  t.nh = nh;
  t.sq = sequence(p, bb);
  t.r0 = qb * bl.bq;
  t.br = std::min(bl.bq, t.sq.i - t.r0);
  t.rows = nh * t.br;
  t.kvh = hh / (p.h / p.hk);
  t.head = bb * p.hk + t.kvh;
  const bool paged = p.key_layout == KeyLayout::kPaged;
  t.k_base = paged ? 0 : bb * p.k_stride[0] + t.kvh * p.k_stride[1] + t.sq.k_row0 * p.k_stride[2];
  t.v_base = paged ? 0 : bb * p.v_stride[0] + t.kvh * p.v_stride[1] + t.sq.k_row0 * p.v_stride[2];
  t.direct = t.br <= kDirectRows;
  t.use_pack = !t.direct && bl.pack_heads;
  // ALiBi is added by the block product (not the decode path's dots), but
  // a soft-cap comes before the bias.
  t.alibi_fold = !t.direct && p.bias == FusedBias::kAlibi && p.softcap == 0.0f;
  t.neg_slope = p.bias == FusedBias::kAlibi ? -slope_of(p, bb, hh) : 0.0f;
  // Decode reads rows in place, in their dtype, when their elements are
  // contiguous (any d, paged or not, masked or not).
  t.k_direct = p.k_stride[3] == 1;
  t.v_direct = p.v_stride[3] == 1;
  // The blocked P V reads the value rows in place, in their dtype, too when
  // a row is whole vectors (no column past d is read) at a fixed stride (a
  // dense layout) and no key is masked (a masked key's row, NaN perhaps, is
  // never read; the packing zeroes it). V was half the packing's bytes:
  // the packing fell from 6.9% to 5.5% of a causal prefill's samples (Zen 5).
  t.v_in_place = !t.direct && !paged && t.v_direct && p.key_mask == nullptr &&
                 p.d % static_cast<std::int64_t>(hn::Lanes(DF())) == 0;
  return t;
}

// Element 0 of key c (of the task's sequence and kv head) in k (v with
// `values`), at the dense or paged layout.
HWY_INLINE std::int64_t KeyRowAt(const AttentionParams& p, const AttentionTask& t, std::int64_t c,
                                 bool values) {
  const std::int64_t* st = values ? p.v_stride : p.k_stride;
  if (p.key_layout == KeyLayout::kPaged) {
    std::int64_t page, row;
    if ((p.block_size & (p.block_size - 1)) == 0) {  // a power of two: no division per key
      const int shift = __builtin_ctzll(static_cast<unsigned long long>(p.block_size));
      page = c >> shift;
      row = c & (p.block_size - 1);
    } else {
      page = c / p.block_size;
      row = c % p.block_size;
    }
    const std::int64_t blk =
        p.block_table[t.bb * p.block_table_stride[0] + page * p.block_table_stride[1]];
    return blk * st[0] + t.kvh * st[1] + row * st[2];
  }
  return (values ? t.v_base : t.k_base) + c * st[2];
}

// Whether key c of the task's sequence is masked by the key mask.
HWY_INLINE bool KeyMasked(const AttentionParams& p, const AttentionTask& t, std::int64_t c) {
  return p.key_mask != nullptr &&
         p.key_mask[t.bb * p.key_mask_stride[0] + c * p.key_mask_stride[1]] == 0;
}

// The position of the task's query row r.
HWY_INLINE std::int64_t TaskPosition(const AttentionTask& t, std::int64_t r) {
  return t.sq.q_offset + r;
}

// Rows [r, r + R), each over its own visible keys [first(x), lim(x)): the
// keys all R rows see, [begin, end), go to common(begin, end) (one tile of
// R rows; called even when empty, for a tile that also rescales), each
// row's others to own(row, from, to). Shared by the blocked and the direct
// (decode) P V.
template <int R, typename First, typename Lim, typename Common, typename Own>
HWY_INLINE void ForCommonKeys(std::int64_t r, const First& first, const Lim& lim,
                              const Common& common, const Own& own) {
  std::int64_t begin = first(r), end = lim(r);
  for (int u = 1; u < R; ++u) {
    begin = std::max(begin, first(r + u));
    end = std::min(end, lim(r + u));
  }
  if (end < begin) end = begin;
  common(begin, end);
  for (int u = 0; u < R; ++u) {
    const std::int64_t rr = r + u;
    if (end > begin) {
      own(rr, first(rr), begin);
      own(rr, end, lim(rr));
    } else {
      own(rr, first(rr), lim(rr));
    }
  }
}

// O = alpha O + P V for rows [r, r + R) of P (row stride ldp), each over
// its own visible keys w.lim only: the keys all R rows see in one tile of
// R rows x VW vectors of d, then each row's own others (ForCommonKeys). V
// rows (stride ldv) may be unaligned.
template <int R, int VW, typename TV>
HWY_INLINE void PVRows(DF df, AttentionWork& w, std::int64_t r, const float* s, std::int64_t ldp,
                       const TV* vp, std::int64_t ldv, std::int64_t dp) {
  float* o = w.o.get();
  const auto lim = [&](std::int64_t x) { return w.lim[static_cast<std::size_t>(x)]; };
  const auto first = [&](std::int64_t x) { return w.first[static_cast<std::size_t>(x)]; };
  ForCommonKeys<R>(
      r, first, lim,
      [&](std::int64_t begin, std::int64_t end) {
        MulAddRowsOf<R, VW, TV>(df, s + r * ldp + begin, ldp, 1, vp + begin * ldv, ldv, end - begin,
                                TileInit::kScale, w.alpha.get() + r, o + r * dp, dp, dp);
      },
      [&](std::int64_t rr, std::int64_t from, std::int64_t to) {  // row rr's keys [from, to)
        if (to <= from) return;
        MulAddRowsOf<1, VW, TV>(df, s + rr * ldp + from, ldp, 1, vp + from * ldv, ldv, to - from,
                                TileInit::kAdd, nullptr, o + rr * dp, dp, dp);
      });
}

// Row r's l with its vector of unreduced partial sums added in (and that
// vector zero again).
HWY_INLINE void FoldRowSums(DF df, AttentionWork& w, std::int64_t r) {
  float* lv = w.lv.get() + r * AttnLanes(df);
  w.l[r] += hn::GetLane(hn::SumOfLanes(df, hn::Load(df, lv)));
  hn::Store(hn::Zero(df), df, lv);
}

// Bias, mask and the online-softmax update of rows [r0, r1) of the task
// over the block at key c0: their w.s rows become P, w.alpha the rescale
// factors. SoftmaxBlock: every row.
void SoftmaxRows(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                 std::int64_t cols, std::int64_t r0, std::int64_t r1, AttentionWork& w) {
  for (std::int64_t r = r0; r < r1; ++r) {
    float* srow = w.s.get() + r * cols;
    std::int64_t& lim = w.lim[static_cast<std::size_t>(r)];
    const std::int64_t qr = t.r0 + r % t.br;
    const RowBias rb = RowBiasOf(p, t.bb, t.hh + r / t.br, qr, TaskPosition(t, qr), c0, lim,
                                 /*alibi_from_first_key=*/true, t.alibi_fold);
    FoldRowSums(df, w, r);
    const float row_max = BiasMaskMax(df, rb, cols, lim, srow, w.first[static_cast<std::size_t>(r)],
                                      p.key_mask != nullptr ? w.keep.get() : nullptr);
    w.alpha[r] = OnlineSoftmaxRow(df, srow, lim, row_max, w.m[r], w.l[r]);
  }
}

void SoftmaxBlock(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                  std::int64_t cols, AttentionWork& w) {
  SoftmaxRows(df, p, t, c0, cols, 0, t.rows, w);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_TASK_INL_H_ toggle
