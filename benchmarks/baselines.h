// Same-run baselines and timing helpers for the benchmarks: what the machine
// can do with the same bytes, measured in the same process right next to the
// case it judges.
#ifndef POSBIAS_BENCHMARKS_BASELINES_H_
#define POSBIAS_BENCHMARKS_BASELINES_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace posbias::bench {

// Writes `bytes` bytes of a constant at dst (64-byte aligned) with streaming
// (non-temporal) stores, threaded over all OpenMP threads: the memory-write
// bandwidth probe that a materialised bias is judged against.
void stream_fill(void* dst, std::size_t bytes);

// Reads `bytes` bytes at src (64-byte aligned) with vector loads, threaded:
// the memory-read bandwidth probe for passes that consume a large tensor.
// Returns a value derived from the data so the reads cannot be elided.
float stream_read(const void* src, std::size_t bytes);

// OpenBLAS sgemm on square n x n float32 matrices (C = A B), the GEMM
// roofline an attention kernel is judged against. It holds its matrices, so
// that its calls can be interleaved with the case they judge in
// time_interleaved (GFLOP/s = flops() / time).
class SgemmBaseline {
 public:
  explicit SgemmBaseline(int n);
  void operator()();  // one C = A B
  double flops() const { return 2.0 * n_ * n_ * n_; }

 private:
  int n_;
  std::vector<float> a_, b_, c_;
};

// The float32 FMA peak of the machine as this process sees it: a loop of
// fused multiply-adds on kFmaChains independent vector accumulators held in
// registers (no loads or stores inside the loop), on every OpenMP thread at
// the widest vectors Highway dispatches to (HWY_DYNAMIC_DISPATCH: AVX2's 256
// bits here, 512 on an AVX-512 or AVX10 machine). 12 chains cover an FMA
// latency of 4 or 5 cycles times the 2 FMA pipes of a current x86 core (and
// fit AVX2's 16 registers with the two constants), so the loop runs at the
// pipes' throughput. An attention kernel's GFLOP/s are judged against it.
// Like SgemmBaseline, each call is one run, so that it can be interleaved
// with the case it judges in time_interleaved.
class FmaPeakBaseline {
 public:
  static constexpr int kFmaChains = 12;
  // Each thread runs `iterations` steps of kFmaChains vector FMAs a call.
  explicit FmaPeakBaseline(long long iterations = 4000000);
  void operator()();  // one run on all threads
  // Floating-point operations of the last run (2 per FMA lane, all threads).
  double flops() const { return flops_; }
  int vector_bits() const;              // of the dispatched target's float vectors
  std::string target() const;           // Highway's name of the dispatched target ("AVX2")
  float sink() const { return sink_; }  // keeps the results alive

 private:
  long long iterations_;
  double flops_ = 0;
  float sink_ = 0;
};

// The same with ordinary stores (what a fill of cache-resident data costs).
void store_fill(void* dst, std::size_t bytes);

// Median of the values (the mean of the middle two for an even count).
double median(std::vector<double> values);

// Runs each function `warmup` times untimed, then `repetitions` rounds in
// which every function runs once, interleaved (so drift and noise hit all of
// them alike); returns each function's times in milliseconds.
std::vector<std::vector<double>> time_interleaved(const std::vector<std::function<void()>>& fns,
                                                  int warmup, int repetitions);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_BASELINES_H_
