// `posbias bench`: checks the suite and its options (the same ones as
// posbias-bench, benchmarks/bench_options.h), then runs the posbias-bench
// program with them. The suites link OpenBLAS and time the PyTorch peers;
// keeping them in a program of their own keeps both out of the tool.
#include <memory>
#include <string>

#include "bench_options.h"
#include "commands.h"
#include "run_program.h"

namespace posbias::cli {
namespace {

constexpr const char* kBenchProgram = "posbias-bench";

// Beside this executable (a build tree's cli/ folder holds both, an install
// both in its bindir), then the install's bindir.
std::string find_bench_program(std::string* looked_in) {
  std::vector<std::string> dirs = {own_directory()};
#ifdef POSBIAS_INSTALL_BINDIR
  if (dirs[0] != POSBIAS_INSTALL_BINDIR) dirs.push_back(POSBIAS_INSTALL_BINDIR);
#endif
  for (const std::string& dir : dirs) {
    if (!dir.empty()) *looked_in += (looked_in->empty() ? "" : " and ") + dir;
  }
  return find_program(kBenchProgram, dirs);
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto args = std::make_shared<bench::BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", bench::bench_description());
  bench::add_bench_arguments(*sub, *args);
  sub->footer(sub->get_footer() +
              "\nThe suites run in the posbias-bench program (the same options), found beside\n"
              "posbias; build it with `cmake --build build --target posbias-bench`.");
  return {sub, [args](std::ostream& out) {
            bench::check_bench_args(*args);
            std::string looked_in;
            const std::string program = find_bench_program(&looked_in);
            if (program.empty()) {
              throw MissingProgramError(
                  std::string("posbias bench runs the ") + kBenchProgram +
                  " program, which is not built (looked in " +
                  (looked_in.empty() ? "no folder" : looked_in) +
                  "); build it with `cmake --build build --target " + kBenchProgram + "`");
            }
            return run_program(program, bench::bench_command_line(*args), out);
          }};
}

}  // namespace posbias::cli
