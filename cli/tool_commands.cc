// `posbias demo` and `posbias check-golden`: the command-line side of work
// done in demo.cc and golden_check.cc.
#include <unistd.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "demo.h"
#include "golden_check.h"

namespace posbias::cli {

Command add_demo_command(CLI::App& app) {
  struct Args {
    DemoOptions options;
    std::string progress = "auto";
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = add_command(
      app, "demo", "The seed documents' examples, run and explained, with pictures and timings",
      "Runs the usage examples of the AlibiPositionalBias documentation (heads 4 of\n"
      "8: (10, 10), (5, 5) from the stored bias, (8, 15)), a decode step, the\n"
      "\"ALiBi\" seed's worked example and its AlibiBias builder (causal and not),\n"
      "the DynamicPositionBias documentation's module(0, 5) (an empty tensor: i and\n"
      "j are lengths) with what it meant, and its \"Inspecting the bias\" as\n"
      "heatmaps (written to --out, named at the end). Then attention at a long\n"
      "sequence with the bias materialised and fused, time and peak memory, each in\n"
      "a child process. A progress bar goes to stderr while that runs, by default\n"
      "only when stderr is a terminal. Exit code 1 if something it states does not\n"
      "hold; 2 if the folder cannot be written.");
  sub->add_option("--out", args->options.plot_dir, "Folder for the pictures (created if missing)")
      ->type_name("DIR")
      ->default_str(args->options.plot_dir);
  add_int64_option(*sub, "--length", args->options.attention_length,
                   "Sequence length of the attention comparison (64..65536)")
      ->default_str(std::to_string(args->options.attention_length));
  add_int64_option(*sub, "--repetitions", args->options.repetitions,
                   "Timed runs per attention variant (1..20); the median is shown")
      ->default_str(std::to_string(args->options.repetitions));
  sub->add_option("--progress", args->progress,
                  "Progress bar on stderr: auto (when stderr is a terminal), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->default_str("auto");
  return {sub, [args](std::ostream& out) {
            DemoOptions o = args->options;
            if (o.attention_length < 64 || o.attention_length > 65536) {
              throw std::invalid_argument("--length must be in [64, 65536], got " +
                                          std::to_string(o.attention_length));
            }
            if (o.repetitions < 1 || o.repetitions > 20) {
              throw std::invalid_argument("--repetitions must be in [1, 20], got " +
                                          std::to_string(o.repetitions));
            }
            o.progress = args->progress == "always" ||
                         (args->progress == "auto" && isatty(STDERR_FILENO) != 0);
            return run_demo(out, o);
          }};
}

// Exit code 1 if a case failed; GoldenFileError (unreadable or malformed
// file) becomes exit code 2 in main(), like any bad argument.
Command add_check_golden_command(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  CLI::App* sub =
      add_command(app, "check-golden", "Check this build against a reference-vector file",
                  "The format is tests/data/golden/README.md. Prints one line per failing case,\n"
                  "then 'N passed, M failed, K skipped' (skipped: kinds this build does not\n"
                  "check yet, and unknown kinds). Exit code 1 if a case failed, 2 if the file\n"
                  "cannot be read or is not a golden file (also: past 64 MiB, or JSON nested\n"
                  "past 64 levels).");
  sub->add_option("file", *file, "The golden file, e.g. tests/data/golden/golden.json")->required();
  return {sub, [file](std::ostream& out) {
            const GoldenReport report = check_golden_file(*file);
            // Pending kinds are summarised per kind; unknown kinds are listed
            // one by one, since they are more likely a typo than a plan.
            std::map<std::string, std::size_t> pending;
            for (const CaseResult& c : report.cases) {
              if (c.status == CaseStatus::kFailed) {
                out << "FAIL case " << c.index << " (" << (c.kind.empty() ? "no kind" : c.kind)
                    << "): " << c.message << "\n";
              } else if (c.status == CaseStatus::kSkipped && !c.known_kind) {
                out << "skip case " << c.index << ": " << c.message << "\n";
              } else if (c.status == CaseStatus::kSkipped) {
                ++pending[c.kind];
              }
            }
            for (const auto& [kind, count] : pending) {
              out << "skip " << count << " case" << (count == 1 ? "" : "s") << " of kind '" << kind
                  << "' (not checked by this build yet)\n";
            }
            out << report.summary() << "\n";
            return report.failed() > 0 ? 1 : 0;
          }};
}

}  // namespace posbias::cli
