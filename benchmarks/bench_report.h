// How a suite's results are printed (bench_suite.h's run_suite): one JSON
// object per line per case, or a readable table with the ratios.
#ifndef POSBIAS_BENCHMARKS_BENCH_REPORT_H_
#define POSBIAS_BENCHMARKS_BENCH_REPORT_H_

#include <ostream>
#include <vector>

#include "bench_suite.h"

namespace posbias::bench {

/// One line: case, median_ms, baselines, the extra figures, threads, note,
/// target and target_met when the case has a target, and error when there
/// is one (figures that are not finite are null).
void print_json(const CaseResult& r, std::ostream& out);

/// A table: each case's baselines with how much faster or slower it is,
/// its extra figures and note, and a footer saying what the ratios mean.
void print_table(const std::vector<CaseResult>& rs, std::ostream& out);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_BENCH_REPORT_H_
