// posbias-probe-read-with-work: how fast one thread reads memory when it
// does W register-only FMAs per cache line it reads, with and without a
// software prefetch ahead (docs/performance-notes.md, fourteenth round).
//
// A decode kernel reads its K and V rows once and does a little arithmetic
// on each line. Its thread keeps fewer lines in flight the more
// instructions sit between its loads (the reorder window fills with them),
// so it reads below a plain read long before its arithmetic alone would
// slow it. This probe measures that curve on the machine it runs on: a
// plain read (W = 0), then W = 8, 16, 24, 32 FMAs per line (W / 2 cycles
// on two FMA pipes), each without a prefetch and with every line
// prefetched 4, 8, 16 and 32 KiB ahead. It prints GB/s (best of 5 passes
// over the buffer) per row.
//
// Usage: posbias-probe-read-with-work [MiB]   (default 256, or the
// last-level cache's size where that is larger; at least 64). x86-64 with
// AVX2 and FMA only: the loops are written with their intrinsics so that
// each line costs exactly two loads, two adds and W FMAs (a portable loop
// would leave the count to the compiler). Exit code 2 for a bad argument or a CPU without AVX2.
#include <immintrin.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "probe_start.h"

namespace {

constexpr std::size_t kLineFloats = 16;  // 64 bytes

// Sums a[0, n) two vectors per line, with W FMAs per line on eight register
// accumulators that depend on the loaded line (so the compiler cannot drop
// them), prefetching pf floats ahead when pf > 0.
template <int W>
__attribute__((target("avx2,fma"), noinline)) float ReadWithWork(const float* a, std::size_t n,
                                                                 std::size_t pf) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  __m256 w[8];
  for (int i = 0; i < 8; ++i) w[i] = _mm256_set1_ps(1.0f + static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999f);
  for (std::size_t i = 0; i < n; i += kLineFloats) {
    if (pf > 0) _mm_prefetch(reinterpret_cast<const char*>(a + i + pf), _MM_HINT_T0);
    const __m256 x = _mm256_load_ps(a + i), y = _mm256_load_ps(a + i + 8);
    s0 = _mm256_add_ps(s0, x);
    s1 = _mm256_add_ps(s1, y);
#pragma GCC unroll 32
    for (int k = 0; k < W; ++k) w[k % 8] = _mm256_fmadd_ps(w[k % 8], m, k % 2 == 0 ? x : y);
  }
  __m256 t = _mm256_add_ps(s0, s1);
  for (const __m256& v : w) t = _mm256_add_ps(t, v);
  float out[8];
  _mm256_storeu_ps(out, t);
  return out[0];
}

template <int W>
double BestGbps(const float* a, std::size_t n, std::size_t pf) {
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + ReadWithWork<W>(a, n, pf);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double gbps = static_cast<double>(n) * sizeof(float) / s / 1e9;
    if (gbps > best) best = gbps;
  }
  return best;
}

constexpr std::size_t kAheadKiB[] = {0, 4, 8, 16, 32};

template <int W>
void Row(const float* a, std::size_t n) {
  std::printf("%4d", W);
  for (std::size_t kib : kAheadKiB) std::printf(" %9.1f", BestGbps<W>(a, n, kib * 1024 / 4));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 256;
  if (const int rc = posbias::probes::ProbeStart(argc, argv, 65536, &mib); rc != 0) return rc;
  const std::size_t n = static_cast<std::size_t>(mib) << 18;  // floats
  // The prefetches run up to 32 KiB past the end: allocated, never read.
  const std::size_t bytes = (n + 8192) * sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  if (!buf) {
    std::fprintf(stderr, "%s: cannot allocate %ld MiB\n", argv[0], mib);
    return 2;
  }
  for (std::size_t i = 0; i < n + 8192; ++i) buf.get()[i] = 1e-6f * static_cast<float>(i & 255);
  std::printf("one thread, %ld MiB, GB/s (best of 5); columns: the prefetch distance\n", mib);
  std::printf("%4s", "FMAs");
  for (std::size_t kib : kAheadKiB) {
    if (kib == 0) {
      std::printf(" %9s", "none");
    } else {
      std::printf(" %6zu KiB", kib);
    }
  }
  std::printf("\n");
  Row<0>(buf.get(), n);
  Row<8>(buf.get(), n);
  Row<16>(buf.get(), n);
  Row<24>(buf.get(), n);
  Row<32>(buf.get(), n);
  return 0;
}
