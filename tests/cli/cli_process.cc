#include "cli_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace posbias::cli {

using json = nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}


TempFile::TempFile() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "posbias_cli_test_XXXXXX").string();
  fd_ = mkstemp(pattern.data());
  path_ = pattern;
}

TempFile::~TempFile() {
  if (fd_ >= 0) close(fd_);
  std::remove(path_.c_str());
}

ProcessResult run_posbias(const std::vector<std::string>& args) {
  return run_executable(POSBIAS_CLI_PATH, args);
}

std::string posbias_path() { return POSBIAS_CLI_PATH; }

ProcessResult run_executable(const std::string& path, const std::vector<std::string>& args) {
  TempFile out;
  TempFile err;
  EXPECT_GE(out.fd(), 0);
  EXPECT_GE(err.fd(), 0);
  std::vector<std::string> argv_storage = {path};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out.fd(), STDOUT_FILENO);
    dup2(err.fd(), STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ProcessResult run;
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) {
    ADD_FAILURE() << "could not run " << path;
    return run;
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = read_file(out.path());
  run.err = read_file(err.path());
  return run;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string describe(const std::vector<std::string>& args, const ProcessResult& run) {
  std::string s = "posbias";
  for (const std::string& a : args) s += " '" + a + "'";
  return s + "\n--- exit code " + std::to_string(run.exit_code) + "\n--- stdout:\n" + run.out +
         "\n--- stderr:\n" + run.err;
}

// Runs a command that must succeed with nothing on stderr.
ProcessResult run_ok(const std::vector<std::string>& args) {
  ProcessResult run = run_posbias(args);
  EXPECT_EQ(run.exit_code, 0) << describe(args, run);
  EXPECT_EQ(run.err, "") << describe(args, run);
  return run;
}

// The float32 values of a {"shape", "data"} document, after checking it
// parses and has `shape`.
std::vector<float> json_tensor(const std::string& text, const std::vector<std::int64_t>& shape) {
  const json doc = json::parse(text);  // throws (fails the test) if not JSON
  EXPECT_EQ(doc.at("shape").get<std::vector<std::int64_t>>(), shape);
  std::vector<float> values;
  for (const json& v : doc.at("data")) values.push_back(v.get<float>());
  return values;
}

void expect_bad_argument(const std::vector<std::string>& args, const std::string& message_part) {
  const ProcessResult run = run_posbias(args);
  EXPECT_EQ(run.exit_code, 2) << describe(args, run);
  EXPECT_EQ(run.out, "") << describe(args, run);
  const std::vector<std::string> lines = lines_of(run.err);
  ASSERT_EQ(lines.size(), 1u) << describe(args, run);
  EXPECT_EQ(lines[0].rfind("posbias: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(message_part), std::string::npos)
      << "expected '" << message_part << "' in: " << lines[0];
}

std::string json_line(const Tensor& t) { return to_json(t) + "\n"; }

std::string golden_copy(const std::string& name) {
  return std::string(POSBIAS_GOLDEN_COPY_DIR) + "/" + name;
}

// The first case of `kind` in the project's golden.json.
json golden_case(const std::string& kind) {
  const json doc = json::parse(read_file(golden_copy("golden.json")));
  for (const json& c : doc.at("cases")) {
    if (c.at("kind") == kind) return c;
  }
  ADD_FAILURE() << "golden.json has no case of kind " << kind;
  return json();
}

}  // namespace posbias::cli
