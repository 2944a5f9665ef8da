// Google Benchmark view of the ALiBi kernel and its same-run baseline: run
//   build/benchmarks/posbias_alibi_benchmark --benchmark_repetitions=9
//       --benchmark_report_aggregates_only=true
// Each BM_Alibi iteration also times a streaming fill of the same buffer
// (alternating which goes first), so every repetition carries the ratio to
// a fill measured right beside it: counter ratio_to_fill = fill time / ALiBi
// time (> 1: the kernel is faster than the fill), with alibi_ms and fill_ms,
// the mean times per call; the _median aggregate is the median over
// repetitions. The iteration time is the ALiBi call alone (manual time).
#include <benchmark/benchmark.h>

#include <chrono>

#include "baselines.h"
#include "posbias/alibi.h"
#include "posbias/slopes.h"

namespace {

using posbias::DType;

// Arguments: heads, n (i = j = n), dtype (0 f32, 1 bf16, 2 f16).
void BM_Alibi(benchmark::State& state) {
  const std::int64_t heads = state.range(0);
  const std::int64_t n = state.range(1);
  const auto dtype = static_cast<DType>(state.range(2));
  const std::vector<float> slopes = posbias::alibi_slopes(heads);
  posbias::Tensor buf = posbias::Tensor::empty({heads, n, n}, dtype);
  const auto bytes = static_cast<std::size_t>(buf.numel()) * posbias::dtype_size(dtype);
  void* out = buf.raw_mutable_data();
  posbias::bench::stream_fill(out, bytes);  // pre-fault
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  double alibi_s = 0, fill_s = 0;
  bool fill_first = false;
  for (auto _ : state) {
    double fill = 0;
    if (fill_first) {
      const auto t0 = Clock::now();
      posbias::bench::stream_fill(out, bytes);
      benchmark::ClobberMemory();
      fill = seconds(t0, Clock::now());
    }
    const auto t0 = Clock::now();
    posbias::alibi_bias_into(slopes, heads, n, n, dtype, out);
    benchmark::ClobberMemory();
    const double alibi = seconds(t0, Clock::now());
    if (!fill_first) {
      const auto t1 = Clock::now();
      posbias::bench::stream_fill(out, bytes);
      benchmark::ClobberMemory();
      fill = seconds(t1, Clock::now());
    }
    fill_first = !fill_first;
    state.SetIterationTime(alibi);
    alibi_s += alibi;
    fill_s += fill;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["ratio_to_fill"] = alibi_s > 0 ? fill_s / alibi_s : 0.0;
  state.counters["alibi_ms"] = benchmark::Counter(alibi_s * 1e3, benchmark::Counter::kAvgIterations);
  state.counters["fill_ms"] = benchmark::Counter(fill_s * 1e3, benchmark::Counter::kAvgIterations);
}

// Arguments: bytes in MiB.
void BM_StreamFill(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)) << 20;
  posbias::Tensor buf =
      posbias::Tensor::empty({static_cast<std::int64_t>(bytes / 4)}, DType::kFloat32);
  posbias::bench::stream_fill(buf.raw_mutable_data(), bytes);
  for (auto _ : state) {
    posbias::bench::stream_fill(buf.raw_mutable_data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

// A cache hit is a view: O(1) whatever the stored size.
void BM_AlibiCacheHit(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  posbias::AlibiPositionalBias module(16);
  module.forward(n, n);
  for (auto _ : state) benchmark::DoNotOptimize(module.forward(n - 1, n - 1));
}

BENCHMARK(BM_Alibi)
    ->Args({16, 4096, 0})
    ->Args({16, 4096, 1})
    ->Args({16, 4096, 2})
    ->Args({16, 512, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
// The fill alone (BM_Alibi's ratio_to_fill already carries it).
BENCHMARK(BM_StreamFill)->Arg(1024)->Arg(512)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AlibiCacheHit)->Arg(256)->Arg(4096);

}  // namespace

BENCHMARK_MAIN();
