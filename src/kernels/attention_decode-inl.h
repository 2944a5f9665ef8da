// Internal, per instruction set: the direct (decode) path of the fused
// forward, for tasks of at most kDirectRows query rows per head. Decode
// reads every key and value row once and does little arithmetic on it, so
// what matters is reading K and V as the memory streams them:
//
//   - each key block's rows are addressed once (one page run after
//     another in a paged cache, a page's base computed once);
//   - S by dot products over the key rows in place (nothing transposed), in
//     their own dtype (a 16-bit row is widened in registers), key by key so
//     that each row is read front to back, one vector of scores per N keys
//     (a transpose-add tree, not a horizontal sum per key); every row of
//     the task reads N keys while they are in L1;
//   - O = alpha O + P V in one pass over the value rows per row tile, its
//     accumulators in registers over the whole block;
//   - each pass prefetches the row it will read about 4 KiB later in its
//     own walk (the hardware's prefetchers start again at every page).
//
// Both passes keep their accumulators in registers: a store whose data
// waits on a load from memory (an accumulator spilled to the stack, or O
// stored every 16 keys) held back the loads after it, and the two passes
// ran at 0.6-0.7 of a plain read (Zen 5, perf: every sample on the loads).
//
// With grouped-query attention a task holds the rows of several query
// heads of one kv head, so each key and value row is read once for all of
// them; where the kv heads of a key position lie side by side (a paged
// cache [blocks, block_size, hk, d]) a task may hold several kv heads, and
// walks a key position's heads together (contiguous bytes).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of a float vector (compile time: x86 vectors have a fixed size).
constexpr std::size_t kDecLanes = hn::MaxLanes(DF());

// The P V tile of two rows: as wide as the registers allow (two rows x 4
// vectors of accumulators on AVX2's 16 registers, x 8 on AVX-512's 32:
// d = 128 in one chunk). One row: 8 vectors everywhere (its value vectors
// are FMA operands straight from memory).
constexpr int kDecPairVecs = 2 * kAttnVecs;
constexpr int kDecRowVecs = 8;
// Four rows (grouped query heads of one kv head): 4 x 2 vectors of
// accumulators on AVX2, 4 x 4 on AVX-512, so the value rows are read from
// memory once for the four rows (as pairs, the second pair read them
// again from L2).
constexpr int kDecQuadVecs = kAttnVecs;
// Keys per group of a P V tile whose row needs several chunks of columns
// (DecPVTile): 4 KiB of float32 rows at d = 128.
constexpr std::int64_t kDecPVGroup = 8;

// Vectors of q a one-row score pass holds in registers with its N
// accumulators: 8 + 16 of AVX-512's 32 registers, 4 + 8 of AVX2's 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kDecQVecs = 8;
#else
constexpr int kDecQVecs = 4;
#endif

// Software prefetch. The hardware's stream prefetchers follow a stream
// within a 4 KiB page and start again at each new page; a 16-key group of
// float16 rows (d = 128) is one page, so every group began with its loads
// waiting for memory (perf: a third of the score pass's samples on the
// first key of each group). Both passes prefetch the rows about
// kDecAheadBytes ahead of the one they read (at least one key, at most
// kDecMaxAhead keys, attention_task-inl.h).
constexpr std::int64_t kDecAheadBytes = 4096;

// Every cache line of the row's bytes [row, row + bytes).
HWY_INLINE void DecPrefetchRow(const void* row, std::int64_t bytes) {
  const char* b = static_cast<const char*>(row);
#pragma GCC unroll 8
  for (std::int64_t x = 0; x < bytes; x += 64) hwy::Prefetch(b + x);
}

// Node i of level L of the transpose-add tree over acc: level 0 is acc[i];
// a node of level L merges nodes 2i + 1 and 2i of level L - 1 into one
// vector of their pairwise sums (even + odd lanes), so the top node's lane
// u is the sum of the lanes of acc[u]. Evaluated depth first, so that few
// partial vectors are live at once: level by level, the 16 accumulators
// of a tile went through the stack (a store and a reload each).
#if HWY_TARGET != HWY_SCALAR
template <int L>
HWY_INLINE VF DecTreeNode(DF df, const VF* acc, std::size_t i) {
  if constexpr (L == 0) {
    (void)df;
    return acc[i];
  } else {
    const VF hi = DecTreeNode<L - 1>(df, acc, 2 * i + 1);
    const VF lo = DecTreeNode<L - 1>(df, acc, 2 * i);
    return hn::Add(hn::ConcatEven(df, hi, lo), hn::ConcatOdd(df, hi, lo));
  }
}
#endif

constexpr int DecLog2(std::size_t n) { return n <= 1 ? 0 : 1 + DecLog2(n / 2); }

// Lane u of the result: the sum of the lanes of acc[u] (kDecLanes vectors),
// N - 1 merges for N sums.
HWY_INLINE VF DecLaneSums(DF df, const VF* acc) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  return acc[0];
#else
  return DecTreeNode<DecLog2(kDecLanes)>(df, acc, 0);
#endif
}

// The scores of one query row q (float32, times scale) against the N key
// rows kr (their dtype), stored as one vector at s (aligned).
// pf, when not null: N rows to prefetch, one before each key's.
//
// When q fits in kDecQVecs registers (d = 128 on AVX-512), it stays there
// and each key row's vectors are FMA operands straight from memory: one
// instruction per vector of a key row. Loading q again for every key (two
// loads per FMA, in a loop of d / 2N steps per key) made the score pass
// about 65 instructions per key on a Zen 5, twice the value pass. Key by
// key, each row read front to back: the memory sees one sequential stream
// (walking d across the N rows instead, a vector of every row then the
// next, read 0.8x as fast on a Zen 5). A wider row (d = 128 on AVX2) is
// read the same way, with q from L1: there the memory, not the
// instruction count, sets the pace.
template <typename TK>
HWY_INLINE void DecScoreLanes(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                              const TK* const* kr, const TK* const* pf, float* HWY_RESTRICT s) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  VF acc[kDecLanes];
  for (auto& a : acc) a = hn::Zero(df);
  const std::int64_t whole = d - d % n;
  // The prefetches go with the first chunk's loads, key by key.
  const auto prefetch = [&](std::size_t u) {
    DecPrefetchRow(pf[u], d * static_cast<std::int64_t>(sizeof(TK)));
  };
  // Vectors [x, x + V n) of every key row, q's in registers.
  const auto chunk = [&](auto vecs_tag, std::int64_t x) {
    constexpr int V = decltype(vecs_tag)::value;
    VF qv[V];
    for (int v = 0; v < V; ++v) qv[v] = hn::LoadU(df, q + x + v * n);
    const bool first = pf != nullptr && x == 0;
#pragma GCC unroll 16
    for (std::size_t u = 0; u < kDecLanes; ++u) {
      if (first) prefetch(u);
      const TK* HWY_RESTRICT row = kr[u] + x;
      VF a = acc[u];
      for (int v = 0; v < V; ++v) a = hn::MulAdd(qv[v], LoadWide(df, row + v * n), a);
      acc[u] = a;
    }
  };
  if (whole > kDecQVecs * n) {
    // A row wider than q's registers (d = 128 on AVX2: 16 vectors, 4 in
    // registers): key by key, each row front to back with q's vectors
    // loaded again from L1 (two loads per FMA, two sums per key for the
    // FMA latency). Chunk by chunk across the N rows instead, the memory
    // saw a stride of one row and read 0.85-0.9x as fast (a Zen 3, a
    // sum over the same bytes in each order).
    // The common widths (d = 64 and 128 on AVX2) fully unrolled with
    // four sums per key: the loop over a runtime d ran two dependent sums
    // of eight FMAs per key, with a branch per two vectors.
    const auto fixed = [&](auto vecs_tag) {
      constexpr int W = decltype(vecs_tag)::value;
#pragma GCC unroll 16
      for (std::size_t u = 0; u < kDecLanes; ++u) {
        if (pf != nullptr) prefetch(u);
        const TK* HWY_RESTRICT row = kr[u];
        VF a[4];
        for (int v = 0; v < 4; ++v)
          a[v] = hn::Mul(hn::LoadU(df, q + v * n), LoadWide(df, row + v * n));
#pragma GCC unroll 16
        for (int v = 4; v < W; ++v) {
          a[v % 4] = hn::MulAdd(hn::LoadU(df, q + v * n), LoadWide(df, row + v * n), a[v % 4]);
        }
        acc[u] = hn::Add(hn::Add(a[0], a[1]), hn::Add(a[2], a[3]));
      }
    };
    if (d == 16 * n) {
      fixed(std::integral_constant<int, 16>());
    } else if (d == 8 * n) {
      fixed(std::integral_constant<int, 8>());
    } else {
#pragma GCC unroll 16
    for (std::size_t u = 0; u < kDecLanes; ++u) {
      if (pf != nullptr) prefetch(u);
      const TK* HWY_RESTRICT row = kr[u];
      VF a0 = hn::Mul(hn::LoadU(df, q), LoadWide(df, row));
      VF a1 = hn::Zero(df);
      std::int64_t y = n;
      for (; y + 2 * n <= whole; y += 2 * n) {
        a1 = hn::MulAdd(hn::LoadU(df, q + y), LoadWide(df, row + y), a1);
        a0 = hn::MulAdd(hn::LoadU(df, q + y + n), LoadWide(df, row + y + n), a0);
      }
      if (y < whole) a1 = hn::MulAdd(hn::LoadU(df, q + y), LoadWide(df, row + y), a1);
      acc[u] = hn::Add(a0, a1);
    }
    }
  } else {
    std::int64_t x = 0;
    for (; x + kDecQVecs * n <= whole; x += kDecQVecs * n) {
      chunk(std::integral_constant<int, kDecQVecs>(), x);
    }
    for (; x < whole; x += n) chunk(std::integral_constant<int, 1>(), x);
  }
  if (whole == 0 && pf != nullptr) {  // d < N: no chunk
    for (std::size_t u = 0; u < kDecLanes; ++u) prefetch(u);
  }
  VF sums = DecLaneSums(df, acc);
  if (whole < d) {  // d not a multiple of N: the last elements one by one
    HWY_ALIGN float tail[kDecLanes];
    for (std::size_t u = 0; u < kDecLanes; ++u) {
      float t = 0.0f;
      for (std::int64_t y = whole; y < d; ++y) t += q[y] * AttnToF(kr[u][y]);
      tail[u] = t;
    }
    sums = hn::Add(sums, hn::Load(df, tail));
  }
  hn::Store(sums, df, s);
}

// The scores of R > 1 query rows (grouped query heads; q with row stride d,
// float32, times scale) against N / R key rows kr (their dtype), into s
// (row stride lds): N independent dot products summed by one transpose-add
// tree, each vector of a key row loaded once for the R rows. Against R
// calls of DecScoreLanes (each row loading every key vector and its q
// vector again) a grouped-query decode over 1024 cached keys took 0.85x
// the time on a Zen 5.
template <int R, typename TK>
HWY_INLINE void DecScoreTile(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                             const TK* const* kr, const TK* const* pf, float* HWY_RESTRICT s,
                             std::int64_t lds) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  constexpr std::size_t kKeys = kDecLanes / R;
  static_assert(R > 1 && kKeys * R == kDecLanes, "R > 1 divides the lanes");
  if (pf != nullptr) {
    for (std::size_t u = 0; u < kKeys; ++u) {
      DecPrefetchRow(pf[u], d * static_cast<std::int64_t>(sizeof(TK)));
    }
  }
  const std::int64_t whole = d - d % n;
  HWY_ALIGN float out[kDecLanes] = {};
  if (whole > 0) {
    // The first vector sets the sums (no zeroed start): with a path on
    // which the loop ran no times, the sums went through the stack.
    VF acc[kDecLanes];  // acc[row * kKeys + key]: the sums come out row by row
    {
      VF qv[R];
      for (int r = 0; r < R; ++r) qv[r] = hn::LoadU(df, q + r * d);
      for (std::size_t u = 0; u < kKeys; ++u) {
        const VF kv = LoadWide(df, kr[u]);
        for (int r = 0; r < R; ++r) acc[r * kKeys + u] = hn::Mul(qv[r], kv);
      }
    }
    for (std::int64_t x = n; x < whole; x += n) {
      VF qv[R];
      for (int r = 0; r < R; ++r) qv[r] = hn::LoadU(df, q + r * d + x);
      for (std::size_t u = 0; u < kKeys; ++u) {
        const VF kv = LoadWide(df, kr[u] + x);
        for (int r = 0; r < R; ++r) acc[r * kKeys + u] = hn::MulAdd(qv[r], kv, acc[r * kKeys + u]);
      }
    }
    hn::Store(DecLaneSums(df, acc), df, out);
  }
  if (whole == d) {  // each row's kKeys scores in one copy (not one store per score)
    for (int r = 0; r < R; ++r) std::memcpy(s + r * lds, out + r * kKeys, sizeof(float) * kKeys);
    return;
  }
  for (int r = 0; r < R; ++r) {  // d not a multiple of N: the last elements one by one
    for (std::size_t u = 0; u < kKeys; ++u) {
      float t = out[r * kKeys + u];
      for (std::int64_t y = whole; y < d; ++y) t += q[r * d + y] * AttnToF(kr[u][y]);
      s[r * lds + static_cast<std::int64_t>(u)] = t;
    }
  }
}

// The rows [begin, end) of the task that belong to kv head kv (query heads
// kv * group ... of the task's heads [hh, hh + nh)).
struct DecRowRange {
  std::int64_t begin, end;
};

HWY_INLINE DecRowRange DecRowsOfKvHead(const AttentionParams& p, const AttentionTask& t,
                                       std::int64_t kv) {
  const std::int64_t group = p.h / p.hk;
  const std::int64_t h0 = std::max(kv * group, t.hh), h1 = std::min((kv + 1) * group, t.hh + t.nh);
  return {(h0 - t.hh) * t.br, (h1 - t.hh) * t.br};
}

// The task's last kv head (its first is t.kvh).
HWY_INLINE std::int64_t DecLastKvHead(const AttentionParams& p, const AttentionTask& t) {
  return (t.hh + t.nh - 1) / (p.h / p.hk);
}

// Element offsets of the rows of keys [c0, c0 + n + extra) of the task's
// first kv head in k (v with `values`); the extra keys (past the block,
// within the sequence) are only prefetched. A paged cache is walked page
// run by page run (a page's base once, no division per key). A key of the
// block that the key mask hides gets the offset of a key the block attends
// (BlockKeep found one): its score is masked and its weight is never used,
// so nothing depends on what its row holds.
void DecRowOffsets(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                   std::int64_t n, std::int64_t extra, bool values, std::int64_t* at,
                   const AttentionWork& w) {
  const std::int64_t* st = values ? p.v_stride : p.k_stride;
  const std::int64_t all = n + extra;
  if (p.key_layout == KeyLayout::kPaged) {
    const std::int32_t* table = p.block_table + t.bb * p.block_table_stride[0];
    std::int64_t page = c0 / p.block_size, row = c0 % p.block_size;
    for (std::int64_t c = 0; c < all; ++page, row = 0) {
      const std::int64_t base = table[page * p.block_table_stride[1]] * st[0] + t.kvh * st[1];
      const std::int64_t run = std::min(all - c, p.block_size - row);
      for (std::int64_t k = 0; k < run; ++k) at[c + k] = base + (row + k) * st[2];
      c += run;
    }
  } else {
    const std::int64_t base = (values ? t.v_base : t.k_base) + c0 * st[2];
    for (std::int64_t c = 0; c < all; ++c) at[c] = base + c * st[2];
  }
  if (p.key_mask == nullptr) return;
  std::int64_t kept = 0;
  while (kept < n && w.keep[kept] == 0.0f) ++kept;
  for (std::int64_t c = 0; c < n && kept < n; ++c) {
    if (w.keep[c] == 0.0f) at[c] = at[kept];
  }
}

// Where the decode kernels read a block's rows: base + at[c] (+ a kv
// head's offset) is key c's row, in the dtype T.
// ahead > 0: a pass prefetches the row it will read `ahead` rows later
// (at[] holds `avail` entries; the last one stands for those past it).
template <typename T>
struct DecRows {
  const T* base;
  const std::int64_t* at;
  std::int64_t kv_step;  // elements between the rows of two kv heads
  std::int64_t ahead = 0, avail = 0;

  // The value pass walks one kv head's keys in order: while reading key c
  // of the kv head at b, key c + ahead's row.
  const T* Ahead(const T* b, std::int64_t c) const {
    return b + at[std::min(c + ahead, avail - 1)];
  }

  // The key pass walks groups of n keys, each group kv head by kv head
  // (nkv of them). While it reads the n keys of one place (group, kv
  // head), it prefetches the rows `ahead` steps further in that order: the
  // last n - ahead % n keys of one place and the first ahead % n of the
  // next. A GroupWalk is that first place (the first key of its group,
  // the task's kv head there): it moves on by one place per call, so no
  // call divides.
  struct GroupWalk {
    std::int64_t group, kv;
  };
  GroupWalk StartGroups(std::int64_t n, std::int64_t nkv) const {
    const std::int64_t span = n * nkv;
    return {ahead / span * n, ahead % span / n};
  }
  // The rows to prefetch while reading the walk's next n keys, into
  // pf[0, n).
  void NextInGroups(GroupWalk& g, std::int64_t n, std::int64_t nkv, const T** pf) const {
    const std::int64_t split = n - ahead % n;
    const T* b = base + g.kv * kv_step;
    for (std::int64_t i = 0; i < split; ++i)
      pf[i] = b + at[std::min(g.group + n - split + i, avail - 1)];
    if (++g.kv == nkv) {  // the next place: the group's next kv head, or the next group
      g.kv = 0;
      g.group += n;
    }
    b = base + g.kv * kv_step;
    for (std::int64_t i = split; i < n; ++i)
      pf[i] = b + at[std::min(g.group + i - split, avail - 1)];
  }
};

// S = (scale q) K^T for every row of the task over the block's first
// max_lim keys: N keys at a time for each kv head's rows (so a group's K
// rows, all heads of a key position side by side in a paged cache, are
// read from memory once and by the other rows from L1). Columns past
// max_lim up to a whole vector get the scores of key 0 (masked later).
template <typename TK>
void DecScores(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t max_lim,
               std::int64_t cols, const DecRows<TK>& k, AttentionWork& w) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const std::int64_t d = p.d, kv1 = DecLastKvHead(p, t), nkv = kv1 - t.kvh + 1;
  const TK* kr[kDecLanes];
  const TK* pf[kDecLanes] = {};
  auto walk = k.StartGroups(n, nkv);
  for (std::int64_t c = 0; c < max_lim; c += n) {
    for (std::int64_t kv = t.kvh; kv <= kv1; ++kv) {
      const TK* base = k.base + (kv - t.kvh) * k.kv_step;
      for (std::int64_t u = 0; u < n; ++u) kr[u] = base + k.at[c + u < max_lim ? c + u : 0];
      if (k.ahead > 0) k.NextInGroups(walk, n, nkv, pf);
      const DecRowRange rr = DecRowsOfKvHead(p, t, kv);
      std::int64_t r = rr.begin;
      // The first rows of the kv head read its key rows from memory (and
      // prefetch); the others find them in L1.
      const auto ahead = [&](std::int64_t row, std::int64_t u) {
        return k.ahead > 0 && row == rr.begin ? pf + u : nullptr;
      };
      if constexpr (kDecLanes % 4 == 0) {  // four rows (query heads) at a time
        for (; r + 4 <= rr.end; r += 4) {
          for (std::int64_t u = 0; u < n; u += n / 4) {
            DecScoreTile<4>(df, w.q.get() + r * d, d, kr + u, ahead(r, u),
                            w.s.get() + r * cols + c + u, cols);
          }
        }
      }
      for (; r < rr.end; ++r) {
        DecScoreLanes(df, w.q.get() + r * d, d, kr, ahead(r, 0), w.s.get() + r * cols + c);
      }
    }
  }
}

// O[RB rows][columns ...] += P[RB rows][keys [0, count)] V[keys], key c's
// value row at base + at[c] (its dtype): VW vectors of d at a time over
// all the keys (the accumulators stay in registers for the whole run of
// keys), then single vectors, then the last d % N columns one by one. P
// rows have stride ldp, O rows dp. pf, when not null, is the block's rows
// (at = pf->at + c_first): the first pass over the keys prefetches ahead.
template <int RB, int VW, typename TV>
HWY_INLINE void DecPVTile(DF df, const float* HWY_RESTRICT pw, std::int64_t ldp,
                          const TV* HWY_RESTRICT base, const std::int64_t* HWY_RESTRICT at,
                          std::int64_t count, std::int64_t d, float* HWY_RESTRICT o,
                          std::int64_t dp, const DecRows<TV>* pf, std::int64_t c_first) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const std::int64_t row_bytes = d * static_cast<std::int64_t>(sizeof(TV));
  // Columns [x, x + kVW n) over keys [c0, c1).
  const auto chunk = [&](auto vw_tag, std::int64_t x, std::int64_t c0, std::int64_t c1) {
    constexpr int kVW = decltype(vw_tag)::value;
    VF acc[RB][kVW];
    for (int r = 0; r < RB; ++r) {
      for (int u = 0; u < kVW; ++u) acc[r][u] = hn::LoadU(df, o + r * dp + x + u * n);
    }
    const TV* HWY_RESTRICT bx = base + x;
    const bool prefetch = pf != nullptr && x == 0;
    for (std::int64_t c = c0; c < c1; ++c) {
      if (prefetch) DecPrefetchRow(pf->Ahead(base, c_first + c), row_bytes);
      const TV* HWY_RESTRICT row = bx + at[c];
      VF vv[kVW];
      for (int u = 0; u < kVW; ++u) vv[u] = LoadWide(df, row + u * n);
      for (int r = 0; r < RB; ++r) {
        const VF pv = hn::Set(df, pw[r * ldp + c]);
        for (int u = 0; u < kVW; ++u) acc[r][u] = hn::MulAdd(pv, vv[u], acc[r][u]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      for (int u = 0; u < kVW; ++u) hn::StoreU(acc[r][u], df, o + r * dp + x + u * n);
    }
  };
  const auto columns = [&](std::int64_t c0, std::int64_t c1) {
    std::int64_t x = 0;
    for (; x + VW * n <= d; x += VW * n) chunk(std::integral_constant<int, VW>(), x, c0, c1);
    for (; x + n <= d; x += n) chunk(std::integral_constant<int, 1>(), x, c0, c1);
  };
  if (d <= VW * n) {
    columns(0, count);
  } else {
    // A row wider than the tile's accumulators (d = 128 on AVX2: 16
    // vectors, 8 or 4 held): kDecPVGroup keys at a time, each chunk of
    // columns over them, so the later chunks find the rows in L1 and the
    // memory sees each row read front to back. Each chunk over all the
    // keys (a stride of one row in memory, the later chunks from L2)
    // read 0.85x as fast (a Zen 3, a sum over the same bytes both ways).
    //
    // A whole group goes through its own loop, its keys unrolled: their
    // rows' addresses and prefetches once per group, not once per key and
    // chunk, with no branch per key (the grouped-query tile ran about 25
    // instructions per key and chunk around its 8 FMAs, its P row pointers
    // reloaded from the stack). Tiles of two or four rows take one key at
    // a time (each row read front to back, the accumulators through L1):
    // in groups of 8 keys, their one or two vectors per chunk made the
    // memory see 8 interleaved streams, and a stand-alone probe of the
    // four-row tile's value pass read 0.65x as fast (8.3 against 12.7
    // GB/s, one thread, Zen 3). One row keeps its groups (the same speed
    // either way there), and so does a chunk of 64 columns or more
    // (AVX-512's four-row tile: 4 lines of float32 per row and chunk, as
    // AVX2's one row; its stores per key are not measured there).
    constexpr std::int64_t kGroup =
        RB == 1 || VW * static_cast<int>(kDecLanes) >= 64 ? kDecPVGroup : 1;
    std::int64_t c = 0;
    for (; c + kGroup <= count; c += kGroup) {
      const TV* rows[kGroup];
      for (std::int64_t g = 0; g < kGroup; ++g) {
        rows[g] = base + at[c + g];
        if (pf != nullptr) DecPrefetchRow(pf->Ahead(base, c_first + c + g), row_bytes);
      }
      const float* HWY_RESTRICT pc = pw + c;
      const auto group = [&](auto vw_tag, std::int64_t x) {
        constexpr int kVW = decltype(vw_tag)::value;
        VF acc[RB][kVW];
        for (int r = 0; r < RB; ++r) {
          for (int u = 0; u < kVW; ++u) acc[r][u] = hn::LoadU(df, o + r * dp + x + u * n);
        }
#pragma GCC unroll 16
        for (std::int64_t g = 0; g < kGroup; ++g) {
          const TV* HWY_RESTRICT row = rows[g] + x;
          VF vv[kVW];
          for (int u = 0; u < kVW; ++u) vv[u] = LoadWide(df, row + u * n);
          for (int r = 0; r < RB; ++r) {
            const VF pv = hn::Set(df, pc[r * ldp + g]);
            for (int u = 0; u < kVW; ++u) acc[r][u] = hn::MulAdd(pv, vv[u], acc[r][u]);
          }
        }
        for (int r = 0; r < RB; ++r) {
          for (int u = 0; u < kVW; ++u) hn::StoreU(acc[r][u], df, o + r * dp + x + u * n);
        }
      };
      std::int64_t x = 0;
      for (; x + VW * n <= d; x += VW * n) group(std::integral_constant<int, VW>(), x);
      for (; x + n <= d; x += n) group(std::integral_constant<int, 1>(), x);
    }
    if (c < count) columns(c, count);
  }
  for (std::int64_t x = d - d % n; x < d; ++x) {
    for (int r = 0; r < RB; ++r) {
      float sum = o[r * dp + x];
      for (std::int64_t c = 0; c < count; ++c) sum += pw[r * ldp + c] * AttnToF(base[at[c] + x]);
      o[r * dp + x] = sum;
    }
  }
}

// O = alpha O + P V for every row of the task over the block's keys,
// each row over its own visible keys [first, lim) only (a NaN in a value
// it cannot see never reaches it; neither are the keys the key mask hides
// read). A tile walks all its keys with its accumulators in registers: two
// rows together over the keys both see, then each row's own others
// (ForCommonKeys, as the blocked path's PVRows). Storing O every few keys
// instead held back the next value loads (the stores wait on the loads of
// their group): with one row, 1.3x the time of the value pass on a Zen 5.
// The first tile of a kv head reads the block's value rows from memory,
// the others from L2.
template <typename TV>
void DecValues(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
               std::int64_t cols, const DecRows<TV>& v, AttentionWork& w) {
  float* o = w.o.get();
  const float* s = w.s.get();
  const auto first = [&](std::int64_t r) { return w.first[static_cast<std::size_t>(r)]; };
  const auto lim = [&](std::int64_t r) { return w.lim[static_cast<std::size_t>(r)]; };
  for (std::int64_t r = 0; r < t.rows; ++r) {
    const VF a = hn::Set(df, w.alpha[r]);
    for (std::int64_t x = 0; x < dp; x += AttnLanes(df)) {
      hn::Store(hn::Mul(a, hn::Load(df, o + r * dp + x)), df, o + r * dp + x);
    }
  }
  const float* keep = p.key_mask != nullptr ? w.keep.get() : nullptr;
  // Rows [r, r + R) over keys [from, to), in runs of attended keys; the
  // first rows of a kv head (which read its value rows from memory)
  // prefetch.
  const auto tile = [&](auto rows_tag, std::int64_t r, std::int64_t from, std::int64_t to,
                        const TV* base, bool first_rows) {
    constexpr int R = decltype(rows_tag)::value;
    constexpr int kVW = R == 1 ? kDecRowVecs : R == 2 ? kDecPairVecs : kDecQuadVecs;
    for (std::int64_t c = from; c < to;) {
      if (keep != nullptr) {
        while (c < to && keep[c] == 0.0f) ++c;
      }
      std::int64_t e = to;
      if (keep != nullptr) {
        e = c;
        while (e < to && keep[e] != 0.0f) ++e;
      }
      if (e > c) {
        DecPVTile<R, kVW>(df, s + r * cols + c, cols, base, v.at + c, e - c, p.d, o + r * dp, dp,
                          first_rows && v.ahead > 0 ? &v : nullptr, c);
      }
      c = e;
    }
  };
  const auto one = std::integral_constant<int, 1>();
  const std::int64_t kv1 = DecLastKvHead(p, t);
  for (std::int64_t kv = t.kvh; kv <= kv1; ++kv) {
    const TV* base = v.base + (kv - t.kvh) * v.kv_step;
    const DecRowRange rr = DecRowsOfKvHead(p, t, kv);
    std::int64_t r = rr.begin;
    // Tiles of R rows while R fit: the keys all R see, then each row's
    // others; the first tile of the kv head prefetches.
    const auto tiles_of = [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      for (; r + R <= rr.end; r += R) {
        const bool pf = r == rr.begin;
        ForCommonKeys<R>(
            r, first, lim,
            [&](std::int64_t b, std::int64_t e) { tile(rows_tag, r, b, e, base, pf); },
            [&](std::int64_t x, std::int64_t from, std::int64_t to) {
              tile(one, x, from, to, base, pf);
            });
      }
    };
    tiles_of(std::integral_constant<int, 4>());
    tiles_of(std::integral_constant<int, 2>());
    for (; r < rr.end; ++r) tile(one, r, first(r), lim(r), base, r == rr.begin);
  }
}

// Rows read in place: the block's and, to prefetch, up to kDecMaxAhead
// more of the sequence's keys; the passes prefetch the row they will read
// about kDecAheadBytes later (at least one row ahead, at most
// kDecMaxAhead - N so that the key pass's target, up to a group of N keys
// further, stays among them).
template <typename T>
DecRows<T> DecRowsInPlace(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                          std::int64_t max_lim, bool values, std::int64_t* at,
                          const AttentionWork& w) {
  const std::int64_t row_bytes = p.d * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t extra = std::clamp<std::int64_t>(t.sq.j - c0 - max_lim, 0, kDecMaxAhead);
  DecRowOffsets(p, t, c0, max_lim, extra, values, at, w);
  DecRows<T> rows{static_cast<const T*>(values ? p.v : p.k), at,
                  (values ? p.v_stride : p.k_stride)[1]};
  rows.ahead = std::clamp<std::int64_t>((kDecAheadBytes + row_bytes - 1) / row_bytes, 1,
                                        kDecMaxAhead - static_cast<std::int64_t>(kDecLanes));
  rows.avail = max_lim + extra;
  return rows;
}

// The block's rows as the kernels read them: in place in their dtype T
// (TRead = T, buf null) when a row's elements are contiguous, with the
// rows about kDecAheadBytes ahead to prefetch (up to the sequence's last
// key); else converted to float32 rows in buf (TRead = float).
template <typename T, typename TRead>
DecRows<TRead> DecBlockRows(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                            std::int64_t max_lim, bool values, std::int64_t* at, float* buf,
                            const AttentionWork& w) {
  if constexpr (!std::is_same_v<TRead, float>) {
    (void)buf;
    return DecRowsInPlace<T>(p, t, c0, max_lim, values, at, w);  // 16-bit rows in place
  } else {
    if constexpr (std::is_same_v<T, float>) {
      if (buf == nullptr) return DecRowsInPlace<float>(p, t, c0, max_lim, values, at, w);
    }
    // Converted (one kv head per task here: PlanBlocking groups kv heads
    // only when their rows are contiguous).
    const std::int64_t* st = values ? p.v_stride : p.k_stride;
    DecRowOffsets(p, t, c0, max_lim, 0, values, at, w);
    for (std::int64_t c = 0; c < max_lim; ++c) {
      PackRow(values ? p.v : p.k, p.kv_dtype, at[c], st[3], p.d, 1.0f, buf + c * p.d);
      at[c] = c * p.d;
    }
    return {buf, at, 0};
  }
}

template <typename T>
void DirectBlockT(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                  std::int64_t c0, std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  std::int64_t* k_at = w.k_at.data();
  std::int64_t* v_at = w.v_at.data();
  if (t.k_direct) {
    DecScores(df, p, t, max_lim, cols, DecBlockRows<T, T>(p, t, c0, max_lim, false, k_at, nullptr, w),
              w);
  } else {
    DecScores(df, p, t, max_lim, cols,
              DecBlockRows<T, float>(p, t, c0, max_lim, false, k_at, w.kt.get(), w), w);
  }
  SoftmaxBlock(df, p, t, c0, cols, w);
  if (t.v_direct) {
    DecValues(df, p, t, dp, cols, DecBlockRows<T, T>(p, t, c0, max_lim, true, v_at, nullptr, w),
              w);
  } else {
    DecValues(df, p, t, dp, cols,
              DecBlockRows<T, float>(p, t, c0, max_lim, true, v_at, w.v.get(), w), w);
  }
}

// One key block [c0, c0 + max_lim) of a direct (decode) task: scores,
// the online-softmax update, then O = alpha O + P V.
void DirectBlock(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                 std::int64_t c0, std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  switch (p.kv_dtype) {
    case DType::kBFloat16:
      DirectBlockT<bfloat16>(df, p, t, dp, c0, max_lim, cols, w);
      break;
    case DType::kFloat16:
      DirectBlockT<float16>(df, p, t, dp, c0, max_lim, cols, w);
      break;
    default:
      DirectBlockT<float>(df, p, t, dp, c0, max_lim, cols, w);
      break;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_ toggle
