// Google Benchmark view of the ALiBi kernel and its same-run baseline: run
//   build/benchmarks/posbias_alibi_benchmark --benchmark_repetitions=9
//       --benchmark_report_aggregates_only=true
// and compare each BM_Alibi median with the BM_StreamFill median of the same
// bytes (the `posbias bench alibi` command prints that ratio directly).
#include <benchmark/benchmark.h>

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
  posbias::bench::stream_fill(buf.raw_mutable_data(), bytes);  // pre-fault
  for (auto _ : state) {
    posbias::alibi_bias_into(slopes, heads, n, n, dtype, buf.raw_mutable_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
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
    ->UseRealTime();
BENCHMARK(BM_StreamFill)->Arg(1024)->Arg(512)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AlibiCacheHit)->Arg(256)->Arg(4096);

}  // namespace

BENCHMARK_MAIN();
