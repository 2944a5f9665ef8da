#include "bench_options.h"

#include <algorithm>
#include <stdexcept>

#include "options.h"

namespace posbias::bench {

std::vector<std::string> suite_names() { return {"alibi", "dpb", "attention"}; }

std::string suite_list() {
  std::string names;
  for (const std::string& name : suite_names()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

std::string bench_description() { return "Time a benchmark suite (" + suite_list() + ")"; }

void add_bench_arguments(CLI::App& app, BenchArgs& args) {
  app.footer(
      "Reports medians over repeated runs after a warm-up, each with the medians of\n"
      "its baselines measured in the same run. --json prints one object per line\n"
      "per case (case, median_ms, baselines), a stable interface for dashboards.\n"
      "Exit code 1 when a case's measurement is known to be broken (its \"error\",\n"
      "also named on stderr).");
  app.add_option("suite", args.suite, "The suite to run: " + suite_list())->required();
  app.add_flag("--json", args.options.json,
               "One JSON object per line per case, with case, median_ms and baselines");
  // Integers by the tools' one rule (base 10: "010" is 10, not CLI11's octal).
  posbias::cli::add_int64_option(app, "--repetitions", args.options.repetitions,
                                 "Timed runs per case (>= 1); the median is reported")
      ->default_str(std::to_string(args.options.repetitions));
  posbias::cli::add_int64_option(app, "--warmup", args.options.warmup, "Untimed runs first (>= 0)")
      ->default_str(std::to_string(args.options.warmup));
  app.add_flag("--quick", args.options.quick, "Smaller sizes (to test the harness)");
  app.add_option("--only", args.options.only,
                 "Only the cases whose name contains this text (cases timed together with one "
                 "of them still run, to keep their same-run baselines)");
  app.add_option("--isa", args.options.isa,
                 "Run posbias's kernels and the baselines' probes in this instruction set of "
                 "Highway's only (AVX2, AVX3, AVX3_ZEN4, ...; one this CPU has): an AVX-512 "
                 "machine measures its AVX2 code. The ggml and PyTorch peers keep their own");
}

void check_bench_args(const BenchArgs& args) {
  const std::vector<std::string> names = suite_names();
  if (std::find(names.begin(), names.end(), args.suite) == names.end()) {
    throw std::invalid_argument("unknown benchmark suite '" + args.suite +
                                "' (known: " + suite_list() + ")");
  }
  if (args.options.repetitions < 1) {
    throw std::invalid_argument("--repetitions must be >= 1, got " +
                                std::to_string(args.options.repetitions));
  }
  if (args.options.warmup < 0) {
    throw std::invalid_argument("--warmup must be >= 0, got " +
                                std::to_string(args.options.warmup));
  }
}

std::vector<std::string> bench_command_line(const BenchArgs& args) {
  std::vector<std::string> words = {args.suite, "--repetitions",
                                    std::to_string(args.options.repetitions), "--warmup",
                                    std::to_string(args.options.warmup)};
  if (args.options.json) words.push_back("--json");
  if (args.options.quick) words.push_back("--quick");
  if (!args.options.only.empty()) {
    words.push_back("--only");
    words.push_back(args.options.only);
  }
  if (!args.options.isa.empty()) {
    words.push_back("--isa");
    words.push_back(args.options.isa);
  }
  return words;
}

}  // namespace posbias::bench
