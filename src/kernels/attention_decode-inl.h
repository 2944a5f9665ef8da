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
//
// Here: the score pass and the block step (DirectBlock). Where the rows
// are read and prefetched: attention_decode_rows-inl.h; the transpose-add
// tree of the score tiles: attention_decode_sums-inl.h; the score tiles
// written out for the common cases (d = 128 at a fixed stride, four rows
// a kv head): attention_decode_tiles-inl.h; the value pass:
// attention_decode_values-inl.h.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_decode_rows-inl.h"
#include "kernels/attention_decode_sums-inl.h"
#include "kernels/attention_decode_tiles-inl.h"
#include "kernels/attention_decode_values-inl.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Vectors of q a one-row score pass holds in registers with its N
// accumulators: 8 + 16 of AVX-512's 32 registers, 4 + 8 of AVX2's 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kDecQVecs = 8;
#else
constexpr int kDecQVecs = 4;
#endif

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
// read the same way, with q's vectors from L1 (a 16-bit row's first 12
// from registers): fewer instructions between a thread's loads keep more
// of its lines in flight (docs/performance-notes.md, fourteenth round).
template <typename TK>
HWY_INLINE void DecScoreLanes(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                              const TK* const* kr, const TK* const* pf, bool to_l2,
                              float* HWY_RESTRICT s) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  VF acc[kDecLanes];
  for (auto& a : acc) a = hn::Zero(df);
  const std::int64_t whole = d - d % n;
  // The prefetches go with the first chunk's loads, key by key.
  const auto prefetch = [&](std::size_t u) {
    DecPrefetchRow(pf[u], d * static_cast<std::int64_t>(sizeof(TK)), to_l2);
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
      // (A chunk of V even starts at a multiple of 2N, its vectors whole
      // blocks of the read order; V = 1 is the row's last whole vector.)
      constexpr std::int64_t kEnd = V == 1 ? n : V * n;
      for (int v = 0; v < V; ++v) a = hn::MulAdd(qv[v], DecLoadVec(df, row, v * n, kEnd), a);
      acc[u] = a;
    }
  };
  // float32 rows of 8 vectors take the unrolled path below even where q
  // fits the registers: on AVX-512 (d = 128) its four short sums per
  // key with q from L1 took 0.97x the time of q held in registers with one
  // 8-FMA chain per key (float32 decode from memory, two threads, Zen 5,
  // three in-process alternations; 16-bit rows: 0.998-1.02, so they keep
  // q in registers; docs/performance-notes.md, twenty-third round).
  constexpr bool kF32 = std::is_same_v<TK, float>;
  if (whole > kDecQVecs * n || (kF32 && d == 8 * n)) {
    // A row wider than q's registers (d = 128 on AVX2: 16 vectors, 4 in
    // registers): key by key, each row front to back with q's vectors
    // loaded again from L1 (two loads per FMA, two sums per key for the
    // FMA latency). Chunk by chunk across the N rows instead, the memory
    // saw a stride of one row and read 0.85-0.9x as fast (a Zen 3, a
    // sum over the same bytes in each order).
    // The common widths (d = 64 and 128 on AVX2) fully unrolled (four
    // sums per key for float32 rows): the loop over a runtime d ran two
    // dependent sums of eight FMAs per key, with a branch per two vectors.
    const auto fixed = [&](auto vecs_tag) {
      constexpr int W = decltype(vecs_tag)::value;
      // 16-bit rows: q's first H vectors in registers for all N keys (12
      // of AVX2's 16, beside two sums and a loaded q vector), the rest
      // from L1. A 16-bit row's vectors are widened before their FMA, so
      // that each of q's loads was an instruction of its own (a float32
      // row's vectors are the FMAs' memory operands, with q's from L1).
      // Fewer instructions per line keep more lines in flight (docs/
      // performance-notes.md, fourteenth round): from memory, two threads
      // (Zen 3), float16 decode 0.90-0.97x the time, bfloat16 0.92-1.02
      // (4 runs each). float32 rows keep q in L1 and four sums: 0.93-1.04
      // with q in registers (3 runs), no gain.
      constexpr int H = std::is_same_v<TK, float> ? 0 : W < 12 ? W : 12;
      constexpr int C = H == 0 ? 4 : 2;  // independent sums per key
      VF qh[H > 0 ? H : 1];
      for (int v = 0; v < H; ++v) qh[v] = DecLoadHeld(df, q + v * n);
      // (With H = 0 qh is never read: GCC at -O1 saw a read it could not
      // rule out and warned that qh may be uninitialized.)
      const auto qvec = [&](int v) {
        if constexpr (H > 0) {
          if (v < H) return qh[v];
        }
        return hn::LoadU(df, q + v * n);
      };
#pragma GCC unroll 16
      for (std::size_t u = 0; u < kDecLanes; ++u) {
        // The row `ahead` keys on is prefetched a line at a time among
        // this row's FMAs, not all its lines before them: float32 decode
        // 0.94, 0.98 and 0.96x the time on AVX-512 (Zen 5, from memory, 10-12
        // alternated rounds of scratch builds; 1.02 with the cache in L3),
        // 0.98-0.99 for the AVX2 code's float32 and float16 decodes there
        // (docs/performance-notes.md, twenty-third round).
        constexpr int kVecBytes = static_cast<int>(kDecLanes * sizeof(TK));
        constexpr int kPer = kVecBytes >= 64 ? 1 : 64 / kVecBytes;
        const char* pfr = pf != nullptr ? reinterpret_cast<const char*>(pf[u]) : nullptr;
        const TK* HWY_RESTRICT row = kr[u];
        VF a[C];
#pragma GCC unroll 16
        for (int v = 0; v < C; ++v) {
          if (pfr != nullptr && v % kPer == 0) DecPrefetchLine(pfr + v * kVecBytes, to_l2);
          a[v] = hn::Mul(qvec(v), DecLoadVec(df, row, v * n, W * n));
        }
#pragma GCC unroll 16
        for (int v = C; v < W; ++v) {
          if (pfr != nullptr && v % kPer == 0) DecPrefetchLine(pfr + v * kVecBytes, to_l2);
          a[v % C] = hn::MulAdd(qvec(v), DecLoadVec(df, row, v * n, W * n), a[v % C]);
        }
        if constexpr (C == 4) {
          acc[u] = hn::Add(hn::Add(a[0], a[1]), hn::Add(a[2], a[3]));
        } else {
          acc[u] = hn::Add(a[0], a[1]);
        }
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
        VF a0 = hn::Mul(hn::LoadU(df, q), DecLoadVec(df, row, 0, d));
        VF a1 = hn::Zero(df);
        std::int64_t y = n;
        for (; y + 2 * n <= whole; y += 2 * n) {
          a1 = hn::MulAdd(hn::LoadU(df, q + y), DecLoadVec(df, row, y, d), a1);
          a0 = hn::MulAdd(hn::LoadU(df, q + y + n), DecLoadVec(df, row, y + n, d), a0);
        }
        if (y < whole) a1 = hn::MulAdd(hn::LoadU(df, q + y), DecLoadVec(df, row, y, d), a1);
        acc[u] = hn::Add(a0, a1);
      }
    }
  } else {
    std::int64_t x = 0;
    for (; x + kDecQVecs * n <= whole; x += kDecQVecs * n) {
      chunk(std::integral_constant<int, kDecQVecs>(), x);
    }
    for (; x + 2 * n <= whole; x += 2 * n) chunk(std::integral_constant<int, 2>(), x);
    if (x < whole) chunk(std::integral_constant<int, 1>(), x);
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
                             const TK* const* kr, const TK* const* pf, bool to_l2,
                             float* HWY_RESTRICT s, std::int64_t lds) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  constexpr std::size_t kKeys = kDecLanes / R;
  static_assert(R > 1 && kKeys * R == kDecLanes, "R > 1 divides the lanes");
  if (pf != nullptr) {
    for (std::size_t u = 0; u < kKeys; ++u) {
      DecPrefetchRow(pf[u], d * static_cast<std::int64_t>(sizeof(TK)), to_l2);
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
        const VF kv = DecLoadVec(df, kr[u], 0, d);
        for (int r = 0; r < R; ++r) acc[r * kKeys + u] = hn::Mul(qv[r], kv);
      }
    }
    for (std::int64_t x = n; x < whole; x += n) {
      VF qv[R];
      // q's vectors in registers: GCC otherwise folded each into its
      // kKeys FMAs as a memory operand, 10 loads per 8 FMAs on AVX2 where
      // 6 do. In cache, one thread, a grouped-query decode took 0.87x the
      // time (Zen 3).
      for (int r = 0; r < R; ++r) qv[r] = DecLoadHeld(df, q + r * d + x);
      for (std::size_t u = 0; u < kKeys; ++u) {
        const VF kv = DecLoadVec(df, kr[u], x, d);
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

// S = (scale q) K^T for every row of the task over the block's first
// max_lim keys (on AVX2 and AVX-512 the common cases go first, for whole
// groups of N keys: DecScoresDenseTile for four rows of one kv head in a
// dense cache, DecScoresRunTiles for four rows a kv head over several kv
// heads side by side or a paged cache, or of one kv head's 16-bit rows,
// DecScoresDenseRow for one row):
// N keys at a time for each kv head's rows (so a group's K
// rows, all heads of a key position side by side in a paged cache, are
// read from memory once and by the other rows from L1). Columns past
// max_lim up to a whole vector get the scores of key 0 (masked later).
// cross, own_ahead: DecScoresDenseTile's cross-pass prefetch.
template <typename TK>
void DecScores(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t max_lim,
               std::int64_t cols, const DecRows<TK>& k, AttentionWork& w,
               const DecCross* cross = nullptr, bool own_ahead = true) {
  constexpr auto n = static_cast<std::int64_t>(kDecLanes);
  const std::int64_t d = p.d, kv1 = DecLastKvHead(p, t), nkv = kv1 - t.kvh + 1;
  const TK* kr[kDecLanes];
  const TK* pf[kDecLanes] = {};
  std::int64_t done = 0;
  if constexpr (std::is_same_v<TK, float>) {
    done = DecScoresDenseTile(df, p, t, max_lim, cols, k, cross, own_ahead, w);
  }
  if (done == 0) done = DecScoresRunTiles(df, p, t, max_lim, cols, k, w);
  if (done == 0) done = DecScoresDenseRow(df, p, t, max_lim, cols, k, cross, own_ahead, w);
  auto walk = k.StartGroups(n, nkv);
  // (done: whole groups, nkv places each; the rest's prefetch walk starts
  // where it ends)
  for (std::int64_t g = 0; k.ahead > 0 && g < done * nkv; g += n) k.NextInGroups(walk, n, nkv, pf);
  for (std::int64_t c = done; c < max_lim; c += n) {
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
            DecScoreTile<4>(df, w.q.get() + r * d, d, kr + u, ahead(r, u), k.to_l2,
                            w.s.get() + r * cols + c + u, cols);
          }
        }
      }
      for (; r < rr.end; ++r) {
        DecScoreLanes(df, w.q.get() + r * d, d, kr, ahead(r, 0), k.to_l2, w.s.get() + r * cols + c);
      }
    }
  }
}

// The block step of a direct task; next_c0, next_keys: the task's next
// key block (next_keys 0 where this is its last), first: whether the
// task's last block step was not a direct one (its first block, or one
// after skipped blocks: no value pass prefetched this block's key rows).
//
// Rows of d = 128 in a dense cache take the cross-pass prefetch
// (DecCross: the score pass prefetches this block's value rows, the value
// pass the next block's key rows) where they are four query rows of one
// kv head in float32 (the grouped-query decode of Llama-2-70B and
// Mistral; DecScoresDenseTile, DecPVDenseQuad) or one query row a kv head
// in float16 or bfloat16 (DecScoresDenseRow, DecPVDenseRow), on AVX2 and
// AVX-512.
template <typename T>
void DirectBlockT(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                  std::int64_t c0, std::int64_t max_lim, std::int64_t cols, std::int64_t next_c0,
                  std::int64_t next_keys, bool first, AttentionWork& w) {
  std::int64_t* k_at = w.k_at.data();
  std::int64_t* v_at = w.v_at.data();
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // (DecScoresDenseTile's or DecScoresDenseRow's condition, its rows'
  // prefetch distance at least 1 as DecBlockRows gives it; and the value
  // rows in place)
  constexpr bool kF32 = std::is_same_v<T, float>;
  const DecRowRange rr = DecRowsOfKvHead(p, t, t.kvh);
  if (t.k_direct && t.v_direct &&
      ((kF32 && DecStrideRows(p, t, 1, rr, 4)) || (!kF32 && DecStrideRows(p, t, 1, rr, 1)))) {
    const DecRows<T> k = DecBlockRows<T, T>(p, t, c0, max_lim, false, k_at, nullptr, w);
    const DecRows<T> v = DecBlockRows<T, T>(p, t, c0, max_lim, true, v_at, nullptr, w);
    const DecCross v_rows = DecCrossOf(v.base + v.at[0], p.v_stride[2], max_lim);
    DecScores(df, p, t, max_lim, cols, k, w, &v_rows, first);
    SoftmaxBlock(df, p, t, c0, cols, w);
    DecCross k_next;  // none after the task's last block
    if (next_keys > 0) {
      k_next =
          DecCrossOf(k.base + k.at[0] + (next_c0 - c0) * p.k_stride[2], p.k_stride[2], next_keys);
    }
    DecValues(df, p, t, dp, cols, v, w, &k_next);
    return;
  }
#else
  (void)next_c0;
  (void)next_keys;
  (void)first;
#endif
  if (t.k_direct) {
    DecScores(df, p, t, max_lim, cols,
              DecBlockRows<T, T>(p, t, c0, max_lim, false, k_at, nullptr, w), w);
  } else {
    DecScores(df, p, t, max_lim, cols,
              DecBlockRows<T, float>(p, t, c0, max_lim, false, k_at, w.kt.get(), w), w);
  }
  SoftmaxBlock(df, p, t, c0, cols, w);
  if (t.v_direct) {
    DecValues(df, p, t, dp, cols, DecBlockRows<T, T>(p, t, c0, max_lim, true, v_at, nullptr, w), w);
  } else {
    DecValues(df, p, t, dp, cols,
              DecBlockRows<T, float>(p, t, c0, max_lim, true, v_at, w.v.get(), w), w);
  }
}

// One key block [c0, c0 + max_lim) of a direct (decode) task: scores,
// the online-softmax update, then O = alpha O + P V. next_c0, next_keys:
// the task's next key block (next_keys 0 after its last); first: whether
// no direct block step came just before it in the task (DirectBlockT).
void DirectBlock(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                 std::int64_t c0, std::int64_t max_lim, std::int64_t cols, std::int64_t next_c0,
                 std::int64_t next_keys, bool first, AttentionWork& w) {
  VisitKvType(p.kv_dtype, [&](auto tag) {
    DirectBlockT<decltype(tag)>(df, p, t, dp, c0, max_lim, cols, next_c0, next_keys, first, w);
  });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_ toggle
