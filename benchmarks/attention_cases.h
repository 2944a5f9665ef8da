// What the attention suite's case files share (attention_suite.cc: memory
// and prefill; decode_cases.cc: decode against a KV cache; option_cases.cc,
// varlen_cases.cc and kvcache_cases.cc: the options of issues 16 and 17;
// backward_cases.cc: grouped-query training):
// inputs, the visible (query, key) pairs that set a case's flops, the
// same-run FMA peak every case's GFLOP/s are judged against, and the
// issues' targets.
#ifndef POSBIAS_BENCHMARKS_ATTENTION_CASES_H_
#define POSBIAS_BENCHMARKS_ATTENTION_CASES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "baselines.h"
#include "bench_options.h"
#include "bench_suite.h"
#include "peer_ggml.h"
#include "posbias/attention.h"
#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::bench {

struct AttentionInputs {
  Tensor q, k, v;
};

// Deterministic q [1, h, i, d] float32 and k, v [1, hk, j, d] in kv_dtype.
AttentionInputs attention_inputs(std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                                 std::int64_t d, DType kv_dtype = DType::kFloat32);

// Options with causal = true (every case of the suite is causal but one).
AttentionOptions causal_options();

// Visible (query, key) pairs of one (batch, head) with i rows and j keys:
// row r sits at q_offset + r and sees keys c in [pos - left, pos + right]
// inside [0, j) (-1: unbounded on that side; causal is right = 0). The sum
// over rows, exactly (causal i = j = n: n (n + 1) / 2).
double visible_pairs(std::int64_t i, std::int64_t j, std::int64_t q_offset, std::int64_t left,
                     std::int64_t right);

// r.extra["gflops"] = flops / time (flops: 4 d per visible pair, per head
// and batch).
void set_gflops(CaseResult& r, double flops);

// r.extra["fraction_of_read_best"]: the case's fastest round against the
// fastest round of the plain read of its bytes (times in ms, from the same
// rounds; the bytes cancel): what it reads when the neighbours leave the
// memory and the cores alone, beside fraction_of_read (the medians', which
// the targets are judged on). Nothing when either has no timed round.
void set_read_best(CaseResult& r, const std::vector<double>& times_ms,
                   const std::vector<double>& read_ms);

// The target for the case, in words, and whether this run met it.
void set_target(CaseResult& r, const std::string& text, bool met);

// The same-run FMA peak (FmaPeakBaseline): runs interleaved with the cases'
// rounds (run()), their times kept: record() for the prefill rounds,
// record(name, ...) for one case's own rounds. judge() gives every case
// with a "gflops" the median peak as baseline fma_peak_gflops and its
// fraction_of_fma_peak: the probe runs of its own rounds where it has them
// (a case timed minutes after the prefill, when the host's neighbours may
// have left or come, is not judged against the prefill's minute), else the
// prefill rounds' (measuring the probe on its own first when no round ran
// it).
class FmaPeak {
 public:
  // 20 million steps: about 40 ms a run at 100 GFLOP/s per thread (AVX2
  // Zen 3), long enough that a thread starting late on a shared machine
  // does not dominate it (4 million gave half the single-thread figure on
  // two threads here while other builds ran).
  explicit FmaPeak(const BenchOptions& o)
      : probe_(o.quick ? 2000000 : 20000000), warmup_(o.warmup), repetitions_(o.repetitions) {}
  std::function<void()> run();
  void record(const std::vector<double>& times_ms);
  void record(const std::string& case_name, const std::vector<double>& times_ms);
  void judge(std::vector<CaseResult>& cases);
  std::string describe(const std::string& case_name) const;  // for the case's note

 private:
  FmaPeakBaseline probe_;
  int warmup_, repetitions_;
  std::vector<double> gflops_;
  std::map<std::string, std::vector<double>> own_;  // per case, its own rounds' runs
  bool alone_ = false;  // measured on its own, not in the prefill rounds
  // The probe's GFLOP/s of each timed run (times_ms > 0), appended to runs.
  void add_runs(std::vector<double>& runs, const std::vector<double>& times_ms) const;
};

// Decode against a long KV cache (i = 1): multi-head, grouped-query and
// 16-bit caches, each against a same-run read of its bytes, and against
// ggml (peer_ggml.h) when `ggml` is not null (else ggml_why says why).
void decode_cases(const BenchOptions& o, FmaPeak& fma, GgmlPeer* ggml, const std::string& ggml_why,
                  std::vector<CaseResult>& out);

// Issue 16's dense options (option_cases.cc): a sliding window, a key
// mask, soft-capping.
void option_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out);

// Issue 16's packed variable-length sequences (varlen_cases.cc), forward
// and backward.
void varlen_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out);

// Training with grouped-query heads (backward_cases.cc): the backward
// against the same call on the kv heads repeated (multi-head).
void backward_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out);

// Issue 17's paged KV caches (kvcache_cases.cc): decode, chunked append
// and a chunk of a chunked prefill.
void kvcache_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out);

// The paged decode case's call on its own (for posbias-attention-loop):
// sets kv_bytes to the bytes of K and V its cache holds (every block is
// one of the sequences') and what to the inputs' description.
std::function<void()> paged_decode_call(std::size_t& kv_bytes, std::string& what);

// The paged append case's call on its own (for posbias-attention-loop),
// or a baseline of it: layout "contiguous" (the dense calls on contiguous
// copies) or "slab" (the same call on a slab cache); sets what to the
// inputs' description.
std::function<void()> paged_append_call(const std::string& layout, std::string& what);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_ATTENTION_CASES_H_
