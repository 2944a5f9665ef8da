// The posbias tool run as a separate process (fork + exec, no shell), for
// the tests of tests/cli/cli_*_test.cc: stdout and stderr captured, the exit
// code, and the project's golden files.
#ifndef POSBIAS_TESTS_CLI_CLI_PROCESS_H_
#define POSBIAS_TESTS_CLI_CLI_PROCESS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posbias/tensor.h"

namespace posbias::cli {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal if the process was killed
  std::string out;
  std::string err;
};

std::string read_file(const std::string& path);

// A file in the temporary directory, removed when this goes out of scope.
class TempFile {
 public:
  TempFile();
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs the posbias tool with `args`, stdout and stderr captured in files (no
// pipes, so a large output cannot dead-lock the test).
ProcessResult run_posbias(const std::vector<std::string>& args);

// The same for the program at `path` (a copy of the tool elsewhere).
ProcessResult run_executable(const std::string& path, const std::vector<std::string>& args);

// Where the tool under test is.
std::string posbias_path();

std::vector<std::string> lines_of(const std::string& text);

// The command line and what it gave, for failure messages.
std::string describe(const std::vector<std::string>& args, const ProcessResult& run);

// Runs a command that must succeed with nothing on stderr.
ProcessResult run_ok(const std::vector<std::string>& args);

// A command that must fail with exit code 2, nothing on stdout and one
// error line containing `message_part`.
void expect_bad_argument(const std::vector<std::string>& args, const std::string& message_part);

// The float32 values of a {"shape", "data"} document, after checking it
// parses and has `shape`.
std::vector<float> json_tensor(const std::string& text, const std::vector<std::int64_t>& shape);

// `t` as the tool prints it with --format json.
std::string json_line(const Tensor& t);

// A file of the project's copy of the golden vectors (tests/data/golden).
std::string golden_copy(const std::string& name);

// The first case of `kind` in the project's golden.json.
nlohmann::json golden_case(const std::string& kind);

}  // namespace posbias::cli

#endif  // POSBIAS_TESTS_CLI_CLI_PROCESS_H_
