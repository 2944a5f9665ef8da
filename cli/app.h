// The posbias command-line tool as a callable function, so that main(), the
// tests and the argument fuzzer (fuzz/) run exactly the same code.
#ifndef POSBIAS_CLI_APP_H_
#define POSBIAS_CLI_APP_H_

#include <ostream>

namespace posbias::cli {

/// Runs `posbias argv[1] ...`: the command's output goes to `out`, errors
/// to `err` (one line, "posbias: error: ..."). Returns the exit code: 0
/// success, 1 a failed check or run, 2 bad arguments or input (see app.cc).
/// Never throws.
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_APP_H_
