// Running another program of the project from the posbias tool: `posbias
// bench` runs posbias-bench, which links what the tool must not (OpenBLAS,
// the benchmark suites). Found beside the running executable first (a build
// tree puts both in one folder, an install puts both in its bindir), then in
// the folders given.
#ifndef POSBIAS_CLI_RUN_PROGRAM_H_
#define POSBIAS_CLI_RUN_PROGRAM_H_

#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace posbias::cli {

/// A program the tool needs is not there; the message says how to get it.
/// run() (app.cc) turns it into exit code 2 and one error line.
class MissingProgramError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The folder of the running executable (from /proc/self/exe), or "" when
/// it cannot be read.
std::string own_directory();

/// The path of the executable file `name` in the first of `dirs` that has
/// one (empty entries are skipped), or "" when none has.
std::string find_program(const std::string& name, const std::vector<std::string>& dirs);

/// Runs `path` with `args` (argv[0] is `path`) in a child process (fork and
/// exec, no shell): its standard output is copied to `out` as it comes, its
/// standard input and error are this process's. Returns its exit status, or
/// 128 + the signal that ended it. Throws std::runtime_error when it cannot
/// be started (the message names `path` and the reason).
int run_program(const std::string& path, const std::vector<std::string>& args, std::ostream& out);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_RUN_PROGRAM_H_
