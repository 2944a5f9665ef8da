// Benchmark suites shared by `posbias bench` and the Google Benchmark
// programs: each case is timed together with its same-run baselines, and
// results are reported as medians with ratios.
#ifndef POSBIAS_BENCHMARKS_BENCH_SUITE_H_
#define POSBIAS_BENCHMARKS_BENCH_SUITE_H_

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench_options.h"

namespace posbias::bench {

struct CaseResult {
  std::string name;                         // e.g. "alibi_h16_n4096_f32"
  double median_ms = 0;                     // ours
  std::map<std::string, double> baselines;  // baseline name -> median ms
  std::map<std::string, double> extra;      // other figures (GB/s, ratios)
  std::string note;
  std::string target;              // the target for the case, in words
  std::optional<bool> target_met;  // whether this run met it
  std::string error;               // set when the measurement is known to be broken
};

// Runs a suite (one of suite_names()) and writes its report to `out`: one JSON object per line per
// case with at least "case", "median_ms" and "baselines" (then the extra
// figures, "threads", "note", "target" and "target_met" when the case has a
// target, and "error" for a broken measurement; figures that are not finite
// are null) when options.json, else a readable table. Only the cases whose
// name contains options.only are reported (and, where the suite can, run).
// Throws std::invalid_argument for an unknown suite.
std::vector<CaseResult> run_suite(const std::string& suite, const BenchOptions& options,
                                  std::ostream& out);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_BENCH_SUITE_H_
