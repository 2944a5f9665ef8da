// What the suites' cases share (bench_suite.cc: alibi and dpb;
// attention_suite.cc: attention): the PyTorch peers, deterministic inputs,
// bandwidth and tags, and the suites themselves for run_suite.
#ifndef POSBIAS_BENCHMARKS_SUITE_COMMON_H_
#define POSBIAS_BENCHMARKS_SUITE_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_options.h"
#include "bench_suite.h"
#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::bench {

// "f32", "bf16", "f16": the dtype in case names.
std::string dtype_tag(DType d);

// GB/s of `bytes` moved in `ms` milliseconds (0 for ms <= 0).
double gbps(std::size_t bytes, double ms);

// Runs a PyTorch peer script of benchmarks/ with /usr/bin/python3 (or
// $POSBIAS_PEER_PYTHON) and `args` (shell words); returns its JSON line, or
// "" with `why` set when Python or torch is missing (the peer is optional:
// torch is not a build dependency).
std::string run_peer(const std::string& script, const std::string& args, std::string* why);

// The number under `key` in a peer's JSON line, or -1 when the line does not
// parse or has no such number.
double json_field(const std::string& text, const std::string& key);

// Records a PyTorch peer's median `ms` as baseline `name` ("pytorch_..._ms")
// and its ratio as extra "speedup_vs_pytorch_..." (> 1: posbias faster).
void add_pytorch_baseline(CaseResult& r, const std::string& name, double ms);

// Deterministic pseudo-random float32 values in [-1, 1) (a 64-bit LCG).
Tensor random_tensor(const std::vector<std::int64_t>& shape, std::uint64_t seed);

// Restricts Highway's dispatch, for the rest of the process (and the
// children it forks), to the instruction set `name` in Highway's spelling
// ("AVX2", "AVX3", "AVX3_ZEN4", ...), kernels and baselines alike, so that
// an AVX-512 machine can measure its AVX2 code. "" leaves the dispatch as
// it is. Throws std::invalid_argument, naming the sets this CPU and build
// have, when `name` is not one of them.
void use_only_isa(const std::string& name);

std::vector<CaseResult> alibi_suite(const BenchOptions& o);
std::vector<CaseResult> dpb_suite(const BenchOptions& o);
std::vector<CaseResult> attention_suite(const BenchOptions& o);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_SUITE_COMMON_H_
