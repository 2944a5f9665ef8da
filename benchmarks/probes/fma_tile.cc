// posbias-probe-fma-tile: how much of one core's FMA peak the prefill's
// register tile can reach, and what the softmax's other vector operations
// cost it on this core (docs/performance-notes.md, thirtieth round).
//
// The prefill's score and P V tiles (src/kernels/attention_blocks-inl.h,
// QKAccumulate and PVRows) are 6 rows x 4 vectors of accumulators over a
// reduction of d = 64: per step 4 vector loads, 6 broadcasts and 24 FMAs,
// 1536 FMAs per tile, with the 24 results stored after it. The score tile
// then does about 20 other vector operations per score vector (the ALiBi
// fold, the row maximum, the exp, the sum: attention_softmax-inl.h), 480
// per tile. Where those issue to the FMA pipes (every 512-bit operation on
// a Sapphire Rapids class Xeon) they take the FMAs' slots; where the core
// has pipes of their own for adds and maxima (Zen 4, Zen 5) they need not.
//
// This probe times, on one thread with its operands in L1, a register-only
// FMA loop (12 independent chains) and the 6 x 4 tile with W non-FMA
// operations (adds and maxima, alternating) per score vector: "after", W
// dependent ones on each of the 24 results before they are stored (as the
// softmax follows the score loop), for W = 0, 5, 10, 20; "interleaved",
// about as many spread over the reduction's steps on registers of their
// own (as a kernel that computed one tile's exps inside another tile's FMA
// loop would), for W = 10, 20. It prints, per row, the tile's GFLOP/s
// counting only its 1536 FMAs as a fraction of the peak loop's in the same
// rounds (the median of 31 alternated rounds, with the quartiles): W = 0
// is the FMA loop's own efficiency, W = 20 about the ceiling the softmax
// leaves the score tile on this core. AVX-512 only (the tile's shape is
// the AVX-512 one): exit code 2 with a message elsewhere, or for any
// argument.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kRows = 6, kVecs = 4, kD = 64, kKeys = kVecs * 16;
constexpr double kTileFlops = 2.0 * kRows * kKeys * kD;  // 1536 FMAs of 16 lanes

// GCC 12's AVX-512 headers start some intrinsics from an undefined vector
// and warn that it is used uninitialized (GCC bug 105593); nothing here
// reads an undefined lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 12 independent FMA chains on registers: iters x 12 x 32 flops.
// noipa: GCC finds it pure and would hoist the call out of the rounds.
__attribute__((target("avx512f"), noipa)) float Peak(long iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (long t = 0; t < iters; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

// reps tiles acc[r][u] = sum_k q[r][k] kt[k][16 u ...], stored to out.
// "After" (kInterleaved false): each result first put through W dependent
// adds and maxima. Interleaved: 8 W / 20 such operations per step of the
// reduction instead (64 steps: about 9.6 W per tile, W x 24 in all for
// W = 20) on four registers of their own, two independent chains a step,
// and the results stored as they are.
template <int W, bool kInterleaved>
__attribute__((target("avx512f"), noipa)) void Tile(const float* q, const float* kt, float* out,
                                                    long reps) {
  const __m512 c1 = _mm512_set1_ps(1e-3f), c2 = _mm512_set1_ps(-1e9f);
  __m512 x[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  constexpr int kPerStep = kInterleaved ? 8 * W / 20 : 0;
  constexpr int kAfter = kInterleaved ? 0 : W;
  for (long t = 0; t < reps; ++t) {
    __m512 acc[kRows][kVecs];
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm512_setzero_ps();
    }
#pragma GCC unroll 4
    for (int k = 0; k < kD; ++k) {
      __m512 kv[kVecs];
#pragma GCC unroll 4
      for (int u = 0; u < kVecs; ++u) kv[u] = _mm512_loadu_ps(kt + k * kKeys + u * 16);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const __m512 qv = _mm512_set1_ps(q[r * kD + k]);
#pragma GCC unroll 4
        for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm512_fmadd_ps(qv, kv[u], acc[r][u]);
      }
#pragma GCC unroll 8
      for (int w = 0; w < kPerStep; ++w) {
        x[w & 3] = (w & 1) ? _mm512_max_ps(x[w & 3], c2) : _mm512_add_ps(x[w & 3], c1);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < kVecs; ++u) {
        __m512 y = acc[r][u];
#pragma GCC unroll 20
        for (int w = 0; w < kAfter; ++w) y = (w & 1) ? _mm512_max_ps(y, c2) : _mm512_add_ps(y, c1);
        _mm512_storeu_ps(out + r * kKeys + u * 16, y);
      }
    }
    asm volatile("" ::: "memory");
  }
  if constexpr (kInterleaved) {
    for (int w = 0; w < 4; ++w) {
      _mm512_storeu_ps(out + w * 16, _mm512_add_ps(x[w], x[(w + 1) & 3]));
    }
  }
}

#pragma GCC diagnostic pop

template <int W, bool kInterleaved>
void Report(const std::vector<float>& q, const std::vector<float>& kt, std::vector<float>& out) {
  constexpr long kPeakIters = 4000000, kReps = 80000;
  std::vector<double> ratios;
  for (int round = 0; round < 31; ++round) {
    double t0 = Now();
    volatile float sink = Peak(kPeakIters);
    (void)sink;
    const double peak = kPeakIters * 12.0 * 32.0 / (Now() - t0);
    t0 = Now();
    Tile<W, kInterleaved>(q.data(), kt.data(), out.data(), kReps);
    const double tile = kReps * kTileFlops / (Now() - t0);
    ratios.push_back(tile / peak);
  }
  std::sort(ratios.begin(), ratios.end());
  const std::size_t n = ratios.size();
  std::printf("W %2d %s (%3d other ops per %d FMAs): tile / peak %.3f (quartiles %.3f, %.3f)\n", W,
              kInterleaved ? "interleaved" : "after      ",
              kInterleaved ? 8 * W / 20 * kD : W * kRows * kVecs,
              static_cast<int>(kTileFlops / 32.0), ratios[n / 2], ratios[n / 4], ratios[3 * n / 4]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s (no arguments; got %s)\n", argv[0], argv[1]);
    return 2;
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "%s: this CPU has no AVX-512 (the tile is the AVX-512 one)\n", argv[0]);
    return 2;
  }
  std::vector<float> q(kRows * kD, 0.01f), kt(kD * kKeys, 0.02f), out(kRows * kKeys);
  std::printf("one thread, operands in L1; the medians of 31 alternated rounds\n");
  Report<0, false>(q, kt, out);
  Report<5, false>(q, kt, out);
  Report<10, false>(q, kt, out);
  Report<20, false>(q, kt, out);
  Report<10, true>(q, kt, out);
  Report<20, true>(q, kt, out);
  return 0;
}
