// The command line of the benchmark suites, shared by the posbias-bench
// program (bench_main.cc) and `posbias bench` (cli/bench_command.cc), which
// checks it and then runs posbias-bench: both read the same options, give
// the same --help and refuse the same values. CLI11 only: neither OpenBLAS
// nor the suites themselves, so the posbias tool can link it.
#ifndef POSBIAS_BENCHMARKS_BENCH_OPTIONS_H_
#define POSBIAS_BENCHMARKS_BENCH_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace posbias::bench {

struct BenchOptions {
  int repetitions = 11;  // timed runs per case (median reported)
  int warmup = 2;        // untimed runs first
  bool json = false;     // JSON lines instead of a table
  bool quick = false;    // smaller sizes (for tests of the harness itself)
  std::string only;      // report only the cases whose name contains it ("": all)
  std::string isa;       // Highway's instruction set to run ("": the best this CPU has)

  /// Whether the case `name` is reported (a suite skips groups of cases
  /// timed together when none of them is).
  bool wants(const std::string& name) const {
    return only.empty() || name.find(only) != std::string::npos;
  }
};

/// A suite and its options, as given on the command line.
struct BenchArgs {
  std::string suite;
  BenchOptions options;
};

/// Names of the suites run_suite (bench_suite.h) accepts: "alibi", "dpb",
/// "attention".
std::vector<std::string> suite_names();

/// The suites as one comma-separated string ("alibi, dpb, attention").
std::string suite_list();

/// The one-line description of the bench command, naming the suites.
std::string bench_description();

/// Registers the positional suite and --json, --repetitions, --warmup,
/// --quick, --only and --isa on `app` (a subcommand or a program's own app), storing into
/// `args`, with the footer that explains the report.
void add_bench_arguments(CLI::App& app, BenchArgs& args);

/// Throws std::invalid_argument, with the bad value, for an unknown suite, a
/// repetition count below 1 or a negative warm-up count.
void check_bench_args(const BenchArgs& args);

/// The command line that gives `args` back through add_bench_arguments
/// (suite first), for running posbias-bench with the options given to
/// `posbias bench`.
std::vector<std::string> bench_command_line(const BenchArgs& args);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_BENCH_OPTIONS_H_
