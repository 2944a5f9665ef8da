// Internal, per instruction set: the score passes of the direct (decode)
// path written out for their common cases (attention_decode-inl.h's
// DecScores tries them first, for whole groups of N keys, and goes on
// with its general tiles from where they stop): rows of d = 128 at a
// fixed stride in a dense cache, one query row per kv head
// (DecScoresDenseRow) or four (DecScoresDenseTile, with the cross-pass
// prefetch), and four query rows a kv head over several kv heads side by
// side or a paged cache (DecScoresRunTiles); on AVX2 and AVX-512, the
// four-row tiles 4 x 2 and 4 x 4 (DecQuadTile). Each returns the keys it
// did (0: not its case).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_TILES_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_TILES_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_decode_rows-inl.h"
#include "kernels/attention_decode_sums-inl.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// Whether DecScoresDenseTile (rows = 4) or DecScoresDenseRow (rows = 1)
// takes a task: d = 128, K rows in place in a dense cache (key c's row at
// k.at[0] + c * k_stride[2]), no key mask, one kv head with `rows` query
// rows rr, and a prefetch distance.
HWY_INLINE bool DecStrideRows(const AttentionParams& p, const AttentionTask& t, std::int64_t ahead,
                              const DecRowRange& rr, std::int64_t rows) {
  return p.d == 128 && t.k_direct && p.key_layout != KeyLayout::kPaged && p.key_mask == nullptr &&
         DecLastKvHead(p, t) == t.kvh && rr.end - rr.begin == rows && ahead > 0;
}

// The one-row score pass (multi-head decode: one query head per kv head)
// for rows of d = 128 in any dtype, addressed by stride as
// DecScoresDenseTile below addresses its rows: 16 keys at a time
// on AVX-512 (8 on AVX2), each key's 8 vectors (16 on AVX2) in four sums
// with q's vectors from L1 (float32) or in two with q held in registers
// (16-bit rows, widened; on AVX2 the first 12 of q's 16 vectors, the rest
// from L1), the row `ahead` keys on prefetched a line at a time among
// them, as DecScoreLanes does; one transpose-add tree per group of keys.
// Against DecScoreLanes (its rows and prefetch rows looked up per group
// of keys): float32 decode 0.86-0.89x the time from memory on two
// threads, 0.82 on one, 0.81 in cache; float16 and bfloat16 0.97-1.0 from
// memory (two threads), 0.94 on one, 0.84 in cache (Zen 5, alternated
// scratch builds). The AVX2 code on a Zen 1 EPYC: float32 decode 0.93 and
// 0.96x the time, float16 0.96-0.99 (docs/performance-notes.md,
// twenty-eighth round).
//
// With `cross` (DirectBlockT's cross-pass prefetch) it prefetches key c's
// value row into L2 as it reads key c's key row, a line among each line's
// FMAs, and its own key rows ahead only where own_ahead (the task's first
// block).
template <typename TK>
HWY_INLINE std::int64_t DecScoresDenseRow(DF df, const AttentionParams& p, const AttentionTask& t,
                                          std::int64_t max_lim, std::int64_t cols,
                                          const DecRows<TK>& k, const DecCross* cross,
                                          bool own_ahead, AttentionWork& w) {
  constexpr std::int64_t kD = 128;
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const DecRowRange rr = DecRowsOfKvHead(p, t, t.kvh);
  if (!DecStrideRows(p, t, k.ahead, rr, 1)) return 0;
  constexpr bool kF32 = std::is_same_v<TK, float>;
  constexpr int C = kF32 ? 4 : 2;  // independent sums per key
  constexpr std::int64_t kVecBytes = n * static_cast<std::int64_t>(sizeof(TK));
  constexpr std::int64_t kPer = kVecBytes >= 64 ? 1 : 64 / kVecBytes;  // vectors per line
  const std::int64_t st = p.k_stride[2];
  const TK* HWY_RESTRICT base = k.base + k.at[0];
  const float* HWY_RESTRICT q = w.q.get() + rr.begin * kD;
  float* HWY_RESTRICT s = w.s.get() + rr.begin * cols;
  constexpr int kV = kDecVecs128;
  constexpr int kHeld = kF32 ? 0 : kV < 12 ? kV : 12;
  VF qh[kHeld > 0 ? kHeld : 1];
  for (int x = 0; x < kHeld; ++x) qh[x] = DecLoadHeld(df, q + x * n);
  const std::int64_t last = k.avail - 1, whole = max_lim / n * n;
  const bool own = cross == nullptr || own_ahead;
  DecWithPrefetchCache(k.to_l2, [&](auto l2_tag) {
    for (std::int64_t c = 0; c < whole; c += n) {
      VF acc[kDecLanes];
#pragma GCC unroll 16
      for (std::int64_t u = 0; u < n; ++u) {
        const TK* HWY_RESTRICT row = base + (c + u) * st;
        const char* pfr =
            own ? reinterpret_cast<const char*>(base + std::min(c + u + k.ahead, last) * st)
                : nullptr;
        const char* pfc = cross != nullptr ? cross->RowIn(c + u) : nullptr;
        VF a[C];
#pragma GCC unroll 16
        for (int x = 0; x < kV; ++x) {
          if (x % kPer == 0) {
            if (pfr != nullptr) DecPrefetchLineT<decltype(l2_tag)::value>(pfr + x * kVecBytes);
            if (pfc != nullptr) DecPrefetchLineT<true>(pfc + x * kVecBytes);
          }
          const VF qv = x < kHeld ? qh[x < kHeld ? x : 0] : hn::LoadU(df, q + x * n);
          a[x % C] = x < C ? hn::Mul(qv, DecLoadVec(df, row, x * n, kD))
                           : hn::MulAdd(qv, DecLoadVec(df, row, x * n, kD), a[x % C]);
        }
        if constexpr (C == 4) {
          acc[u] = hn::Add(hn::Add(a[0], a[1]), hn::Add(a[2], a[3]));
        } else {
          acc[u] = hn::Add(a[0], a[1]);
        }
      }
      hn::Store(DecLaneSums(df, acc), df, s + c);
    }
  });
  return whole;
}
#else
template <typename TK>
HWY_INLINE std::int64_t DecScoresDenseRow(DF, const AttentionParams&, const AttentionTask&,
                                          std::int64_t, std::int64_t, const DecRows<TK>&,
                                          const DecCross*, bool, AttentionWork&) {
  return 0;
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// DecQuadTile's FMAs at columns [x, x + N) of d = 128: four query rows q
// (stride 128) by K key rows r, r + st, ... (their dtype TK, in its read
// order, DecLoadVec) into acc[row * K + key] (set at x = 0), q's four
// vectors loaded once for the K keys (held in registers where kHeld, so
// that GCC does not fold them into each FMA).
template <int K, bool kHeld, typename TK>
HWY_INLINE void DecQuadStep(DF df, const float* HWY_RESTRICT q, const TK* HWY_RESTRICT r,
                            std::int64_t st, std::int64_t x, VF* acc) {
  constexpr std::int64_t kD = 128;
  VF qv[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    if constexpr (kHeld) {
      qv[i] = DecLoadHeld(df, q + i * kD + x);
    } else {
      qv[i] = hn::LoadU(df, q + i * kD + x);
    }
  }
#pragma GCC unroll 4
  for (int u = 0; u < K; ++u) {
    const VF kv = DecLoadVec(df, r + u * st, x, kD);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      acc[i * K + u] = x == 0 ? hn::Mul(qv[i], kv) : hn::MulAdd(qv[i], kv, acc[i * K + u]);
    }
  }
}

// DecQuadTile, the score tile of DecScoresDenseTile and DecScoresRunTiles:
// four query rows by kDecQuadKeys key rows, 4 x 4 on AVX-512 and 4 x 2 on
// AVX2, written for each.
#if HWY_TARGET <= HWY_AVX3
// AVX-512's 4 x 4 tile: query rows q (stride 128) by
// the key rows r, r + st, r + 2 st, r + 3 st (float32, d = 128) into s
// (row stride cols), 16 sums over the rows' 8 vectors, fully unrolled.
// GCC 12 takes the undefined pass-through operand of its shuffle and
// extract intrinsics (_mm512_undefined_ps) for an uninitialised read once
// the tile is inlined into a lambda (-Wmaybe-uninitialized, an error with
// POSBIAS_WERROR): off here, as Highway turns it off around its own ops.
HWY_DIAGNOSTICS(push)
HWY_DIAGNOSTICS_OFF(disable : 4701, ignored "-Wmaybe-uninitialized")
//
// pf, when not null: four rows (of 128 floats) to prefetch, a line of
// each with each chunk's FMAs (kToL2: into L2). Key rows of 16 bits (TK)
// are widened in registers (the paged and slab run tiles; pf null).
template <bool kToL2, typename TK = float>
HWY_INLINE void DecQuadTile(DF df, const float* HWY_RESTRICT q, const TK* HWY_RESTRICT r,
                            std::int64_t st, float* HWY_RESTRICT s, std::int64_t cols,
                            const char* const* pf) {
  constexpr std::int64_t kD = 128;
  VF acc[16];  // acc[row * 4 + key]
#pragma GCC unroll 8
  for (std::int64_t x = 0; x < kD; x += 16) {
    if (pf != nullptr) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) DecPrefetchLineT<kToL2>(pf[u] + x * 4);
    }
    DecQuadStep<4, false, TK>(df, q, r, st, x, acc);
  }
  // Row i's 4 key sums per 128-bit block, then the blocks summed: lane
  // 4 i + u of `out` is row i's score of key u.
  VF wr[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    wr[i] = DecQuadSums(df, DecPairSums(df, acc[4 * i], acc[4 * i + 1]),
                        DecPairSums(df, acc[4 * i + 2], acc[4 * i + 3]));
  }
  const VF a01 =
      hn::Add(hn::ConcatLowerLower(df, wr[1], wr[0]), hn::ConcatUpperUpper(df, wr[1], wr[0]));
  const VF a23 =
      hn::Add(hn::ConcatLowerLower(df, wr[3], wr[2]), hn::ConcatUpperUpper(df, wr[3], wr[2]));
  const __m512 out = _mm512_add_ps(_mm512_shuffle_f32x4(a01.raw, a23.raw, 0x88),
                                   _mm512_shuffle_f32x4(a01.raw, a23.raw, 0xDD));
  _mm_storeu_ps(s, _mm512_extractf32x4_ps(out, 0));
  _mm_storeu_ps(s + cols, _mm512_extractf32x4_ps(out, 1));
  _mm_storeu_ps(s + 2 * cols, _mm512_extractf32x4_ps(out, 2));
  _mm_storeu_ps(s + 3 * cols, _mm512_extractf32x4_ps(out, 3));
}
HWY_DIAGNOSTICS(pop)
constexpr std::int64_t kDecQuadKeys = 4;
#else
// AVX2's 4 x 2 tile: query rows q (stride 128) by the key rows r and r + st
// (float32, d = 128) into s (row stride cols), 8 sums over the rows' 16
// vectors, fully unrolled, q's four vectors of each step held in
// registers (8 sums, 4 q vectors and a key vector: 13 of the 16). pf, when
// not null: two rows to prefetch, a line with each step's FMAs (16 steps,
// 8 lines a row), into L2 where kToL2; float32 rows only. Key rows of 16
// bits (TK) are widened in registers (the paged and slab run tiles).
template <bool kToL2, typename TK = float>
HWY_INLINE void DecQuadTile(DF df, const float* HWY_RESTRICT q, const TK* HWY_RESTRICT r,
                            std::int64_t st, float* HWY_RESTRICT s, std::int64_t cols,
                            const char* const* pf) {
  constexpr std::int64_t kD = 128, n = 8;
  VF acc[8];  // acc[row * 2 + key]
#pragma GCC unroll 16
  for (std::int64_t x = 0; x < kD; x += n) {
    if (pf != nullptr) DecPrefetchLineT<kToL2>(pf[(x / n) % 2] + (x / (2 * n)) * 64);
    DecQuadStep<2, true, TK>(df, q, r, st, x, acc);
  }
  // Lane 2 i + u: row i's score of key u; rows 0 and 1 in the lower 128
  // bits, 2 and 3 in the upper.
  const __m256 out = DecLaneSums(df, acc).raw;
  const __m128 lo = _mm256_castps256_ps128(out), hi = _mm256_extractf128_ps(out, 1);
  _mm_storel_pi(reinterpret_cast<__m64*>(s), lo);
  _mm_storeh_pi(reinterpret_cast<__m64*>(s + cols), lo);
  _mm_storel_pi(reinterpret_cast<__m64*>(s + 2 * cols), hi);
  _mm_storeh_pi(reinterpret_cast<__m64*>(s + 3 * cols), hi);
}
constexpr std::int64_t kDecQuadKeys = 2;
#endif

// The grouped-query score pass for its common case, written out: four
// query rows of one kv head, float32 rows of d = 128 at a fixed stride (a
// dense cache), no key mask. kDecQuadKeys keys at a time (DecQuadTile:
// AVX-512's 4 x 4 dot products in 16 sums over the rows' 8 vectors,
// AVX2's 4 x 2 in 8 sums over 16; each key vector loaded once for the 4
// rows), fully unrolled; after the burst prefetch of the rows `ahead`
// keys on. Scores for whole groups of N keys of [0, max_lim); returns the
// keys it did (the caller does the rest).
//
// The general tiles (DecScores, DecScoreTile<4>) do the same FMAs, but
// take each tile's key rows from the offsets array, its prefetch rows from
// the group walk (NextInGroups, a clamp and a lookup per row) and prefetch
// a row of a run-time length (a computed jump into an unrolled loop). Rows
// addressed as base + c * stride and a fixed 8-line prefetch instead:
// grouped-query decode 0.89-0.95x the time from memory on two threads,
// 0.95 on one, 0.95 in cache (Zen 5, alternated scratch builds;
// docs/performance-notes.md, twenty-fifth round). The unrolled chunk loop
// and the in-block tree alone had given 0.966 of the score pass's time.
// DecScoresRunTiles below computes the same tiles for one kv head too, but
// in its place took 1.07-1.11x the time from memory and 1.13-1.26x in
// cache, even with its row pointers stepped and its next group's rows
// looked up once a group (twenty-sixth round): so this one stays.
// The AVX2 code took it (with DecPVDenseQuad) in 2026-12: on an AVX-512
// Xeon running its AVX2 code, grouped-query decode 0.90x the time from
// memory on two threads, 0.97 in L3, 0.86 in L2 on one thread, against
// the general tiles (docs/performance-notes.md, forty-sixth round).
//
// With `cross` (DirectBlockT's cross-pass prefetch) it prefetches key c's
// value row into L2 as it reads key c's key row, a line of each of the
// four rows with each chunk of the tile's FMAs (in a burst of 32 lines
// before each tile, the score pass took 1.09x the time in cache), and its
// own key rows ahead only where own_ahead (the task's first block: no
// value pass before it prefetched them).
HWY_INLINE std::int64_t DecScoresDenseTile(DF df, const AttentionParams& p, const AttentionTask& t,
                                           std::int64_t max_lim, std::int64_t cols,
                                           const DecRows<float>& k, const DecCross* cross,
                                           bool own_ahead, AttentionWork& w) {
  constexpr std::int64_t kD = 128;
  const DecRowRange rr = DecRowsOfKvHead(p, t, t.kvh);
  if (!DecStrideRows(p, t, k.ahead, rr, 4)) return 0;
  const std::int64_t st = p.k_stride[2];
  const float* HWY_RESTRICT base = k.base + k.at[0];  // dense: key c's row at base + c st
  const float* HWY_RESTRICT q = w.q.get() + rr.begin * kD;
  float* HWY_RESTRICT s = w.s.get() + rr.begin * cols;
  const std::int64_t last = k.avail - 1;
  const std::int64_t whole = max_lim / static_cast<std::int64_t>(kDecLanes) * kDecLanes;
  const bool own = cross == nullptr || own_ahead;
  DecWithPrefetchCache(k.to_l2, [&](auto l2_tag) {
    const auto prefetch_row = [](const char* pr) {
#pragma GCC unroll 8
      for (std::int64_t b = 0; b < kD * 4; b += 64)
        DecPrefetchLineT<decltype(l2_tag)::value>(pr + b);
    };
    for (std::int64_t c = 0; c < whole; c += kDecQuadKeys) {
      if (own) {
#pragma GCC unroll 4
        for (std::int64_t u = 0; u < kDecQuadKeys; ++u)
          prefetch_row(reinterpret_cast<const char*>(base + std::min(c + u + k.ahead, last) * st));
      }
      const char* pf[kDecQuadKeys];
      if (cross != nullptr) {
#pragma GCC unroll 4
        for (std::int64_t u = 0; u < kDecQuadKeys; ++u) pf[u] = cross->RowIn(c + u);
      }
      DecQuadTile<true>(df, q, base + c * st, st, s + c, cols, cross != nullptr ? pf : nullptr);
    }
  });
  return whole;
}

// The same tiles where a task holds several kv heads side by side (a paged
// cache [blocks, block_size, hk, d], or slabs [b, j, hk, d]): each group of
// 16 keys whose rows lie at one stride (within one page) is read kv head
// by kv head, four keys at a time, as the general loop walks it; the rows
// `ahead` (1 to 16: 8 on AMD, 6 on Intel) keys on in that walk are
// prefetched, the group's later keys of the same kv head or the first of
// the next place (the next kv head, or the next group's first). Stops at
// the first group that is not at one stride (the caller's general loop
// goes on from there); returns where it stopped.
// Against the general tiles, the bench's paged decode (8 kv heads a task,
// pages of 16 keys) took 0.898-0.906x the time from memory on two threads
// and 0.924 on one (Zen 5, alternated scratch builds; the dense
// grouped-query decode through the shared tile: 0.978). The row pointers,
// q and score rows stepped from place to place (not each place's looked
// up, a division among it) and the next group's rows looked up once a
// group: paged decode 0.978-1.001x the time from memory on two threads,
// 0.955 on one, 0.94 with the slab in L2 (twenty-sixth round). The AVX2
// code's 4 x 2 tiles against its general ones (an AVX-512 Xeon running its
// AVX2 code): paged decode 0.989x the time from memory, the slab 0.984,
// 0.90 with the slab in L2 on one thread (forty-sixth round).
// float16 and bfloat16 rows take them too (widened in registers), and so
// does one kv head of 16-bit rows in a dense cache (its float32 rows take
// DecScoresDenseTile): against the general tiles, with the cache in L3
// (2048 keys, two threads), a float16 grouped-query decode took 0.92x the
// time dense and 0.97x in slabs, bfloat16 in slabs 0.96x (AVX-512 code;
// AVX2 code 0.99x); from memory 1.00x (forty-seventh round).
template <typename TK>
HWY_INLINE std::int64_t DecScoresRunTiles(DF df, const AttentionParams& p, const AttentionTask& t,
                                          std::int64_t max_lim, std::int64_t cols,
                                          const DecRows<TK>& k, AttentionWork& w) {
  constexpr std::int64_t kD = 128, kN = 16;
  constexpr std::int64_t kRowBytes = kD * static_cast<std::int64_t>(sizeof(TK));
  const std::int64_t kv1 = DecLastKvHead(p, t), nkv = kv1 - t.kvh + 1;
  if (p.d != kD || !t.k_direct || p.key_mask != nullptr || k.ahead < 1 || k.ahead > kN ||
      (nkv == 1 && p.key_layout != KeyLayout::kPaged && std::is_same_v<TK, float>)) {
    return 0;  // (one kv head's float32 rows in a dense cache: DecScoresDenseTile)
  }
  // Four rows a kv head, the kv heads' rows one after another (their q
  // and score rows are stepped, not looked up per group).
  const std::int64_t r0 = DecRowsOfKvHead(p, t, t.kvh).begin;
  for (std::int64_t kv = t.kvh; kv <= kv1; ++kv) {
    const DecRowRange rr = DecRowsOfKvHead(p, t, kv);
    if (rr.end - rr.begin != 4 || rr.begin != r0 + 4 * (kv - t.kvh)) return 0;
  }
  const std::int64_t st = p.k_stride[2], last = k.avail - 1, whole = max_lim / kN * kN;
  const std::int64_t step = k.kv_step;
  // Outside a paged cache (slabs) the rows are at[c] = at[0] + c * st (no
  // key mask here): every group is at one stride.
  const bool paged = p.key_layout == KeyLayout::kPaged;
  return DecWithPrefetchCache(k.to_l2, [&](auto l2_tag) {
    std::int64_t c = 0;
    for (; c < whole; c += kN) {
      const std::int64_t a0 = k.at[c];
      bool run = true;
      for (std::int64_t u = 1; paged && u < kN; ++u) run = run && k.at[c + u] == a0 + u * st;
      if (!run) break;
      const TK* HWY_RESTRICT rows = k.base + a0;
      const float* HWY_RESTRICT q = w.q.get() + r0 * kD;
      float* HWY_RESTRICT s = w.s.get() + r0 * cols + c;
      // The next place's first `ahead` rows: this group's next kv head
      // (rows + step on), or after the last the next group's first (clamped
      // to the prefetch range).
      const TK* after[kN];
      for (std::int64_t i = 0; i < k.ahead; ++i)
        after[i] = k.base + k.at[std::min(c + kN + i, last)];
      for (std::int64_t kv = 0; kv < nkv; ++kv, rows += step, q += 4 * kD, s += 4 * cols) {
        const bool more = kv + 1 < nkv;
#pragma GCC unroll 8
        for (std::int64_t u = 0; u < kN; u += kDecQuadKeys) {
#pragma GCC unroll 4
          for (std::int64_t i = 0; i < kDecQuadKeys; ++i) {
            const std::int64_t x = u + i + k.ahead;  // the key `ahead` on, in walk order
            const TK* pr = x < kN ? rows + x * st
                           : more ? rows + step + (x - kN) * st
                                  : after[x - kN];
            const char* pb = reinterpret_cast<const char*>(pr);
#pragma GCC unroll 8
            for (std::int64_t b = 0; b < kRowBytes; b += 64)
              DecPrefetchLineT<decltype(l2_tag)::value>(pb + b);
          }
          DecQuadTile<false, TK>(df, q, rows + u * st, st, s + u, cols, nullptr);
        }
      }
    }
    return c;
  });
}

#else  // the general tiles in DecScores below
HWY_INLINE std::int64_t DecScoresDenseTile(DF, const AttentionParams&, const AttentionTask&,
                                           std::int64_t, std::int64_t, const DecRows<float>&,
                                           const DecCross*, bool, AttentionWork&) {
  return 0;  // the general tiles below
}
template <typename TK>
HWY_INLINE std::int64_t DecScoresRunTiles(DF, const AttentionParams&, const AttentionTask&,
                                          std::int64_t, std::int64_t, const DecRows<TK>&,
                                          AttentionWork&) {
  return 0;
}
#endif

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_TILES_INL_H_ toggle
