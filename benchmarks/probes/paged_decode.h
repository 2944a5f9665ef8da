// The paged grouped-query decode of posbias-probe-decode-walk (decode_walk.cc)
// with nothing but the decode kernel's walk and arithmetic: PagedDecode in
// its AVX-512 code, PagedDecodeAvx2 in its AVX2 code, and the tile helpers
// they and the probe's score-tile walk share. Only for the probes.
#ifndef POSBIAS_BENCHMARKS_PROBES_PAGED_DECODE_H_
#define POSBIAS_BENCHMARKS_PROBES_PAGED_DECODE_H_

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

namespace posbias::probes {

constexpr long kHeads = 8;    // kv heads
constexpr long kRow = 128;    // floats per row (d)
constexpr long kBlock = 256;  // keys per block, as the decode kernel's

// GCC 12's AVX-512 headers start some intrinsics from an undefined vector
// and warn that it is used uninitialized (GCC bug 105593); nothing here
// reads an undefined lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Within each 128-bit block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
__attribute__((target("avx512f"), always_inline)) inline __m512 TilePairs(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
// Within each 128-bit block, from TilePairs(a, b) and TilePairs(c, e): the
// sums of the block's lanes of a, b, c and e.
__attribute__((target("avx512f"), always_inline)) inline __m512 TileQuads(__m512 ab, __m512 ce) {
  const __m512d x = _mm512_castps_pd(ab), y = _mm512_castps_pd(ce);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

// The transpose-add tree of a 4 x 4 score tile (the kernel's, in
// attention_decode_sums-inl.h): from acc[row * 4 + key], the 16 sums of
// their lanes, lane 4 row + key.
__attribute__((target("avx512f"), always_inline)) inline __m512 TileSums(const __m512* acc) {
  __m512 w[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    w[i] =
        TileQuads(TilePairs(acc[4 * i], acc[4 * i + 1]), TilePairs(acc[4 * i + 2], acc[4 * i + 3]));
  }
  const __m512 a01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x44), _mm512_shuffle_f32x4(w[0], w[1], 0xEE));
  const __m512 a23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x44), _mm512_shuffle_f32x4(w[2], w[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xDD));
}

// The 4 x 4 score tile of the paged decode below: query rows q (4 x kRow)
// by the key rows r, r + st, r + 2 st, r + 3 st into s (row stride ls),
// as attention_decode_tiles-inl.h's AVX-512 DecQuadTile does it.
__attribute__((target("avx512f"), always_inline)) inline void ScoreTile4x4(const float* q,
                                                                           const float* r, long st,
                                                                           float* s, long ls) {
  __m512 acc[16];  // acc[row * 4 + key]
#pragma GCC unroll 8
  for (long x = 0; x < kRow; x += 16) {
    __m512 qv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qv[i] = _mm512_load_ps(q + i * kRow + x);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 kv = _mm512_loadu_ps(r + u * st + x);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i * 4 + u] =
            x == 0 ? _mm512_mul_ps(qv[i], kv) : _mm512_fmadd_ps(qv[i], kv, acc[i * 4 + u]);
      }
    }
  }
  const __m512 out = TileSums(acc);
  _mm_storeu_ps(s, _mm512_extractf32x4_ps(out, 0));
  _mm_storeu_ps(s + ls, _mm512_extractf32x4_ps(out, 1));
  _mm_storeu_ps(s + 2 * ls, _mm512_extractf32x4_ps(out, 2));
  _mm_storeu_ps(s + 3 * ls, _mm512_extractf32x4_ps(out, 3));
}

// Every line of a row of kRow floats: kHint 1 PREFETCHT1 (into L2, the
// decode's choice on Intel), 2 PREFETCHT0 (into L1, on AMD), 0 none.
template <int kHint>
__attribute__((always_inline)) inline void PrefetchRow(const float* row) {
  const char* p = reinterpret_cast<const char*>(row);
#pragma GCC unroll 8
  for (long b = 0; b < kRow * 4; b += 64) {
    if constexpr (kHint == 1) _mm_prefetch(p + b, _MM_HINT_T1);
    if constexpr (kHint == 2) _mm_prefetch(p + b, _MM_HINT_T0);
  }
}

// The transpose-add tree of the AVX2 tile (8 lanes), as TilePairs and
// TileQuads above within 128-bit blocks.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 PairSums8(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
}
__attribute__((target("avx2,fma"), always_inline)) inline __m256 QuadSums8(__m256 ab, __m256 ce) {
  const __m256d x = _mm256_castps_pd(ab), y = _mm256_castps_pd(ce);
  return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                       _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
}
// Lane u: the sum of the lanes of acc[u].
__attribute__((target("avx2,fma"), always_inline)) inline __m256 LaneSums8(const __m256* acc) {
  const __m256 lo = QuadSums8(PairSums8(acc[0], acc[1]), PairSums8(acc[2], acc[3]));
  const __m256 hi = QuadSums8(PairSums8(acc[4], acc[5]), PairSums8(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
// Scores of query rows q (4 x kRow) against key rows k0 and k1 into s
// (row stride ls, two columns): the AVX2 tile, as the kernel's general
// tiles compute it with 8 lanes (q's 4 vectors loaded per chunk, the sums
// reduced as DecLaneSums does).
__attribute__((target("avx2,fma"), always_inline)) inline void ScoreTile4x2(const float* q,
                                                                            const float* k0,
                                                                            const float* k1,
                                                                            float* s, long ls) {
  __m256 acc[8];  // acc[row * 2 + key]
#pragma GCC unroll 16
  for (long x = 0; x < kRow; x += 8) {
    __m256 qv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qv[i] = _mm256_load_ps(q + i * kRow + x);
    const __m256 kv[2] = {_mm256_loadu_ps(k0 + x), _mm256_loadu_ps(k1 + x)};
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i * 2 + u] =
            x == 0 ? _mm256_mul_ps(qv[i], kv[u]) : _mm256_fmadd_ps(qv[i], kv[u], acc[i * 2 + u]);
      }
    }
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, LaneSums8(acc));
  for (int i = 0; i < 4; ++i) {
    s[i * ls] = out[2 * i];
    s[i * ls + 1] = out[2 * i + 1];
  }
}

// The two instruction sets' tiles of the paged decode below: kGroup keys a
// score group (a vector of lanes: the kernel's), kTileKeys keys a score
// tile; Score: the tile of 4 query rows q by the key rows r + u st (u <
// kTileKeys) into s (row stride ls); Values: O (4 rows oh) += the weights
// p (row stride ls) of 4 keys times their value rows r; Sum: the sum of
// O's 4 kHeads kRow floats.
struct Avx512Tiles {
  static constexpr long kGroup = 16, kTileKeys = 4;
  __attribute__((target("avx512f"))) static inline void Score(const float* q, const float* r,
                                                              long st, float* s, long ls) {
    ScoreTile4x4(q, r, st, s, ls);
  }
  // Half a row at a time (4 rows x 4 vectors of O in registers over the 4
  // keys, loaded and stored around them), as the kernel's four-row tile
  // (DecPVTile<4>, groups of 4 keys on Intel) does.
  __attribute__((target("avx512f"))) static inline void Values(float* oh, const float* p,
                                                               const float* const* r, long ls) {
#pragma GCC unroll 2
    for (long x0 = 0; x0 < kRow; x0 += 64) {
      __m512 acc[16];
#pragma GCC unroll 16
      for (int a = 0; a < 16; ++a) acc[a] = _mm512_load_ps(oh + (a / 4) * kRow + x0 + 16 * (a % 4));
#pragma GCC unroll 4
      for (long g = 0; g < 4; ++g) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; ++x) vv[x] = _mm512_loadu_ps(r[g] + x0 + 16 * x);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512 w = _mm512_set1_ps(p[i * ls + g]);
#pragma GCC unroll 4
          for (int x = 0; x < 4; ++x) acc[i * 4 + x] = _mm512_fmadd_ps(w, vv[x], acc[i * 4 + x]);
        }
      }
#pragma GCC unroll 16
      for (int a = 0; a < 16; ++a) _mm512_store_ps(oh + (a / 4) * kRow + x0 + 16 * (a % 4), acc[a]);
    }
  }
  __attribute__((target("avx512f"))) static inline float Sum(const float* o) {
    __m512 sum = _mm512_setzero_ps();
    for (long i = 0; i < kHeads * 4 * kRow; i += 16)
      sum = _mm512_add_ps(sum, _mm512_load_ps(o + i));
    return _mm512_reduce_add_ps(sum);
  }
};

// The AVX2 code (what the kernel runs on AVX2 CPUs: DecScores' general
// tiles and DecPVTile<4>, 8 lanes): tiles of 4 query rows by 2 keys; the
// value group column chunk by column chunk (4 rows x 2 vectors of O in
// registers over the group's keys).
struct Avx2Tiles {
  static constexpr long kGroup = 8, kTileKeys = 2;
  __attribute__((target("avx2,fma"))) static inline void Score(const float* q, const float* r,
                                                               long st, float* s, long ls) {
    ScoreTile4x2(q, r, r + st, s, ls);
  }
  __attribute__((target("avx2,fma"))) static inline void Values(float* oh, const float* p,
                                                                const float* const* r, long ls) {
#pragma GCC unroll 8
    for (long x0 = 0; x0 < kRow; x0 += 16) {
      __m256 acc[8];  // acc[row * 2 + vector]
#pragma GCC unroll 8
      for (int a = 0; a < 8; ++a) acc[a] = _mm256_load_ps(oh + (a / 2) * kRow + x0 + 8 * (a % 2));
#pragma GCC unroll 4
      for (long g = 0; g < 4; ++g) {
        const __m256 v0 = _mm256_loadu_ps(r[g] + x0), v1 = _mm256_loadu_ps(r[g] + x0 + 8);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m256 w = _mm256_broadcast_ss(p + i * ls + g);
          acc[i * 2] = _mm256_fmadd_ps(w, v0, acc[i * 2]);
          acc[i * 2 + 1] = _mm256_fmadd_ps(w, v1, acc[i * 2 + 1]);
        }
      }
#pragma GCC unroll 8
      for (int a = 0; a < 8; ++a) _mm256_store_ps(oh + (a / 2) * kRow + x0 + 8 * (a % 2), acc[a]);
    }
  }
  __attribute__((target("avx2,fma"))) static inline float Sum(const float* o) {
    __m256 sum = _mm256_setzero_ps();
    for (long i = 0; i < kHeads * 4 * kRow; i += 8) sum = _mm256_add_ps(sum, _mm256_load_ps(o + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    float total = 0.0f;
    for (float x : lanes) total += x;
    return total;
  }
};

// The paged grouped-query decode with nothing but its arithmetic and its
// walk (attention_decode-inl.h, DecScoresRunTiles and DecValues' four-row
// tile), one thread's share: K and V as pages of kPage keys [kPage,
// kHeads, kRow] (a 64 KiB page), the thread's share of `order` (a
// shuffled list of page indices, as an engine's free list leaves them), 4
// query rows a kv head (32 query heads on 8). Per block of kBlock keys:
// the score pass in groups of Tiles::kGroup keys, kv head by kv head,
// tiles of Tiles::kTileKeys keys, prefetching the row `ahead` places on in
// that walk (kHint as PrefetchRow's); then the value pass kv head by kv
// head over the block's keys in groups of 4, prefetching `ahead` keys on
// in its walk, a burst per group. No softmax (the kernel's takes about 2%
// of its samples): the scores are the weights. Written once for both
// instruction sets: PagedThread (below) compiles it into each one's code
// (GCC inlines the tiles, which have a target attribute, only into a
// function of that target, so the walk itself has none). kKeyMajor: both
// passes walk key-major instead, each tile's keys (the value pass: groups
// of 4) for every kv head in turn, so the memory sees a page front to back
// (its keys' rows of all kv heads side by side), each row prefetched
// `ahead` keys earlier in the same kv head (docs/performance-notes.md,
// forty-seventh round).
constexpr long kPage = 16;
template <class Tiles, int kHint, bool kKeyMajor = false>
inline float PagedWalk(const float* k, const float* v, const long* order, long pages, long ahead) {
  constexpr long kKeyStride = kHeads * kRow;  // a key's rows in a page
  constexpr long kPageFloats = kPage * kKeyStride;
  constexpr long kGroup = Tiles::kGroup, kTile = Tiles::kTileKeys;
  static_assert(kPage % kGroup == 0 && kGroup % kTile == 0 && kBlock % kPage == 0);
  const long nt = omp_get_num_threads(), t = omp_get_thread_num();
  const long* own = order + pages * t / nt;
  const long keys = (pages * (t + 1) / nt - pages * t / nt) * kPage;
  const auto row = [&](const float* base, long c, long h) {
    return base + own[c / kPage] * kPageFloats + (c % kPage) * kKeyStride + h * kRow;
  };
  alignas(64) float q[kHeads * 4 * kRow];
  for (long i = 0; i < kHeads * 4 * kRow; ++i) q[i] = 1e-3f * static_cast<float>(i % 13);
  alignas(64) float s[kHeads * 4 * kBlock];
  alignas(64) float o[kHeads * 4 * kRow] = {};
  for (long b0 = 0; b0 < keys; b0 += kBlock) {
    const long b1 = std::min(keys, b0 + kBlock);
    if constexpr (kKeyMajor) {
      // Key-major: each tile's keys for all kv heads in turn (their rows
      // side by side in memory), prefetching the same rows `ahead` keys on.
      for (long c0 = b0; c0 < b1; c0 += kTile) {
        for (long h = 0; h < kHeads; ++h) {
          for (long i = 0; i < kTile; ++i)
            PrefetchRow<kHint>(row(k, std::min(c0 + i + ahead, keys - 1), h));
          Tiles::Score(q + h * 4 * kRow, row(k, c0, h), kKeyStride, s + h * 4 * kBlock + (c0 - b0),
                       kBlock);
        }
      }
      for (long c = b0; c < b1; c += 4) {
        for (long h = 0; h < kHeads; ++h) {
          for (long g = 0; g < 4; ++g)
            PrefetchRow<kHint>(row(v, std::min(c + g + ahead, keys - 1), h));
          const float* r[4] = {row(v, c, h), row(v, c + 1, h), row(v, c + 2, h), row(v, c + 3, h)};
          Tiles::Values(o + h * 4 * kRow, s + h * 4 * kBlock + (c - b0), r, kBlock);
        }
      }
      continue;
    }
    for (long c0 = b0; c0 < b1; c0 += kGroup) {
      for (long h = 0; h < kHeads; ++h) {
        for (long u = 0; u < kGroup; u += kTile) {
          for (long i = 0; i < kTile; ++i) {
            // `ahead` places on in the walk: this group's later keys of
            // head h, or the next head's, or the next group's head 0.
            const long x = u + i + ahead;
            const long hh = h + x / kGroup;
            PrefetchRow<kHint>(
                hh < kHeads
                    ? row(k, c0 + x % kGroup, hh)
                    : row(k, std::min(c0 + kGroup, keys - kGroup) + x % kGroup, hh - kHeads));
          }
          Tiles::Score(q + h * 4 * kRow, row(k, c0 + u, h), kKeyStride,
                       s + h * 4 * kBlock + (c0 - b0) + u, kBlock);
        }
      }
    }
    for (long h = 0; h < kHeads; ++h) {
      for (long c = b0; c < b1; c += 4) {
        for (long g = 0; g < 4; ++g) {
          const long x = c + g + ahead;
          // `ahead` keys on in this walk: the block's later keys of head h,
          // or the next head's first, or (after the last head) the next
          // block's first keys of head 0.
          PrefetchRow<kHint>(x < b1           ? row(v, x, h)
                             : h + 1 < kHeads ? row(v, b0 + (x - b1), h + 1)
                                              : row(v, std::min(x, keys - 1), 0));
        }
        const float* r[4] = {row(v, c, h), row(v, c + 1, h), row(v, c + 2, h), row(v, c + 3, h)};
        Tiles::Values(o + h * 4 * kRow, s + h * 4 * kBlock + (c - b0), r, kBlock);
      }
    }
  }
  // Every row of O into the result, so that no pass is dead code.
  return Tiles::Sum(o);
}

// One thread's PagedWalk in each instruction set's code (flatten: the walk
// and the tiles inlined here, where the target allows them).
template <int kHint, bool kKeyMajor = false>
__attribute__((target("avx512f"), flatten, noinline)) float PagedThread512(const float* k,
                                                                           const float* v,
                                                                           const long* order,
                                                                           long pages, long ahead) {
  return PagedWalk<Avx512Tiles, kHint, kKeyMajor>(k, v, order, pages, ahead);
}
template <int kHint, bool kKeyMajor = false>
__attribute__((target("avx2,fma"), flatten, noinline)) float PagedThreadAvx2(
    const float* k, const float* v, const long* order, long pages, long ahead) {
  return PagedWalk<Avx2Tiles, kHint, kKeyMajor>(k, v, order, pages, ahead);
}

// The paged decode on every thread (the threads' sums added), in AVX-512
// (PagedDecode) and AVX2 (PagedDecodeAvx2) code.
using PagedFn = float (*)(const float*, const float*, const long*, long, long);
template <PagedFn kThread>
float OnEveryThread(const float* k, const float* v, const long* order, long pages, long ahead) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  total += kThread(k, v, order, pages, ahead);
  return total;
}
template <int kHint, bool kKeyMajor = false>
constexpr PagedFn PagedDecode = OnEveryThread<PagedThread512<kHint, kKeyMajor>>;
template <int kHint, bool kKeyMajor = false>
constexpr PagedFn PagedDecodeAvx2 = OnEveryThread<PagedThreadAvx2<kHint, kKeyMajor>>;

#pragma GCC diagnostic pop

}  // namespace posbias::probes

#endif  // POSBIAS_BENCHMARKS_PROBES_PAGED_DECODE_H_
