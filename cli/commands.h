// The subcommands of the `posbias` tool. Each add_*_command registers its
// options on the CLI11 app and returns what runs it once the command line has
// been parsed; main() picks the one that was given.
//
// Errors: a bad argument value (caught by the library or by the command)
// throws std::invalid_argument or std::length_error with the values in the
// message; main() turns it into exit code 2 and one line on stderr.
#ifndef POSBIAS_CLI_COMMANDS_H_
#define POSBIAS_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "options.h"
#include "posbias/tensor.h"

namespace posbias::cli {

struct Command {
  CLI::App* app = nullptr;
  // Writes the command's output to `out` and returns the exit code.
  std::function<int(std::ostream& out)> run;
};

/// `posbias slopes`: ALiBi slope schedules.
Command add_slopes_command(CLI::App& app);
/// `posbias alibi`: AlibiPositionalBias(H, T).forward(i, j).
Command add_alibi_command(CLI::App& app);
/// `posbias alibi-bias`: the "ALiBi" seed's AlibiBias builder.
Command add_alibi_bias_command(CLI::App& app);
/// `posbias dpb`: DynamicPositionBias(dim, heads).forward(i, j) (or its table).
Command add_dpb_command(CLI::App& app);
/// `posbias t5`: RelativePositionBias(...).forward(i, j), its table or buckets.
Command add_t5_command(CLI::App& app);
/// `posbias t5-bucket`: t5_relative_position_bucket of a list of positions.
Command add_t5_bucket_command(CLI::App& app);
/// `posbias demo`: the documentation's examples, explained.
Command add_demo_command(CLI::App& app);
/// `posbias check-golden FILE`: this build against reference vectors.
Command add_check_golden_command(CLI::App& app);
/// `posbias bench SUITE`: the benchmark suites of benchmarks/bench_suite.h.
Command add_bench_command(CLI::App& app);
/// `posbias attention`: attention_forward on seeded random or given inputs.
Command add_attention_command(CLI::App& app);

/// Subcommand `name` of `app` with its one-line `description` (in `posbias
/// --help`) and `footer` (the end of `posbias NAME --help`: what it computes,
/// examples).
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description,
                      const std::string& footer);

/// `--format text|json` (default text) on `sub`, stored in `format`.
void add_format_option(CLI::App& sub, std::string& format);

/// `--plot FILE` on `sub` (a heatmap of the bias, see bias_plot.h).
void add_plot_option(CLI::App& sub, std::string& path);

/// `t` like PyTorch's print(tensor) (format "text") or as the JSON of
/// posbias::write_json (format "json"), then a newline.
void print_tensor(std::ostream& out, const Tensor& t, const std::string& format);

/// The whole string as an unsigned 64-bit seed (an optional '+' first);
/// std::invalid_argument naming --seed otherwise.
std::uint64_t parse_seed(const std::string& text);

/// `--seed UINT64` (default 0) on `sub`, stored as text for parse_seed().
void add_seed_option(CLI::App& sub, std::string& seed, const std::string& help);

/// Runs `io`, a file read or write the user asked for with `option`; the
/// library's std::runtime_error (no such file, a directory, no permission)
/// becomes std::invalid_argument naming the option and the path (exit 2).
void file_argument(const std::string& option, const std::string& path,
                   const std::function<void()>& io);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_COMMANDS_H_
