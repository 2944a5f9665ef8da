// posbias-bench: the benchmark suites (bench_suite.h) as a program of their
// own, so that OpenBLAS and the PyTorch peers stay out of the posbias tool.
// `posbias bench SUITE [options]` checks its options and runs this program
// with them; it can also be run directly, with the same options.
//
// Exit codes: 0 success; 1 a case's measurement is known to be broken (its
// "error", also named on stderr) or the run failed; 2 bad arguments.
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "bench_options.h"
#include "bench_suite.h"
#include "openblas_core.h"
#include "options.h"
#include "suite_common.h"

namespace {

int fail(const std::string& message, int code) {
  std::cerr << "posbias-bench: error: " << message << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  posbias::bench::BenchArgs args;
  CLI::App app{posbias::bench::bench_description() + "; `posbias bench` runs this program",
               "posbias-bench"};
  posbias::bench::add_bench_arguments(app, args);
  posbias::cli::refuse_empty_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see 'posbias-bench --help')", 2);
  }
  try {
    posbias::bench::check_bench_args(args);
    posbias::bench::use_only_isa(args.options.isa);  // before any kernel or probe runs
    // The sgemm roofline and the PyTorch peers run on OpenBLAS: with the
    // kernels of this CPU, not a generic core OpenBLAS fell back to.
    posbias::bench::run_with_this_cpus_openblas(argv);
    // A case whose measurement is known to be broken (its "error") fails
    // the run: exit 1, one line per such case on stderr.
    int status = 0;
    for (const posbias::bench::CaseResult& r :
         posbias::bench::run_suite(args.suite, args.options, std::cout)) {
      if (r.error.empty()) continue;
      std::cerr << "posbias bench: " << r.name << " could not be measured: " << r.error << "\n";
      status = 1;
    }
    std::cout.flush();
    return std::cout ? status : fail("could not write the output", 1);
  } catch (const std::invalid_argument& e) {
    return fail(e.what(), 2);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", 1);
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}
