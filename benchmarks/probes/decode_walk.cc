// posbias-probe-decode-walk: how fast all threads read a grouped-query
// decode's K and V when they walk them in the decode kernel's order, with W
// register-only FMAs per cache line and a software prefetch of the row
// `ahead` rows on, against a plain read of the same bytes in the same
// rounds (docs/performance-notes.md, twenty-fourth round).
//
// The decode kernel (src/kernels/attention_decode-inl.h) gives each thread
// whole kv heads; per head it walks blocks of 256 keys, the block's K rows
// (the score pass) and then its V rows (the value pass), each row front to
// back, prefetching every line of the row a few rows on in its own pass.
// This probe walks K and V [8 kv heads, j, 128] float32 the same way with
// nothing of the kernel's arithmetic but W FMAs per line, so that a
// fraction of read below 1 here belongs to the walk (its order and
// prefetches), and one the walk reaches and the kernel does not belongs to
// the kernel's instruction stream.
//
// Usage: posbias-probe-decode-walk [MiB]   (each of K and V; default 128, at
// least 64, well past the last-level cache). x86-64 with AVX2 and FMA only:
// each line costs exactly two loads, two adds and W FMAs (256-bit; the
// grouped-query decode's score and value passes do 4 AVX-512 FMAs, 8 of
// these, per line). Prints one row per (W, ahead): the plain read's and the
// walk's GB/s (medians of 7 alternated calls) and their ratio. Exit code 2
// for a bad argument or a CPU without AVX2 and FMA.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "probe_start.h"

namespace {

constexpr long kHeads = 8;        // kv heads
constexpr long kRow = 128;        // floats per row (d)
constexpr long kBlock = 256;      // keys per block, as the decode kernel's
constexpr long kLineFloats = 16;  // 64 bytes

// Sums (with W FMAs per line on eight accumulators that depend on the
// loaded line) the rows [c0, c1) of one kv head's rows at base, prefetching
// every line of row c + ahead (clamped to the head's last row) before row c
// when ahead > 0.
template <int W>
__attribute__((target("avx2,fma"), always_inline)) inline void WalkRows(const float* base, long c0,
                                                                        long c1, long j, long ahead,
                                                                        __m256* s, __m256* w) {
  const __m256 m = _mm256_set1_ps(0.999f);
  for (long c = c0; c < c1; ++c) {
    if (ahead > 0) {
      const char* p = reinterpret_cast<const char*>(base + std::min(c + ahead, j - 1) * kRow);
#pragma GCC unroll 8
      for (long b = 0; b < kRow * 4; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
    }
    const float* r = base + c * kRow;
#pragma GCC unroll 8
    for (long i = 0; i < kRow; i += kLineFloats) {
      const __m256 x = _mm256_load_ps(r + i), y = _mm256_load_ps(r + i + 8);
      s[0] = _mm256_add_ps(s[0], x);
      s[1] = _mm256_add_ps(s[1], y);
#pragma GCC unroll 32
      for (int f = 0; f < W; ++f) w[f % 8] = _mm256_fmadd_ps(w[f % 8], m, f % 2 == 0 ? x : y);
    }
  }
}

// The decode's walk over K and V [kHeads, j, kRow]: each thread its share
// of the kv heads, each head block by block, K's rows then V's.
template <int W>
__attribute__((target("avx2,fma"), noinline)) float Walk(const float* k, const float* v, long j,
                                                         long ahead) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 w[8];
    for (int i = 0; i < 8; ++i) w[i] = _mm256_set1_ps(1.0f + static_cast<float>(i));
    for (long h = kHeads * t / nt; h < kHeads * (t + 1) / nt; ++h) {
      for (long c0 = 0; c0 < j; c0 += kBlock) {
        const long c1 = std::min(j, c0 + kBlock);
        WalkRows<W>(k + h * j * kRow, c0, c1, j, ahead, s, w);
        WalkRows<W>(v + h * j * kRow, c0, c1, j, ahead, s, w);
      }
    }
    __m256 a = _mm256_add_ps(s[0], s[1]);
    for (const __m256& x : w) a = _mm256_add_ps(a, x);
    float out[8];
    _mm256_storeu_ps(out, a);
    total += out[0];
  }
  return total;
}

// The plain read of the same bytes: each thread one contiguous share of K,
// then of V, two loads and two adds per line.
__attribute__((target("avx2,fma"), noinline)) float Plain(const float* k, const float* v, long n) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (const float* a : {k, v}) {
      const long begin = n * t / nt / kLineFloats * kLineFloats;
      const long end = t + 1 == nt ? n : n * (t + 1) / nt / kLineFloats * kLineFloats;
      for (long i = begin; i < end; i += kLineFloats) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
      }
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(s0, s1));
    total += out[0];
  }
  return total;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 128;
  if (const int rc = posbias::probes::ProbeStart(argc, argv, 32768, &mib); rc != 0) return rc;
  const long n = mib << 18;  // floats in each of K and V
  const long j = n / (kHeads * kRow);
  const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
  using Buffer = std::unique_ptr<float, decltype(&std::free)>;
  Buffer k(static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  Buffer v(static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  if (!k || !v) {
    std::fprintf(stderr, "%s: cannot allocate 2 x %ld MiB\n", argv[0], mib);
    return 2;
  }
  for (long i = 0; i < n; ++i) {
    k.get()[i] = 1e-6f * static_cast<float>(i & 255);
    v.get()[i] = 1e-6f * static_cast<float>(i & 127);
  }
  struct Case {
    int w;
    long ahead;
    std::function<float()> walk;
  };
  const float* kp = k.get();
  const float* vp = v.get();
  std::vector<Case> cases;
  for (const long ahead : {0L, 8L, 16L}) {
    cases.push_back({0, ahead, [=] { return Walk<0>(kp, vp, j, ahead); }});
    cases.push_back({8, ahead, [=] { return Walk<8>(kp, vp, j, ahead); }});
    cases.push_back({16, ahead, [=] { return Walk<16>(kp, vp, j, ahead); }});
  }
  std::printf("%d threads, K and V [%ld, %ld, %ld] float32 (%ld MiB each), blocks of %ld keys\n",
              omp_get_max_threads(), kHeads, j, kRow, mib, kBlock);
  std::printf("%4s %6s %11s %11s %9s\n", "FMAs", "ahead", "read GB/s", "walk GB/s", "fraction");
  volatile float sink = 0.0f;
  const auto ms = [&](const std::function<float()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (const Case& c : cases) {
    std::vector<double> plain, walk;
    for (int round = 0; round < 7; ++round) {  // alternated: both see the same minute
      plain.push_back(ms([&] { return Plain(kp, vp, n); }));
      walk.push_back(ms(c.walk));
    }
    const double read_gbps = 2.0 * static_cast<double>(bytes) / Median(plain) / 1e6;
    const double walk_gbps = 2.0 * static_cast<double>(bytes) / Median(walk) / 1e6;
    std::printf("%4d %6ld %11.1f %11.1f %9.3f\n", c.w, c.ahead, read_gbps, walk_gbps,
                walk_gbps / read_gbps);
  }
  return 0;
}
