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
// Usage: posbias-probe-decode-walk [MiB]   (each of K and V; default 128,
// or the last-level cache's size where that is larger; at least 64).
// x86-64 with AVX2 and FMA: each line costs exactly two loads, two adds
// and W FMAs (256-bit; the
// grouped-query decode's score and value passes do 4 AVX-512 FMAs, 8 of
// these, per line). Prints one row per (W, ahead): the plain read's and the
// walk's GB/s (medians of 7 alternated calls) and their ratio. A second
// table runs the paged grouped-query decode with nothing but its walk and
// its arithmetic (paged_decode.h), in the kernel's AVX2 code
// (PagedDecodeAvx2: the same bytes as shuffled 64 KiB pages, the kernel's
// tiles and prefetch, no softmax), against a plain read of K and V as posbias-bench reads them on
// AVX2 (256-bit loads, four sums); its key-major rows walk both passes a
// tile's keys (the value pass: 4) for every kv head in turn, as the
// kernel's value pass has done since 2026-12-07 (DecValuesKeyMajor). On a CPU with AVX-512 a third
// walks K alone with a copy of the kernel's grouped-query score tile (TileWalk) and a fourth runs
// the paged decode in the kernel's AVX-512 code (PagedDecode: 4 x 4 score tiles, the four-row value
// tile), both against a 512-bit read (as the bench's on AVX-512). Where the kernel's
// `fraction_of_read` (posbias-bench's paged case; `posbias-attention-loop
// paged_decode --target AVX2` for the AVX2 code on an AVX-512 CPU) is its
// paged table's, its own bookkeeping costs nothing from memory and the gap
// to read belongs to any kernel of that arithmetic on that core
// (docs/performance-notes.md, fortieth round). Exit code 2 for a bad
// argument or a CPU without AVX2 and FMA.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "paged_decode.h"
#include "probe_start.h"

namespace {

using posbias::probes::kBlock;
using posbias::probes::kHeads;
using posbias::probes::kPage;
using posbias::probes::kRow;
using posbias::probes::PagedDecode;
using posbias::probes::PagedDecodeAvx2;
using posbias::probes::TileSums;
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

// GCC 12's AVX-512 headers start some intrinsics from an undefined vector
// and warn that it is used uninitialized (GCC bug 105593); nothing here
// reads an undefined lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The grouped-query decode's score tile (attention_decode-inl.h,
// DecScoreTile<4> on AVX-512) walking one kv head's K rows after another:
// per 4 keys, the 16 dot products of 4 query rows with 4 key rows in 16
// sums (q's 4 vectors of each 64-byte chunk loaded once for the 4 keys),
// summed by a transpose-add tree into one vector stored per 4 keys; the 4
// rows 8 keys on prefetched in one burst first. With kQHeld, q's vectors
// are 4 constants held in registers: the same FMAs, sums and tree, but not
// the math (q varies along d), to show what q's loads cost. kByKey reads
// each key row front to back (its 4 rows' sums) instead of a chunk of the 4
// rows at a time.
template <bool kQHeld, bool kByKey>
__attribute__((target("avx512f"), noinline)) float TileWalk(const float* k, long j) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    alignas(64) float q[4 * kRow];
    for (long i = 0; i < 4 * kRow; ++i) q[i] = 1e-3f * static_cast<float>(i % 13);
    alignas(64) float s[kBlock * 4];
    __m512 keep = _mm512_setzero_ps();
    for (long h = kHeads * t / nt; h < kHeads * (t + 1) / nt; ++h) {
      const float* base = k + h * j * kRow;
      for (long c = 0; c + 4 <= j; c += 4) {
        for (long u = 0; u < 4; ++u) {
          const char* p = reinterpret_cast<const char*>(base + std::min(c + u + 8, j - 1) * kRow);
#pragma GCC unroll 8
          for (long b = 0; b < kRow * 4; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
        }
        const float* r = base + c * kRow;
        __m512 acc[16];  // acc[row * 4 + key]
        // Chunk x (16 floats) of key row u for the 4 query rows (a loop body,
        // not a lambda: a lambda would not take the function's target).
        constexpr long kChunks = kRow / 16;
#pragma GCC unroll 32
        for (long step = 0; step < 4 * kChunks; ++step) {
          const long u = kByKey ? step / kChunks : step % 4;
          const long x = kByKey ? 16 * (step % kChunks) : 16 * (step / 4);
          const __m512 kv = _mm512_loadu_ps(r + u * kRow + x);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m512 qv = kQHeld ? _mm512_set1_ps(0.5f / static_cast<float>(i + 1))
                                     : _mm512_load_ps(q + i * kRow + x);
            acc[i * 4 + u] =
                x == 0 ? _mm512_mul_ps(qv, kv) : _mm512_fmadd_ps(qv, kv, acc[i * 4 + u]);
          }
        }
        _mm512_store_ps(s + (c % kBlock) * 4, TileSums(acc));
        if (c % kBlock == kBlock - 4) keep = _mm512_add_ps(keep, _mm512_load_ps(s + 16));
      }
    }
    total += _mm512_reduce_add_ps(keep);
  }
  return total;
}

// The plain read in 512-bit loads and four sums (as posbias-bench's read
// probe, benchmarks/baselines.cc, runs on AVX-512 through Highway): the
// AVX-512 tables' baseline. On an Emerald Rapids Xeon Plain's 256-bit
// loads into two sums read 0.75-0.9 as fast (fortieth round), so the
// AVX-512 walks are judged against this one, as the bench judges the
// kernel. v may be null (K alone).
__attribute__((target("avx512f"), noinline)) float Plain512(const float* k, const float* v,
                                                            long n) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (const float* a : {k, v}) {
      if (a == nullptr) continue;  // K alone
      const long begin = n * t / nt / 64 * 64;
      const long end = t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64;
      for (long i = begin; i < end; i += 64) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) s[u] = _mm512_add_ps(s[u], _mm512_load_ps(a + i + 16 * u));
      }
    }
    total +=
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
  }
  return total;
}

// The plain read in 256-bit loads and four sums (posbias-bench's read
// probe on an AVX2 CPU): the AVX2 paged table's baseline.
__attribute__((target("avx2,fma"), noinline)) float Plain4x256(const float* k, const float* v,
                                                               long n) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (const float* a : {k, v}) {
      const long begin = n * t / nt / 32 * 32;
      const long end = t + 1 == nt ? n : n * (t + 1) / nt / 32 * 32;
      for (long i = begin; i < end; i += 32) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) s[u] = _mm256_add_ps(s[u], _mm256_load_ps(a + i + 8 * u));
      }
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
    for (float x : lanes) total += x;
  }
  return total;
}

#pragma GCC diagnostic pop

// The plain read of the same bytes: each thread one contiguous share of K,
// then of V (none when v is null), two loads and two adds per line.
__attribute__((target("avx2,fma"), noinline)) float Plain(const float* k, const float* v, long n) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const long nt = omp_get_num_threads(), t = omp_get_thread_num();
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (const float* a : {k, v}) {
      if (a == nullptr) continue;  // K alone
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

// GB/s of `bytes` read by plain() and by walk(), medians of 7 rounds that
// alternate them, so that both see the same minute of this machine's memory.
struct Rates {
  double read_gbps, walk_gbps;
};
Rates Alternated(const std::function<float()>& plain, const std::function<float()>& walk,
                 double bytes) {
  volatile float sink = 0.0f;
  const auto ms = [&](const std::function<float()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> plain_ms, walk_ms;
  for (int round = 0; round < 7; ++round) {
    plain_ms.push_back(ms(plain));
    walk_ms.push_back(ms(walk));
  }
  return {bytes / Median(plain_ms) / 1e6, bytes / Median(walk_ms) / 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 128;
  if (const int rc = posbias::probes::ProbeStart(argc, argv, 32768, &mib); rc != 0) return rc;
  const long n = mib << 18;  // floats in each of K and V
  const long j = n / (kHeads * kRow);
  const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
  using Buffer = std::unique_ptr<float, decltype(&std::free)>;
  // In transparent huge pages where the kernel allows them, as posbias's
  // own tensors of 4 MiB or more (src/tensor.cc): the strided and shuffled
  // walks would otherwise miss the TLB on most rows, which the kernel's
  // reads do not.
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const auto huge = [&] {
    void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    if (p != nullptr) madvise(p, bytes, MADV_HUGEPAGE);  // advisory
    return static_cast<float*>(p);
  };
  Buffer k(huge(), &std::free);
  Buffer v(huge(), &std::free);
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
  for (const Case& c : cases) {
    const Rates r =
        Alternated([&] { return Plain(kp, vp, n); }, c.walk, 2.0 * static_cast<double>(bytes));
    std::printf("%4d %6ld %11.1f %11.1f %9.3f\n", c.w, c.ahead, r.read_gbps, r.walk_gbps,
                r.walk_gbps / r.read_gbps);
  }
  // The same bytes as a paged cache: pages of kPage keys [kPage, kHeads,
  // kRow] in a shuffled order (each thread's share shuffled on its own).
  const long pages = n / (kPage * kHeads * kRow);
  const int threads = omp_get_max_threads();
  std::vector<long> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0L);
  for (int t = 0; t < threads; ++t) {
    std::shuffle(order.begin() + pages * t / threads, order.begin() + pages * (t + 1) / threads,
                 std::mt19937(static_cast<unsigned>(t) + 1u));
  }
  struct PagedCase {
    const char* name;
    float (*walk)(const float*, const float*, const long*, long, long);
    long ahead;
  };
  const auto paged_table = [&](const char* what, const PagedCase* rows, std::size_t count,
                               float (*plain)(const float*, const float*, long)) {
    std::printf(
        "%s paged grouped-query decode, its walk and arithmetic alone (%ld pages of %ld keys in a "
        "shuffled order; 4 query rows a kv head; K then V per block of %ld keys)\n",
        what, pages, kPage, kBlock);
    std::printf("%-32s %11s %11s %9s\n", "prefetch", "read GB/s", "walk GB/s", "fraction");
    for (std::size_t i = 0; i < count; ++i) {
      const PagedCase& c = rows[i];
      const Rates r = Alternated([&] { return plain(kp, vp, n); },
                                 [&] { return c.walk(kp, vp, order.data(), pages, c.ahead); },
                                 2.0 * static_cast<double>(bytes));
      std::printf("%-32s %11.1f %11.1f %9.3f\n", c.name, r.read_gbps, r.walk_gbps,
                  r.walk_gbps / r.read_gbps);
    }
  };
  const PagedCase avx2[] = {{"none", PagedDecodeAvx2<0>, 8},
                            {"PREFETCHT0 8 rows (AMD's)", PagedDecodeAvx2<2>, 8},
                            {"PREFETCHT1 6 rows (Intel's)", PagedDecodeAvx2<1>, 6},
                            {"key-major, T1 4 keys", PagedDecodeAvx2<1, true>, 4},
                            {"key-major, T1 8 keys", PagedDecodeAvx2<1, true>, 8},
                            {"key-major, T1 16 keys", PagedDecodeAvx2<1, true>, 16},
                            {"key-major, T0 8 keys", PagedDecodeAvx2<2, true>, 8},
                            {"key-major, none", PagedDecodeAvx2<0, true>, 8}};
  paged_table("AVX2", avx2, std::size(avx2), Plain4x256);
  if (!__builtin_cpu_supports("avx512f")) return 0;
  std::printf("AVX-512 score tile over K alone (4 query rows x 4 keys, prefetch 8 keys on)\n");
  std::printf("%-32s %11s %11s %9s\n", "order, q's vectors", "read GB/s", "walk GB/s", "fraction");
  struct TileCase {
    const char* name;
    float (*walk)(const float*, long);
  };
  const TileCase tiles[] = {{"chunks, loaded (the kernel's)", TileWalk<false, false>},
                            {"chunks, held (not the math)", TileWalk<true, false>},
                            {"key by key, loaded", TileWalk<false, true>},
                            {"key by key, held (not the math)", TileWalk<true, true>}};
  for (const TileCase& c : tiles) {
    const Rates r = Alternated([&] { return Plain512(kp, nullptr, n); },
                               [&] { return c.walk(kp, j); }, static_cast<double>(bytes));
    std::printf("%-32s %11.1f %11.1f %9.3f\n", c.name, r.read_gbps, r.walk_gbps,
                r.walk_gbps / r.read_gbps);
  }
  const PagedCase avx512[] = {{"none", PagedDecode<0>, 6},
                              {"PREFETCHT1 6 rows (Intel's)", PagedDecode<1>, 6},
                              {"PREFETCHT1 8 rows", PagedDecode<1>, 8},
                              {"PREFETCHT0 8 rows (AMD's)", PagedDecode<2>, 8},
                              {"key-major, T1 4 keys", PagedDecode<1, true>, 4},
                              {"key-major, T1 8 keys", PagedDecode<1, true>, 8},
                              {"key-major, T1 16 keys", PagedDecode<1, true>, 16},
                              {"key-major, T0 8 keys", PagedDecode<2, true>, 8},
                              {"key-major, none", PagedDecode<0, true>, 8}};
  paged_table("AVX-512", avx512, std::size(avx512), Plain512);
  return 0;
}
