// Internal, per instruction set: the value pass of the direct (decode) path
// (attention_decode-inl.h): O = alpha O + P V in one pass over the block's
// value rows per tile of query rows, each value row read once for all the
// rows that share it. The accumulators stay in registers over the whole
// block where a tile's rows fit them, else over each group of keys
// (DecPVTile: a row wider than the tile's registers goes chunk by chunk).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_VALUES_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_VALUES_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_VALUES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_decode_rows-inl.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The P V tile of two rows: as wide as the registers allow (two rows x 4
// vectors of accumulators on AVX2's 16 registers, x 8 on AVX-512's 32:
// d = 128 in one chunk). One row: up to 16 vectors (its value vectors are
// FMA operands straight from memory), so that each value row is read
// front to back key by key, as the score pass reads the key rows; on AVX2
// (d = 128: 16 vectors) GCC keeps 14 accumulators in registers and two on
// the stack (a load, FMA and store per key each). With the row's 8 keys'
// prefetches in one burst per group (DecPVTile), the float32 decode took
// 0.78-0.83x the time of 8-vector chunks (each row's first half, then its
// second), in four in-process alternations from memory on two threads
// (Zen 3); with a prefetch before each key's loads instead, 0.87-1.07x
// depending on the minute (docs/performance-notes.md, twenty-second
// round).
constexpr int kDecPairVecs = 2 * kAttnVecs;
constexpr int kDecRowVecs = 16;
// Four rows (grouped query heads of one kv head): 4 x 2 vectors of
// accumulators on AVX2, 4 x 4 on AVX-512, so the value rows are read from
// memory once for the four rows (as pairs, the second pair read them
// again from L2).
constexpr int kDecQuadVecs = kAttnVecs;
// Keys per group of a P V tile whose row needs several chunks of columns
// (DecPVTile): 4 KiB of float32 rows at d = 128.
constexpr std::int64_t kDecPVGroup = 8;
// Keys per group of the four- and two-row tiles where their chunk is
// narrower than 64 columns (AVX2: 4 rows x 2 vectors, 2 rows x 4): the 8
// accumulators are loaded and stored once per 4 keys instead of after
// every key, where 64 stores per key (d = 128) had most of the value
// pass's samples. Alternated against one key at a time (Zen 3, AVX2,
// d 128, float32), four rows (decode_gqa, h 32 on 8 kv heads): 0.73x the
// time with the cache in L2 (256 keys, one thread), 0.86x in L3 (2048
// keys, two threads), 0.998x from memory (32768 keys, where the read holds
// it), paged_decode 0.91x; 2 keys: 0.90x, 0.88x and 1.02x. Two rows
// (decode_gqa2, h 32 on 16 kv heads): 0.87x in L3 (256 keys, one thread),
// 0.96x from memory; groups of 7 (decode_gqa7, h 28 on 4: tiles of 4, 2
// and 1 rows) 0.91x and 0.95x. (Four rows of d = 128 in a dense cache go
// through DecPVDenseQuad since 2026-12-07, and a paged cache's several
// kv heads through DecValuesKeyMajor, in groups of 4 too; these groups are
// a key mask's and other widths'. Groups of 8 for the paged decode's
// four-row tiles on AVX2: 1.009x the time, forty-sixth round.)
constexpr std::int64_t kDecGroupKeys = 4;
// Whether one row of float32 values walks its keys one at a time (AVX-512;
// DecPVTile's kRowByKey and DecValues' DecPVDenseRow for float32).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kDecF32RowByKey = true;
#else
constexpr bool kDecF32RowByKey = false;
#endif

// O[RB rows][x, x + kVW N) += P[RB rows][keys [0, count)] V[keys] with
// the accumulators in registers over all the keys: key g's value row is
// row_of(g) (its dtype), its weights pw[r * ldp + g]; before(g) runs
// before key g's loads (a prefetch, or nothing). count is a std::int64_t
// or, for a group unrolled key by key, a std::integral_constant.
template <int RB, int kVW, typename TV, class Count, class RowOf, class Before>
HWY_INLINE void DecPVChunk(DF df, const float* HWY_RESTRICT pw, std::int64_t ldp, Count count,
                           const RowOf& row_of, const Before& before, std::int64_t x,
                           float* HWY_RESTRICT o, std::int64_t dp) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  // The chunks of DecPVTile's columns: one of kVW even starts at a
  // multiple of 2N, its vectors whole blocks of a 16-bit row's read order
  // (DecLoadVec); one of a single vector is the row's last whole vector,
  // read in element order.
  static_assert(kVW == 1 || kVW % 2 == 0, "chunks of 1 or an even number of vectors");
  constexpr std::int64_t kEnd = kVW == 1 ? n : kVW * n;
  VF acc[RB][kVW];
  for (int r = 0; r < RB; ++r) {
    for (int u = 0; u < kVW; ++u) acc[r][u] = hn::LoadU(df, o + r * dp + x + u * n);
  }
  const auto key = [&](std::int64_t g) {
    before(g);
    const TV* HWY_RESTRICT row = row_of(g) + x;
    if constexpr (RB == 1) {
      // Each vector straight into its FMA: loaded (or widened) all first,
      // the 16 widened vectors of a 16-bit row went through the stack.
      const VF pv = hn::Set(df, pw[g]);
      for (int u = 0; u < kVW; ++u)
        acc[0][u] = hn::MulAdd(pv, DecLoadVec(df, row, u * n, kEnd), acc[0][u]);
    } else {
      VF vv[kVW];
      for (int u = 0; u < kVW; ++u) vv[u] = DecLoadVec(df, row, u * n, kEnd);
      for (int r = 0; r < RB; ++r) {
        const VF pv = hn::Set(df, pw[r * ldp + g]);
        for (int u = 0; u < kVW; ++u) acc[r][u] = hn::MulAdd(pv, vv[u], acc[r][u]);
      }
    }
  };
  if constexpr (std::is_integral_v<Count>) {
    for (std::int64_t g = 0; g < count; ++g) key(g);
  } else {
#pragma GCC unroll 16
    for (std::int64_t g = 0; g < Count::value; ++g) key(g);
  }
  for (int r = 0; r < RB; ++r) {
    for (int u = 0; u < kVW; ++u) hn::StoreU(acc[r][u], df, o + r * dp + x + u * n);
  }
}

// chunk(width_tag, x) for the chunks of W, W / 2, ..., 1 vectors that fit
// in d from column x on, in that order (the rest of d after the widest
// chunks: at most one of each width).
template <int W, class Chunk>
HWY_INLINE void DecHalvingChunks(std::int64_t d, std::int64_t x, const Chunk& chunk) {
  if constexpr (W >= 1) {
    constexpr auto n = static_cast<std::int64_t>(kDecLanes);
    if (x + W * n <= d) {
      chunk(std::integral_constant<int, W>(), x);
      x += W * n;
    }
    DecHalvingChunks<W / 2>(d, x, chunk);
  }
}

// chunk(vw_tag, x) over the whole vectors of d: VW at a time, then the
// rest in halving widths (VW / 2, ..., 1; one chunk of each at most).
template <int VW, class Chunk>
HWY_INLINE void DecPVColumns(std::int64_t d, const Chunk& chunk) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  std::int64_t x = 0;
  for (; x + VW * n <= d; x += VW * n) chunk(std::integral_constant<int, VW>(), x);
  DecHalvingChunks<VW / 2>(d, x, chunk);
}

// O[RB rows][whole vectors of d] += P[RB rows][keys [0, G)] V[rows[g]]
// (P rows of stride ldp, O rows dp): each chunk of columns (DecPVColumns)
// over the G keys unrolled, their accumulators in registers over them.
template <int RB, int VW, std::int64_t G, typename TV>
HWY_INLINE void DecPVGroup(DF df, const float* HWY_RESTRICT pw, std::int64_t ldp,
                           const TV* const* rows, std::int64_t d, float* HWY_RESTRICT o,
                           std::int64_t dp) {
  DecPVColumns<VW>(d, [&](auto vw_tag, std::int64_t x) {
    DecPVChunk<RB, decltype(vw_tag)::value, TV>(
        df, pw, ldp, std::integral_constant<std::int64_t, G>(),
        [&](std::int64_t g) { return rows[g]; }, [](std::int64_t) {}, x, o, dp);
  });
}

// O[RB rows][columns ...] += P[RB rows][keys [0, count)] V[keys], key c's
// value row at base + at[c] (its dtype): VW vectors of d at a time, then
// chunks of halving widths, each chunk's accumulators in registers over
// all the keys (several rows whose d is one chunk) or over each group of
// keys (one row, or d in several chunks), then the last d % N columns one
// by one. P rows have stride ldp, O rows dp. pf, when not null, is the
// block's rows (at = pf->at + c_first): the passes prefetch ahead.
template <int RB, int VW, typename TV>
HWY_INLINE void DecPVTile(DF df, const float* HWY_RESTRICT pw, std::int64_t ldp,
                          const TV* HWY_RESTRICT base, const std::int64_t* HWY_RESTRICT at,
                          std::int64_t count, std::int64_t d, float* HWY_RESTRICT o,
                          std::int64_t dp, const DecRows<TV>* pf, std::int64_t c_first) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const std::int64_t row_bytes = d * static_cast<std::int64_t>(sizeof(TV));
  // Keys [c0, c1) through at[], the first chunk of columns prefetching.
  const auto keys = [&](std::int64_t c0, std::int64_t c1) {
    DecPVColumns<VW>(d, [&](auto vw_tag, std::int64_t x) {
      const bool prefetch = pf != nullptr && x == 0;
      DecPVChunk<RB, decltype(vw_tag)::value, TV>(
          df, pw + c0, ldp, c1 - c0, [&](std::int64_t g) { return base + at[c0 + g]; },
          [&](std::int64_t g) {
            if (prefetch) DecPrefetchRow(pf->Ahead(base, c_first + c0 + g), row_bytes, pf->to_l2);
          },
          x, o, dp);
    });
  };
  const std::int64_t vecs = d / n;
  // On AVX-512 one row of float32 values walks its keys one at a time, a
  // prefetch before each key's loads, where its whole vectors fit one
  // chunk (d = 128: 8 vectors): against the group's prefetches in one
  // burst, the float32 decode took 0.87-0.90x the time (Zen 5, from
  // memory, two threads, five in-process alternations), 16-bit rows
  // 0.97-1.05 (no change kept). On AVX2 the bursts stay (Zen 3: 0.78-0.83x
  // the time of a prefetch per key, see kDecRowVecs), though that code on
  // the Zen 5 also ran 0.91x with a prefetch per key: which wins depends on
  // the core, and AVX2 stands for the older ones (docs/performance-notes.md,
  // twenty-third round).
  // GCC 12 emits no prefetch at all in this walk (its AVX-512 code,
  // objdump of the Release build, 2026-12-02): the float32 decode measured
  // here ran without one. A dense cache's float32 rows now go through
  // DecPVDenseRow, which prefetches where this CPU gains by it
  // (f32_value_prefetch); this walk stays for the others (paged, masked).
  constexpr bool kRowByKey = RB == 1 && std::is_same_v<TV, float> && kDecF32RowByKey;
  if ((RB > 1 || kRowByKey) && vecs <= VW && (vecs & (vecs - 1)) == 0) {  // one chunk
    keys(0, count);
  } else {
    // One row (in groups of keys, the group's prefetches in one burst,
    // see kDecRowVecs; float32 on AVX-512 goes above), or a row wider
    // than the tile's accumulators (d = 128 on AVX2 for two or four rows:
    // 16 vectors, 4 or 2 held per row), or of a width that takes several
    // chunks: groups of keys, each chunk of columns over them, so the
    // later chunks find the rows in L1 and the memory sees each row read
    // front to back.
    // Each chunk over all the keys (a stride of one row in memory, the
    // later chunks from L2) read 0.85x as fast (a Zen 3, a sum over the
    // same bytes both ways).
    //
    // A whole group's keys are unrolled: their rows' addresses and
    // prefetches once per group, not once per key and chunk, with no
    // branch per key (the grouped-query tile ran about 25 instructions
    // per key and chunk around its 8 FMAs, its P row pointers reloaded
    // from the stack). One row, and a chunk of 64 columns or more
    // (AVX-512's four-row tile: 4 lines of float32 per row and chunk; its
    // stores per key are not measured there), take
    // kDecPVGroup keys. Narrower chunks (AVX2: two rows x 4 vectors,
    // four rows x 2) read two or one lines of each row per chunk, so a
    // group of G keys has the memory see G interleaved streams: with 8, a
    // stand-alone probe of the four-row tile's value pass read 0.65x as
    // fast (8.3 against 12.7 GB/s, one thread, Zen 3). They take
    // kDecGroupKeys (see there).
    // Several rows with a chunk of 64 columns or more (AVX-512's
    // four-row tile) take the group this CPU reads fastest (4 or 8 keys,
    // decode_prefetch.h) when they read from memory (pf).
    const auto groups = [&](auto group_tag) {
      constexpr std::int64_t kGroup = decltype(group_tag)::value;
      std::int64_t c = 0;
      for (; c + kGroup <= count; c += kGroup) {
        const TV* rows[kGroup];
        for (std::int64_t g = 0; g < kGroup; ++g) {
          rows[g] = base + at[c + g];
          if (pf != nullptr) DecPrefetchRow(pf->Ahead(base, c_first + c + g), row_bytes, pf->to_l2);
        }
        DecPVGroup<RB, VW, kGroup>(df, pw + c, ldp, rows, d, o, dp);
      }
      if (c < count) keys(c, count);
    };
    constexpr std::int64_t kGroup =
        RB == 1 || VW * static_cast<int>(kDecLanes) >= 64 ? kDecPVGroup : kDecGroupKeys;
    if constexpr (RB > 1 && kGroup == kDecPVGroup) {
      if (pf != nullptr && pf->value_group == 4) {
        groups(std::integral_constant<std::int64_t, 4>());
      } else {
        groups(std::integral_constant<std::int64_t, kGroup>());
      }
    } else {
      groups(std::integral_constant<std::int64_t, kGroup>());
    }
  }
  for (std::int64_t x = d - d % n; x < d; ++x) {
    for (int r = 0; r < RB; ++r) {
      float sum = o[r * dp + x];
      for (std::int64_t c = 0; c < count; ++c) sum += pw[r * ldp + c] * AttnToF(base[at[c] + x]);
      o[r * dp + x] = sum;
    }
  }
}

// The one-row P V tile of 16-bit value rows (float32 too on AVX-512) of
// d = 128 in place at a fixed stride (a dense cache, no key mask) on
// AVX-512 and AVX2, written out:
// keys [c0, c1) of the block one at a time, the 8 vectors of O (16 on
// AVX2, two of them on the stack) in registers over all of them; key
// c's row at base + v.at[0] + c * stride, its weight pw[c]; when
// `prefetch`, the row `ahead` keys on before each key's loads
// (row_bytes long, a run-time length as DecPVTile's: with the prefetch
// loops fully unrolled, the value passes ran slower, a four-row tile's 64
// prefetches per 8 keys 1.03x the time, float16 decode with every row's
// prefetch unrolled 1.24-1.29x).
// Against DecPVTile's groups of 8 keys (rows from the offsets array, the
// group's prefetches in one burst), float16 and bfloat16 decode took
// 0.92-0.95x the time from memory on two threads (Zen 5, alternated
// scratch builds; DecPVTile walking them key by key instead: 0.98-1.03).
// On AVX2 (a Zen 1 EPYC, with the AVX2 DecScoresDenseRow) float16 and
// bfloat16 decode took 0.87 and 0.85x the time of DecPVTile's groups of 8
// keys with their bursts of prefetches (twenty-eighth round).
// float32 rows had stayed with DecPVTile's own key-by-key walk
// (kRowByKey): this tile took 1.05-1.2x its time (docs/performance-notes.md,
// twenty-fifth round), a walk that GCC compiles without its prefetch (see
// there). Now float32 rows on AVX-512 come here too, prefetching only
// where f32_value_prefetch says (a Zen 4: 0.90-0.93x the time of the walk,
// twenty-ninth round); elsewhere without, as that walk ran.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kDecDenseRowValues = true;
#else
constexpr bool kDecDenseRowValues = false;
#endif
//
// next (DirectBlockT's cross-pass prefetch), when not null: the next
// block's key rows, key c's prefetched into L2 before key c's loads (a
// line among each line's FMAs) instead of the row `ahead` (none where
// next->rows is null: the task's last block).
template <typename TV>
HWY_INLINE void DecPVDenseRow(DF df, const float* HWY_RESTRICT pw, const TV* base,
                              const DecRows<TV>& v, std::int64_t stride, std::int64_t c0,
                              std::int64_t c1, bool prefetch, std::int64_t row_bytes,
                              const DecCross* next, float* HWY_RESTRICT o) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  constexpr int kV = kDecVecs128;
  constexpr std::int64_t kVecBytes = n * static_cast<std::int64_t>(sizeof(TV));
  constexpr std::int64_t kPer = kVecBytes >= 64 ? 1 : 64 / kVecBytes;  // vectors per line
  const TV* HWY_RESTRICT rows = base + v.at[0];
  const std::int64_t last = v.avail - 1;
  VF acc[kV];
#pragma GCC unroll 16
  for (int u = 0; u < kV; ++u) acc[u] = hn::LoadU(df, o + u * n);
  const bool own = next == nullptr && prefetch;
  const bool cross = next != nullptr && next->rows != nullptr;
  for (std::int64_t c = c0; c < c1; ++c) {
    if (own) DecPrefetchRow(rows + std::min(c + v.ahead, last) * stride, row_bytes, v.to_l2);
    const char* pr = cross ? next->Row(c) : nullptr;
    const TV* HWY_RESTRICT row = rows + c * stride;
    const VF pv = hn::Set(df, pw[c]);
#pragma GCC unroll 16
    for (int u = 0; u < kV; ++u) {
      if (pr != nullptr && u % kPer == 0) DecPrefetchLineT<true>(pr + u * kVecBytes);
      acc[u] = hn::MulAdd(pv, DecLoadVec(df, row, u * n, kV * n), acc[u]);
    }
  }
#pragma GCC unroll 16
  for (int u = 0; u < kV; ++u) hn::StoreU(acc[u], df, o + u * n);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// The four-row P V tile of float32 value rows of d = 128 in place at a
// fixed stride (a dense cache, no key mask) on AVX-512 and AVX2, with the
// cross-pass prefetch (DirectBlockT, DecCross): keys [c0, c1) of the
// block (key c's row at rows + c * stride, row r's weight pw[r * ldp +
// c]) in runs of kDecQuadRun keys, each chunk of kDecQuadCols columns
// (AVX-512: halves of 64, 4 rows x 4 vectors of accumulators; AVX2:
// eighths of 16, 4 rows x 2 vectors; in registers over the run) over the
// run in turn, the later chunks' rows from L1. While it reads chunk x of
// key c's row it prefetches chunk x of `next`'s row c into L2 (the next
// block's key rows: 4 lines, or 1), so the prefetches go evenly among the
// FMAs, none in a burst. In cache (one thread, 128 keys) the grouped-query decode took
// 0.93x the time with it than with DecPVTile's four-row groups (each
// prefetching its own rows ahead; docs/performance-notes.md,
// thirty-seventh round).
constexpr std::int64_t kDecQuadRun = 16;
constexpr std::int64_t kDecQuadCols = HWY_TARGET <= HWY_AVX3 ? 64 : 16;
// base as float32 rows (null for another dtype): DecValues calls
// DecPVDenseQuad in a branch its float32 instantiation alone takes, and
// Clang checks that call's arguments in a generic lambda for every dtype.
template <typename T>
HWY_INLINE const float* DecFloatRows(const T* base) {
  if constexpr (std::is_same_v<T, float>) {
    return base;
  } else {
    (void)base;
    return nullptr;
  }
}
HWY_INLINE void DecPVDenseQuad(DF df, const float* HWY_RESTRICT pw, std::int64_t ldp,
                               const float* HWY_RESTRICT rows, std::int64_t stride, std::int64_t c0,
                               std::int64_t c1, const DecCross& next, float* HWY_RESTRICT o,
                               std::int64_t dp) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  constexpr int kW = static_cast<int>(kDecQuadCols / n);  // vectors of a chunk
  for (std::int64_t r0 = c0; r0 < c1; r0 += kDecQuadRun) {
    const std::int64_t r1 = std::min(r0 + kDecQuadRun, c1);
#pragma GCC unroll 1
    for (std::int64_t x = 0; x < 128; x += kDecQuadCols) {
      VF acc[4][kW];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
        for (int u = 0; u < kW; ++u) acc[r][u] = hn::LoadU(df, o + r * dp + x + u * n);
      }
      for (std::int64_t c = r0; c < r1; ++c) {
        const float* HWY_RESTRICT row = rows + c * stride + x;
        const char* pr = next.rows != nullptr ? next.Row(c) + x * 4 : nullptr;
        VF vv[kW];
#pragma GCC unroll 4
        for (int u = 0; u < kW; ++u) {
          if (pr != nullptr && u * n * 4 % 64 == 0) DecPrefetchLineT<true>(pr + u * n * 4);
          vv[u] = hn::LoadU(df, row + u * n);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const VF pv = hn::Set(df, pw[r * ldp + c]);
#pragma GCC unroll 4
          for (int u = 0; u < kW; ++u) acc[r][u] = hn::MulAdd(pv, vv[u], acc[r][u]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
        for (int u = 0; u < kW; ++u) hn::StoreU(acc[r][u], df, o + r * dp + x + u * n);
      }
    }
  }
}
#endif

// The value pass of a task of several kv heads whose rows of one key lie
// side by side (a paged cache [blocks, block_size, hk, d], slabs [b, j,
// hk, d]), key-major: each group of 4 keys for every kv head in turn (its
// four, two and one-row tiles, DecPVGroup), so that the memory sees each
// key's value rows of all the task's kv heads front to back, a page read
// as one stream; each kv head's rows `ahead` keys on prefetched as it
// reads its group. Walking each kv head over the block's keys instead
// (DecPVTile), a pass read one row in every hk and each stretch of memory
// hk times over: in the paged decode walk of posbias-probe-decode-walk
// (8 kv heads), key-major read 1.09x as fast in the AVX2 code and 1.26x in
// the AVX-512 code; the bench's paged decode took 0.95x the time in the
// AVX-512 code and 0.97x in the AVX2 code (an AVX-512 Xeon, from memory on
// two threads, alternated in one build). Groups of 8 or 2 keys, the rows 3
// or 12 keys on, or into L1 instead of L2 were no faster. The score pass
// keeps its order (its pages of 16 keys kv head by kv head,
// DecScoresRunTiles): its tiles key-major took 1.01x and 1.03x the time
// (docs/performance-notes.md, forty-seventh round). Needs rows that all
// see the same keys (decode), no key mask, whole vectors of d; returns
// whether it ran.
template <typename TV>
HWY_INLINE bool DecValuesKeyMajor(DF df, const AttentionParams& p, const AttentionTask& t,
                                  std::int64_t dp, std::int64_t cols, const DecRows<TV>& v,
                                  AttentionWork& w) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const std::int64_t nkv = DecLastKvHead(p, t) - t.kvh + 1;
  if (nkv < 2 || p.key_mask != nullptr || p.d % n != 0) return false;
  const std::int64_t from = w.first[0], to = w.lim[0];
  for (std::size_t r = 1; r < static_cast<std::size_t>(t.rows); ++r) {
    if (w.first[r] != from || w.lim[r] != to) return false;
  }
  const float* s = w.s.get();
  float* o = w.o.get();
  const std::int64_t row_bytes = p.d * static_cast<std::int64_t>(sizeof(TV));
  const auto group = [&](auto keys_tag, std::int64_t c) {
    constexpr std::int64_t G = decltype(keys_tag)::value;
    const TV* rows[G];
    for (std::int64_t g = 0; g < G; ++g) rows[g] = v.base + v.at[c + g];
    for (std::int64_t kv = 0; kv < nkv; ++kv) {
      const TV* base = v.base + kv * v.kv_step;
      if (v.ahead > 0) {
        for (std::int64_t g = 0; g < G; ++g)
          DecPrefetchRow(v.Ahead(base, c + g), row_bytes, v.to_l2);
      }
      const DecRowRange rr = DecRowsOfKvHead(p, t, t.kvh + kv);
      std::int64_t r = rr.begin;
      for (; r + 4 <= rr.end; r += 4)
        DecPVGroup<4, kDecQuadVecs, G>(df, s + r * cols + c, cols, rows, p.d, o + r * dp, dp);
      for (; r + 2 <= rr.end; r += 2)
        DecPVGroup<2, kDecPairVecs, G>(df, s + r * cols + c, cols, rows, p.d, o + r * dp, dp);
      for (; r < rr.end; ++r)
        DecPVGroup<1, kDecRowVecs, G>(df, s + r * cols + c, cols, rows, p.d, o + r * dp, dp);
      for (std::int64_t g = 0; g < G; ++g) rows[g] += v.kv_step;
    }
  };
  std::int64_t c = from;
  for (; c + 4 <= to; c += 4) group(std::integral_constant<std::int64_t, 4>(), c);
  for (; c < to; ++c) group(std::integral_constant<std::int64_t, 1>(), c);
  return true;
}

// O = alpha O + P V for every row of the task over the block's keys,
// each row over its own visible keys [first, lim) only (a NaN in a value
// it cannot see never reaches it; neither are the keys the key mask hides
// read). A tile walks all its keys (DecPVTile: its accumulators in
// registers over the block, or over each group of keys where a row is
// wider than them): several rows together over the keys all see, then
// each row's own others (ForCommonKeys, as the blocked path's PVRows).
// With one row, storing O every few keys held back the next value loads
// (the stores wait on the loads of their group): 1.3x the time of the
// value pass on a Zen 5.
// The first tile of a kv head reads the block's value rows from memory,
// the others from L2.
//
// k_next (DirectBlockT's cross-pass prefetch): the four-row tiles of
// float32 rows go through DecPVDenseQuad and the one-row tiles through
// DecPVDenseRow, prefetching the next block's key rows (none where
// k_next->rows is null) instead of their own rows.
template <typename TV>
void DecValues(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
               std::int64_t cols, const DecRows<TV>& v, AttentionWork& w,
               const DecCross* k_next = nullptr) {
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
  if (DecValuesKeyMajor(df, p, t, dp, cols, v, w)) return;
  const float* keep = p.key_mask != nullptr ? w.keep.get() : nullptr;
  // DecPVDenseRow's rows (used for one-row tiles of 16-bit values, and of
  // float32 values on AVX-512).
  const bool dense_row =
      p.d == 128 && t.v_direct && p.key_layout != KeyLayout::kPaged && p.key_mask == nullptr;
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
        bool done = false;
        constexpr bool kF32 = std::is_same_v<TV, float>;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
        if constexpr (R == 4 && kF32) {
          if (k_next != nullptr && dense_row) {
            DecPVDenseQuad(df, s + r * cols, cols, DecFloatRows(base) + v.at[0], p.v_stride[2], c,
                           e, first_rows ? *k_next : DecCross(), o + r * dp, dp);
            done = true;
          }
        }
#endif
        if constexpr (R == 1 && kDecDenseRowValues && (!kF32 || kDecF32RowByKey)) {
          if (dense_row) {
            const bool ahead = first_rows && v.ahead > 0 && (!kF32 || v.f32_value_prefetch);
            DecPVDenseRow(df, s + r * cols, base, v, p.v_stride[2], c, e, ahead,
                          p.d * static_cast<std::int64_t>(sizeof(TV)),
                          k_next != nullptr && first_rows ? k_next : nullptr, o + r * dp);
            done = true;
          }
        }
        if (!done) {
          DecPVTile<R, kVW>(df, s + r * cols + c, cols, base, v.at + c, e - c, p.d, o + r * dp, dp,
                            first_rows && v.ahead > 0 ? &v : nullptr, c);
        }
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

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_VALUES_INL_H_ toggle
