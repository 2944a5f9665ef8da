// The posbias tool run as a separate process (fork + exec, no shell): the
// output of every subcommand, exit codes, and one-line errors on stderr.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attention_inputs.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

namespace posbias::cli {
namespace {

using json = nlohmann::json;

struct ProcessResult {
  int exit_code = -1;  // 128 + signal if the process was killed
  std::string out;
  std::string err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file in the temporary directory, removed when this goes out of scope.
class TempFile {
 public:
  TempFile() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "posbias_cli_test_XXXXXX").string();
    fd_ = mkstemp(pattern.data());
    path_ = pattern;
  }
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    std::remove(path_.c_str());
  }
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
ProcessResult run_posbias(const std::vector<std::string>& args) {
  TempFile out;
  TempFile err;
  EXPECT_GE(out.fd(), 0);
  EXPECT_GE(err.fd(), 0);
  std::vector<std::string> argv_storage = {POSBIAS_CLI_PATH};
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
    ADD_FAILURE() << "could not run " << POSBIAS_CLI_PATH;
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

// --------------------------------------------------------------- the basics

TEST(Cli, VersionPrintsTheLibraryVersion) {
  const ProcessResult run = run_ok({"--version"});
  EXPECT_EQ(run.out, std::string("posbias ") + version() + "\n");
}

TEST(Cli, HelpExitsZero) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--help"},
                                               {"-h"},
                                               {"slopes", "--help"},
                                               {"alibi", "--help"},
                                               {"alibi-bias", "--help"},
                                               {"dpb", "--help"},
                                               {"t5", "--help"},
                                               {"t5-bucket", "--help"},
                                               {"demo", "--help"},
                                               {"attention", "--help"},
                                               {"check-golden", "--help"},
                                               {"bench", "--help"}}) {
    const ProcessResult run = run_ok(args);
    EXPECT_NE(run.out.find("Usage: posbias"), std::string::npos) << describe(args, run);
  }
  const ProcessResult top = run_ok({"--help"});
  for (const char* command : {"demo", "slopes", "alibi", "alibi-bias", "dpb", "t5", "t5-bucket",
                              "attention", "check-golden", "bench"}) {
    EXPECT_NE(top.out.find(std::string("  ") + command + " "), std::string::npos)
        << "--help does not list " << command << "\n"
        << top.out;
  }
}

// ------------------------------------------------------------------ slopes

TEST(Cli, SlopesJsonIsExact) {
  const ProcessResult run = run_ok({"slopes", "--heads", "6", "--format", "json"});
  EXPECT_EQ(run.out,
            "{\"shape\": [6], \"data\": [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]}\n");
  EXPECT_EQ(json_tensor(run.out, {6}), alibi_slopes(6));
}

TEST(Cli, SlopesTextIsOneTensorLine) {
  const ProcessResult run = run_ok({"slopes", "--heads", "8"});
  EXPECT_EQ(run.out, "tensor([0.5000, 0.2500, 0.1250, 0.0625, 0.0312, 0.0156, 0.0078, 0.0039])\n");
}

TEST(Cli, SlopesNonPowerOfTwoKeepsTheReferenceOrder) {
  const ProcessResult run = run_ok({"slopes", "--heads", "12", "--format", "json"});
  const std::vector<float> slopes = json_tensor(run.out, {12});
  EXPECT_EQ(slopes, alibi_slopes(12));
  EXPECT_EQ(slopes[8], 0.707106769f);
}

TEST(Cli, SlopesRangeIsThatPartOfTheFullSchedule) {
  const ProcessResult run =
      run_ok({"slopes", "--heads", "12", "--range", "8:12", "--format", "json"});
  const std::vector<float> all = alibi_slopes(12);
  EXPECT_EQ(json_tensor(run.out, {4}), std::vector<float>(all.begin() + 8, all.end()));
}

TEST(Cli, SlopesMaxBias) {
  const ProcessResult run =
      run_ok({"slopes", "--heads", "8", "--max-bias", "4", "--format", "json"});
  EXPECT_EQ(json_tensor(run.out, {8}), alibi_slopes_max_bias(8, 4.0f));
  const ProcessResult range = run_ok(
      {"slopes", "--heads", "24", "--max-bias", "4", "--range", "16:24", "--format", "json"});
  EXPECT_EQ(json_tensor(range.out, {8}), alibi_slopes_range_max_bias(24, 16, 24, 4.0f));
}

// ------------------------------------------------------------------- alibi

TEST(Cli, AlibiJsonIsExact) {
  const ProcessResult run = run_ok(
      {"alibi", "--heads", "1", "--slopes", "0.5", "-i", "2", "-j", "3", "--format", "json"});
  EXPECT_EQ(run.out, "{\"shape\": [1, 2, 3], \"data\": [-0.5, 0, -0.5, -1, -0.5, 0]}\n");
}

TEST(Cli, AlibiSlopesAloneSetTheHeads) {
  const ProcessResult run =
      run_ok({"alibi", "--slopes", "0.5,0.25", "-i", "1", "-j", "2", "--format", "json"});
  EXPECT_EQ(run.out, "{\"shape\": [2, 1, 2], \"data\": [-0.5, 0, -0.25, 0]}\n");
}

// A list is commas, several arguments or the option repeated, in order;
// a negative number is a value, not an option.
TEST(Cli, ListOptionsTakeCommasArgumentsAndRepeats) {
  const std::string expected = "{\"shape\": [3, 1, 2], \"data\": [-0.5, 0, -0.25, 0, 0.125, 0]}\n";
  for (const std::vector<std::string>& slopes :
       {std::vector<std::string>{"--slopes", "0.5,0.25,-0.125"},
        std::vector<std::string>{"--slopes", "0.5", "0.25", "-0.125"},
        std::vector<std::string>{"--slopes", "0.5,0.25", "--slopes", "-0.125"},
        std::vector<std::string>{"--slopes=+0.5,0.25,-125e-3"}}) {
    std::vector<std::string> args = {"alibi", "-i", "1", "-j", "2", "--format", "json"};
    args.insert(args.end(), slopes.begin(), slopes.end());
    const ProcessResult run = run_ok(args);
    EXPECT_EQ(run.out, expected) << describe(args, run);
  }
  EXPECT_EQ(run_ok({"t5-bucket", "--rel", "-3,+2", "5", "--format", "json"}).out,
            "{\"rel\": [-3, 2, 5], \"buckets\": [3, 18, 21]}\n");
}

TEST(Cli, AlibiTextLooksLikePrintInPyTorch) {
  const ProcessResult run =
      run_ok({"alibi", "--heads", "1", "--slopes", "0.5", "-i", "2", "-j", "3"});
  EXPECT_EQ(run.out,
            "tensor([[[-0.5000,  0.0000, -0.5000],\n"
            "         [-1.0000, -0.5000,  0.0000]]])\n");
}

TEST(Cli, AlibiDocumentationExampleMatchesTheLibrary) {
  const ProcessResult run = run_ok(
      {"alibi", "--heads", "4", "--total-heads", "8", "-i", "8", "-j", "15", "--format", "json"});
  const std::vector<float> values = json_tensor(run.out, {8, 8, 15});
  EXPECT_EQ(values, AlibiPositionalBias(4, 8).forward(8, 15).to_float_vector());
  // Heads 4..7 are zero.
  for (std::size_t k = 4 * 8 * 15; k < values.size(); ++k) ASSERT_EQ(values[k], 0.0f);
}

TEST(Cli, AlibiDtypes) {
  for (const auto& [name, dtype] : {std::pair<const char*, DType>{"bfloat16", DType::kBFloat16},
                                    {"float16", DType::kFloat16},
                                    {"float32", DType::kFloat32}}) {
    const ProcessResult run = run_ok({"alibi", "--heads", "12", "--total-heads", "16", "-i", "5",
                                      "-j", "9", "--dtype", name, "--format", "json"});
    const AlibiPositionalBias module(12, 16, dtype);
    EXPECT_EQ(json_tensor(run.out, {16, 5, 9}), module.forward(5, 9).to_float_vector()) << name;
    const ProcessResult text =
        run_ok({"alibi", "--heads", "2", "-i", "2", "-j", "2", "--dtype", name});
    const bool names_dtype =
        text.out.find(std::string("dtype=torch.") + name + ")") != std::string::npos;
    EXPECT_EQ(names_dtype, dtype != DType::kFloat32) << text.out;
  }
}

TEST(Cli, AlibiBigTensorTextIsSummarisedJsonIsComplete) {
  const ProcessResult text = run_ok({"alibi", "--heads", "16", "-i", "64", "-j", "64"});
  EXPECT_NE(text.out.find("..."), std::string::npos);
  EXPECT_LT(text.out.size(), 5000u);
  const ProcessResult full =
      run_ok({"alibi", "--heads", "16", "-i", "64", "-j", "64", "--format", "json"});
  EXPECT_EQ(json_tensor(full.out, {16, 64, 64}),
            AlibiPositionalBias(16).forward(64, 64).to_float_vector());
}

TEST(Cli, AlibiEmptyLengths) {
  const ProcessResult run =
      run_ok({"alibi", "--heads", "2", "-i", "0", "-j", "3", "--format", "json"});
  EXPECT_EQ(run.out, "{\"shape\": [2, 0, 3], \"data\": []}\n");
}

// -------------------------------------------------------------- alibi-bias

TEST(Cli, AlibiBiasSeedWorkedExample) {
  const ProcessResult run = run_ok({"alibi-bias", "--heads", "1", "--no-causal", "--slopes", "-0.2",
                                    "-i", "3", "-j", "3", "--format", "json"});
  const std::vector<float> bias = json_tensor(run.out, {1, 1, 3, 3});
  const std::vector<float> scores = {1, 2, 3, 2, 1.5f, 2.5f, 3, 2.5f, 1.2f};
  const std::vector<float> expected = {1, 1.8f, 2.6f, 1.8f, 1.5f, 2.3f, 2.6f, 2.3f, 1.2f};
  ASSERT_EQ(bias.size(), 9u);
  for (std::size_t k = 0; k < 9; ++k) {
    EXPECT_NEAR(scores[k] + bias[k], expected[k], 1e-6) << "element " << k;
  }
}

TEST(Cli, AlibiBiasDefaultsAreCausalAndTheSeedSlopes) {
  const ProcessResult run =
      run_ok({"alibi-bias", "--heads", "3", "-i", "3", "-j", "4", "--format", "json"});
  EXPECT_EQ(json_tensor(run.out, {1, 3, 3, 4}), AlibiBias(3).build(3, 4).to_float_vector());
  const ProcessResult causal = run_ok({"alibi-bias", "--n-heads", "3", "--causal", "--q-len", "3",
                                       "--k-len", "4", "--format", "json"});
  EXPECT_EQ(causal.out, run.out);
  const ProcessResult bf16 = run_ok({"alibi-bias", "--heads", "2", "--no-causal", "-i", "2", "-j",
                                     "5", "--dtype", "bf16", "--format", "json"});
  EXPECT_EQ(json_tensor(bf16.out, {1, 2, 2, 5}),
            AlibiBias(2, false).build(2, 5, DType::kBFloat16).to_float_vector());
}

// --------------------------------------------------------------------- dpb

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

DynamicPositionBias x_transformers(std::int64_t dim, std::int64_t heads, std::int64_t depth,
                                   bool norm, bool log_distance, std::uint64_t seed) {
  DpbOptions o;
  o.dim = dim;
  o.heads = heads;
  o.variant = DpbVariant::kXTransformers;
  o.depth = depth;
  o.norm = norm;
  o.log_distance = log_distance;
  return DynamicPositionBias(o, seed);
}

TEST(Cli, DpbJsonIsTheLibrarysForward) {
  const ProcessResult run = run_ok({"dpb", "--dim", "4", "--heads", "2", "-i", "3", "-j", "5",
                                    "--seed", "3", "--format", "json"});
  EXPECT_EQ(run.out, json_line(DynamicPositionBias(4, 2, 3).forward(3, 5)));
  json_tensor(run.out, {2, 3, 5});
  // The default seed is 0.
  const ProcessResult seed0 =
      run_ok({"dpb", "--dim", "4", "--heads", "2", "-i", "2", "-j", "2", "--format", "json"});
  EXPECT_EQ(seed0.out, json_line(DynamicPositionBias(4, 2, 0).forward(2, 2)));
}

TEST(Cli, DpbTextLooksLikePrintInPyTorch) {
  const ProcessResult run =
      run_ok({"dpb", "--dim", "8", "--heads", "3", "-i", "4", "-j", "6", "--seed", "1"});
  EXPECT_EQ(run.out, format_tensor(DynamicPositionBias(8, 3, 1).forward(4, 6)) + "\n");
  EXPECT_EQ(run.out.rfind("tensor([[[", 0), 0u) << run.out;
}

TEST(Cli, DpbEmptyAndDecodeStep) {
  // The documentation's module(0, 5): i and j are lengths.
  const ProcessResult empty =
      run_ok({"dpb", "--dim", "64", "--heads", "8", "-i", "0", "-j", "5", "--format", "json"});
  EXPECT_EQ(empty.out, "{\"shape\": [8, 0, 5], \"data\": []}\n");
  const ProcessResult decode = run_ok({"dpb", "--dim", "16", "--heads", "2", "-i", "1", "-j", "7",
                                       "--seed", "4", "--format", "json"});
  const Tensor full = DynamicPositionBias(16, 2, 4).forward(7, 7);
  EXPECT_EQ(json_tensor(decode.out, {2, 1, 7}), full.slice(1, 6, 7).to_float_vector());
}

TEST(Cli, DpbXTransformersVariant) {
  for (const auto& [depth, norm, log_distance] :
       {std::tuple<int, bool, bool>{1, false, false}, {3, true, true}, {2, false, true}}) {
    std::vector<std::string> args = {"dpb",
                                     "--dim",
                                     "6",
                                     "--heads",
                                     "3",
                                     "--variant",
                                     "x-transformers",
                                     "--depth",
                                     std::to_string(depth),
                                     "-i",
                                     "3",
                                     "-j",
                                     "5",
                                     "--seed",
                                     "8",
                                     "--format",
                                     "json"};
    if (norm) args.push_back("--norm");
    if (log_distance) args.push_back("--log-distance");
    const ProcessResult run = run_ok(args);
    EXPECT_EQ(run.out, json_line(x_transformers(6, 3, depth, norm, log_distance, 8).forward(3, 5)))
        << describe(args, run);
  }
}

TEST(Cli, DpbTableAndDtypes) {
  const ProcessResult zeta = run_ok({"dpb", "--dim", "4", "--heads", "2", "-j", "6", "--table",
                                     "--seed", "2", "--format", "json"});
  EXPECT_EQ(zeta.out, json_line(DynamicPositionBias(4, 2, 2).table(6)));
  json_tensor(zeta.out, {2, 6});
  const ProcessResult xt =
      run_ok({"dpb", "--dim", "4", "--heads", "2", "-j", "6", "--table", "--variant",
              "x-transformers", "--seed", "2", "--format", "json"});
  EXPECT_EQ(xt.out, json_line(x_transformers(4, 2, 2, false, false, 2).table(6)));
  json_tensor(xt.out, {2, 11});
  for (const auto& [name, dtype] : {std::pair<const char*, DType>{"bfloat16", DType::kBFloat16},
                                    {"float16", DType::kFloat16}}) {
    const ProcessResult run = run_ok({"dpb", "--dim", "4", "--heads", "2", "-i", "2", "-j", "3",
                                      "--dtype", name, "--format", "json"});
    EXPECT_EQ(run.out, json_line(DynamicPositionBias(4, 2).forward(2, 3, dtype))) << name;
    const ProcessResult table = run_ok({"dpb", "--dim", "4", "--heads", "2", "-j", "3", "--table",
                                        "--dtype", name, "--format", "json"});
    EXPECT_EQ(table.out, json_line(DynamicPositionBias(4, 2).table(3).to(dtype))) << name;
    const ProcessResult text =
        run_ok({"dpb", "--dim", "4", "--heads", "2", "-i", "2", "-j", "3", "--dtype", name});
    EXPECT_NE(text.out.find(std::string("dtype=torch.") + name + ")"), std::string::npos)
        << text.out;
  }
}

TEST(Cli, DpbGoldenWeightsReproduceTheGoldenValues) {
  const json c = golden_case("dynamic_position_bias_file");
  ASSERT_TRUE(c.is_object());
  const std::string weights = golden_copy(c.at("file").get<std::string>());
  for (const json& call : c.at("calls")) {
    const std::string i = std::to_string(call.at("i").get<std::int64_t>());
    const std::string j = std::to_string(call.at("j").get<std::int64_t>());
    const ProcessResult run =
        run_ok({"dpb", "--dim", std::to_string(c.at("dim").get<std::int64_t>()), "--heads",
                std::to_string(c.at("heads").get<std::int64_t>()), "-i", i, "-j", j, "--weights",
                weights, "--format", "json"});
    const std::vector<float> got =
        json_tensor(run.out, call.at("shape").get<std::vector<std::int64_t>>());
    const std::vector<double> want = call.at("data").get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      ASSERT_LE(std::fabs(got[k] - want[k]), 1e-6 + 1e-5 * std::fabs(want[k])) << "element " << k;
    }
    DynamicPositionBias module(c.at("dim").get<std::int64_t>(), c.at("heads").get<std::int64_t>());
    module.load(weights);
    EXPECT_EQ(run.out, json_line(module.forward(call.at("i"), call.at("j"))));
  }
}

TEST(Cli, DpbSaveThenWeightsRoundTrip) {
  TempFile file;
  const ProcessResult save =
      run_ok({"dpb", "--dim", "5", "--heads", "3", "--seed", "9", "--save", file.path()});
  EXPECT_EQ(save.out, "saved 6 tensors to " + file.path() +
                          ": mlp.0.weight [5, 1] mlp.0.bias [5] mlp.2.weight [5, 5] mlp.2.bias "
                          "[5] mlp.4.weight [3, 5] mlp.4.bias [3]\n");
  // The file holds the seeded state dict, float32, under the torch names.
  const DynamicPositionBias seeded(5, 3, 9);
  const TensorMap saved = load_safetensors(file.path());
  const TensorMap state = seeded.state_dict();
  ASSERT_EQ(saved.size(), state.size());
  for (const auto& [name, tensor] : state) {
    ASSERT_EQ(saved.count(name), 1u) << name;
    EXPECT_EQ(saved.at(name).dtype(), DType::kFloat32) << name;
    EXPECT_EQ(saved.at(name).shape(), tensor.shape()) << name;
    EXPECT_EQ(saved.at(name).to_float_vector(), tensor.to_float_vector()) << name;
  }
  const ProcessResult loaded = run_ok({"dpb", "--dim", "5", "--heads", "3", "-i", "3", "-j", "4",
                                       "--weights", file.path(), "--format", "json"});
  const ProcessResult direct = run_ok({"dpb", "--dim", "5", "--heads", "3", "-i", "3", "-j", "4",
                                       "--seed", "9", "--format", "json"});
  EXPECT_EQ(loaded.out, direct.out);
  EXPECT_EQ(loaded.out, json_line(seeded.forward(3, 4)));

  // With -i and -j the bias is printed as well; x-transformers round trip.
  TempFile xt_file;
  const std::vector<std::string> xt = {
      "--dim",  "4",  "--heads", "2",  "--variant", "x-transformers", "--depth", "2",
      "--norm", "-i", "2",       "-j", "4",         "--format",       "json"};
  std::vector<std::string> save_args = {"dpb", "--seed", "12", "--save", xt_file.path()};
  save_args.insert(save_args.end(), xt.begin(), xt.end());
  const ProcessResult xt_save = run_ok(save_args);
  EXPECT_EQ(xt_save.out, json_line(x_transformers(4, 2, 2, true, false, 12).forward(2, 4)));
  std::vector<std::string> load_args = {"dpb", "--weights", xt_file.path()};
  load_args.insert(load_args.end(), xt.begin(), xt.end());
  EXPECT_EQ(run_ok(load_args).out, xt_save.out);
}

// -------------------------------------------------------------------- t5

TEST(Cli, T5JsonIsTheLibrarysForward) {
  const ProcessResult run =
      run_ok({"t5", "--heads", "3", "-i", "4", "-j", "6", "--seed", "2", "--format", "json"});
  EXPECT_EQ(run.out, json_line(RelativePositionBias(1.0f, false, 32, 128, 3, 2).forward(4, 6)));
  json_tensor(run.out, {3, 4, 6});
  const ProcessResult causal =
      run_ok({"t5", "--heads", "2", "-i", "3", "-j", "40", "--causal", "--scale", "0.5",
              "--num-buckets", "16", "--max-distance", "20", "--seed", "5", "--format", "json"});
  EXPECT_EQ(causal.out, json_line(RelativePositionBias(0.5f, true, 16, 20, 2, 5).forward(3, 40)));
  // i > j is allowed (query positions below zero).
  const ProcessResult tall =
      run_ok({"t5", "--heads", "1", "-i", "3", "-j", "2", "--format", "json"});
  EXPECT_EQ(tall.out, json_line(RelativePositionBias(1.0f, false, 32, 128, 1, 0).forward(3, 2)));
  const ProcessResult text =
      run_ok({"t5", "--heads", "2", "-i", "2", "-j", "3", "--dtype", "bf16"});
  EXPECT_EQ(text.out,
            format_tensor(
                RelativePositionBias(1.0f, false, 32, 128, 2, 0).forward(2, 3, DType::kBFloat16)) +
                "\n");
}

// The table depends on j alone: no -i (as dpb --table; -i with it is
// refused: BadArgument T5TableWithI).
TEST(Cli, T5Table) {
  const ProcessResult run =
      run_ok({"t5", "--heads", "2", "-j", "5", "--table", "--seed", "3", "--format", "json"});
  EXPECT_EQ(run.out, json_line(RelativePositionBias(1.0f, false, 32, 128, 2, 3).distance_table(5)));
  json_tensor(run.out, {2, 9});
}

TEST(Cli, T5BucketGrid) {
  const ProcessResult small = run_ok({"t5", "-i", "2", "-j", "3", "--buckets"});
  // Queries at positions 1 and 2; rel = key - query.
  EXPECT_EQ(small.out,
            "tensor([[ 1,  0, 17],\n"
            "        [ 2,  1,  0]])\n");
  for (const bool causal : {false, true}) {
    std::vector<std::string> args = {
        "t5", "-i",        "7",        "-j",  "300", "--num-buckets", "16", "--max-distance",
        "64", "--buckets", "--format", "json"};
    if (causal) args.push_back("--causal");
    const json doc = json::parse(run_ok(args).out);
    ASSERT_EQ(doc.at("shape"), json::array({7, 300}));
    const std::vector<std::int64_t> data = doc.at("data").get<std::vector<std::int64_t>>();
    ASSERT_EQ(data.size(), 7u * 300u);
    for (std::int64_t r = 0; r < 7; ++r) {
      for (std::int64_t c = 0; c < 300; ++c) {
        ASSERT_EQ(data[static_cast<std::size_t>(r * 300 + c)],
                  t5_relative_position_bucket(c - (300 - 7 + r), causal, 16, 64))
            << r << ", " << c;
      }
    }
  }
  // Large grids are summarised like PyTorch's print.
  const ProcessResult big = run_ok({"t5", "-i", "40", "-j", "40", "--buckets", "--causal"});
  EXPECT_EQ(big.out,
            "tensor([[ 0,  0,  0,  ...,  0,  0,  0],\n"
            "        [ 1,  0,  0,  ...,  0,  0,  0],\n"
            "        [ 2,  1,  0,  ...,  0,  0,  0],\n"
            "        ...,\n"
            "        [22, 22, 22,  ...,  0,  0,  0],\n"
            "        [22, 22, 22,  ...,  1,  0,  0],\n"
            "        [22, 22, 22,  ...,  2,  1,  0]])\n");
  EXPECT_EQ(run_ok({"t5", "-i", "0", "-j", "3", "--buckets"}).out,
            "tensor([], size=(0, 3), dtype=torch.int64)\n");
  EXPECT_EQ(run_ok({"t5", "-i", "0", "-j", "3", "--buckets", "--format", "json"}).out,
            "{\"shape\": [0, 3], \"data\": []}\n");
  // The text is summarised whatever the size (JSON past memory is refused:
  // BadArgument T5BucketsJsonPastMemory).
  const ProcessResult huge =
      run_ok({"t5", "-i", "100000000", "-j", "100000000", "--buckets", "--causal"});
  EXPECT_EQ(lines_of(huge.out).size(), 7u) << huge.out;
}

TEST(Cli, T5BucketCommandMatchesTheGoldenCases) {
  const json doc = json::parse(read_file(golden_copy("golden.json")));
  int checked = 0;
  for (const json& c : doc.at("cases")) {
    if (c.at("kind") != "t5_bucket") continue;
    std::string rel;
    for (const json& r : c.at("rel")) rel += (rel.empty() ? "" : ",") + r.dump();
    std::vector<std::string> args = {"t5-bucket",      "--rel=" + rel,
                                     "--num-buckets",  c.at("num_buckets").dump(),
                                     "--max-distance", c.at("max_distance").dump(),
                                     "--format",       "json"};
    if (c.at("causal").get<bool>()) args.push_back("--causal");
    const json got = json::parse(run_ok(args).out);
    EXPECT_EQ(got.at("rel"), c.at("rel"));
    EXPECT_EQ(got.at("buckets"), c.at("buckets")) << rel;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(run_ok({"t5-bucket", "--rel=-200,-7,0,7,1000"}).out,
            "rel     -200  -7  0   7  1000\n"
            "bucket    15   7  0  23    31\n");
  EXPECT_EQ(run_ok({"t5-bucket", "--rel", "-7,7", "--causal", "--format", "json"}).out,
            "{\"rel\": [-7, 7], \"buckets\": [7, 0]}\n");
}

// A command that must fail with exit code 2, nothing on stdout and one
// error line containing `message_part`.
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

TEST(Cli, DpbBadWeightsFilesExitTwo) {
  const std::vector<std::string> dpb = {"dpb", "--dim", "2",  "--heads", "1",
                                        "-i",  "1",     "-j", "2",       "--weights"};
  const auto with = [&](const std::string& path) {
    std::vector<std::string> args = dpb;
    args.push_back(path);
    return args;
  };
  expect_bad_argument(with("/nonexistent/dpb.safetensors"),
                      "'/nonexistent/dpb.safetensors': No such file or directory");
  const std::string dir = std::filesystem::temp_directory_path().string();
  expect_bad_argument(with(dir), "'" + dir + "'");
  // The golden file is for dim 64, heads 8.
  expect_bad_argument(with(golden_copy("dpb_zeta_dim64_heads8.safetensors")),
                      "mlp.0.weight: expected shape [2, 1], got [64, 1]");

  const DynamicPositionBias module(2, 1, 0);
  TempFile not_safetensors;
  { std::ofstream(not_safetensors.path()) << "not a safetensors file at all"; }
  expect_bad_argument(with(not_safetensors.path()), not_safetensors.path());

  TempFile truncated;
  {
    const std::string bytes = serialize_safetensors(module.state_dict());
    std::ofstream(truncated.path(), std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  }
  expect_bad_argument(with(truncated.path()), truncated.path());

  TempFile renamed;
  {
    TensorMap state = module.state_dict();
    state["mlp.1.weight"] = state.at("mlp.2.weight");
    state.erase("mlp.2.weight");
    save_safetensors(renamed.path(), state);
  }
  expect_bad_argument(with(renamed.path()), "missing mlp.2.weight; unexpected mlp.1.weight");

  TempFile non_finite;
  {
    TensorMap state;
    for (const auto& [name, tensor] : module.state_dict()) state[name] = tensor.contiguous_copy();
    state.at("mlp.2.bias").mutable_data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    save_safetensors(non_finite.path(), state);
  }
  expect_bad_argument(with(non_finite.path()), "mlp.2.bias: element [1] is not finite");

  // --save where nothing can be written: nothing printed either.
  expect_bad_argument({"dpb", "--dim", "2", "--heads", "1", "-i", "1", "-j", "2", "--save",
                       "/nonexistent/dir/dpb.safetensors"},
                      "/nonexistent/dir/dpb.safetensors");
}

// -------------------------------------------------------------------- demo

TEST(Cli, DemoExplainsTheDocumentationExamples) {
  // The attention comparison at the build's demo length (shorter under the
  // sanitizers, as for cli.demo); pictures into a scratch folder.
  const std::string out_dir =
      (std::filesystem::temp_directory_path() / "posbias_cli_test_demo").string();
  const ProcessResult run =
      run_ok({"demo", "--length", POSBIAS_DEMO_LENGTH, "--out", out_dir, "--progress", "never"});
  std::filesystem::remove_all(out_dir);
  for (const char* expected : {
           "bias_module = AlibiPositionalBias(heads=4, total_heads=8)",
           "Example 1: bias = bias_module(10, 10)",
           "Shape [8, 10, 10]",
           "Example 2: bias = bias_module(5, 5)",
           "shares_storage_with(example 1) = true",
           "cached_shape() is still [8, 10, 10]",
           "BOTTOM-RIGHT",
           "Example 3: bias = bias_module(8, 15)",
           "8 queries that are the last 8 of 15 keys",
           "cached_shape() = [8, 8, 15]",
           "Heads 4..7 are all zero",
           "AlibiBias(n_heads=1, causal=false, slopes={-0.2})",
           "tensor([[1.0000, 1.8000, 2.6000],\n"
           "        [1.8000, 1.5000, 2.3000],\n"
           "        [2.6000, 2.3000, 1.2000]])",
           "module = DynamicPositionBias(dim=64, heads=8)",
           "Example 1 (Basic Usage): bias = module(0, 5)",
           "Shape [8, 0, 5], 0 elements: an EMPTY tensor. i and j are LENGTHS",
           "Example 2: bias = module(5, 5)",
           "a Toeplitz matrix",
           "Example 3 (a decode step): bias = module(1, 5)",
           "Shape [8, 1, 5]",
           "need 0 <= i <= j",
           "Every statement above was checked",
       }) {
    EXPECT_NE(run.out.find(expected), std::string::npos) << "missing: " << expected;
  }
  EXPECT_EQ(run.out.find("UNEXPECTED"), std::string::npos) << run.out;
}

// --------------------------------------------------------------- attention

// One `posbias attention` run on random inputs.
struct AttentionRun {
  AttentionShape s;
  std::string bias = "none";  // none, alibi, table, dense
  std::string table_from;     // "", dpb or t5
  bool causal = false;
  std::string seed;   // "" = not given (0)
  std::string dtype;  // "" = not given (float32)
};

AttentionRun attention_run(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                           std::int64_t j, std::int64_t d, const std::string& bias, bool causal) {
  AttentionRun r;
  r.s.b = b;
  r.s.h = h;
  r.s.hk = hk;
  r.s.i = i;
  r.s.j = j;
  r.s.d = d;
  r.bias = bias;
  r.causal = causal;
  return r;
}

std::vector<std::string> attention_args(const AttentionRun& r) {
  std::vector<std::string> args = {"attention",
                                   "--batch",
                                   std::to_string(r.s.b),
                                   "--heads",
                                   std::to_string(r.s.h),
                                   "--kv-heads",
                                   std::to_string(r.s.hk),
                                   "-i",
                                   std::to_string(r.s.i),
                                   "-j",
                                   std::to_string(r.s.j),
                                   "-d",
                                   std::to_string(r.s.d),
                                   "--bias",
                                   r.bias};
  if (r.causal) args.push_back("--causal");
  if (!r.table_from.empty()) args.insert(args.end(), {"--table-from", r.table_from});
  if (!r.seed.empty()) args.insert(args.end(), {"--seed", r.seed});
  if (!r.dtype.empty()) args.insert(args.end(), {"--dtype", r.dtype});
  return args;
}

std::string describe_run(const AttentionRun& r) {
  std::string s;
  for (const std::string& a : attention_args(r)) s += " " + a;
  return s;
}

// What the tool computes for `r`, built here from the same generator.
Tensor expected_attention(const AttentionRun& r) {
  const std::uint64_t seed = r.seed.empty() ? 0 : std::stoull(r.seed);
  const AttentionInputs in = random_attention_inputs(r.s, r.bias == "dense", seed);
  AttentionBias bias = AttentionBias::none();
  if (r.bias == "alibi") bias = AttentionBias::alibi(alibi_slopes(r.s.h));
  if (r.bias == "table" && r.s.j == 0) {
    // No keys: any table fits (2j - 1 < 0); the modules need j >= 1.
    bias = AttentionBias::distance_table(Tensor::empty({r.s.h, 0}, DType::kFloat32));
  } else if (r.bias == "table") {
    bias = AttentionBias::distance_table(
        r.table_from == "t5"
            ? RelativePositionBias(1.0f, r.causal, 32, 128, r.s.h, seed).distance_table(r.s.j)
            : DynamicPositionBias(16, r.s.h, seed).distance_table(r.s.j));
  }
  if (r.bias == "dense") bias = AttentionBias::dense_bias(in.dense);
  const DType dtype = r.dtype.empty() ? DType::kFloat32 : parse_dtype(r.dtype);
  AttentionOptions options;
  options.causal = r.causal;
  return attention_forward(in.q.to(dtype), in.k.to(dtype), in.v.to(dtype), bias, options);
}

TEST(Cli, AttentionJsonIsAttentionForwardOnTheSeededInputs) {
  std::vector<AttentionRun> runs = {
      attention_run(1, 2, 2, 4, 4, 8, "none", false),
      attention_run(2, 4, 2, 3, 9, 16, "alibi", true),  // grouped-query, i < j
      attention_run(1, 4, 1, 1, 40, 8, "table", true),  // decode, multi-query
      attention_run(1, 2, 2, 5, 7, 4, "dense", false),
      attention_run(1, 3, 3, 6, 6, 4, "table", false),
  };
  runs[1].seed = "5";
  runs[2].seed = "18446744073709551615";
  runs[4].table_from = "t5";
  AttentionRun bf16 = attention_run(1, 2, 1, 3, 5, 8, "alibi", true);
  bf16.dtype = "bfloat16";
  runs.push_back(bf16);
  AttentionRun f16 = attention_run(1, 2, 2, 2, 6, 8, "table", true);
  f16.dtype = "float16";
  f16.table_from = "t5";
  runs.push_back(f16);
  for (const AttentionRun& r : runs) {
    std::vector<std::string> args = attention_args(r);
    args.insert(args.end(), {"--format", "json"});
    const ProcessResult run = run_ok(args);
    const Tensor want = expected_attention(r);
    EXPECT_EQ(run.out, json_line(want)) << describe(args, run);
    json_tensor(run.out, {r.s.b, r.s.h, r.s.i, r.s.d});
  }
  // Other seeds give other inputs.
  AttentionRun seeded = attention_run(1, 2, 2, 3, 3, 4, "none", false);
  std::vector<std::string> args = attention_args(seeded);
  args.insert(args.end(), {"--format", "json"});
  const std::string seed0 = run_ok(args).out;
  args.insert(args.end(), {"--seed", "1"});
  EXPECT_NE(run_ok(args).out, seed0);
}

TEST(Cli, AttentionTextLooksLikePrintInPyTorch) {
  const AttentionRun r = attention_run(1, 2, 2, 3, 4, 4, "alibi", true);
  std::vector<std::string> args = attention_args(r);
  args.insert(args.end(), {"--format", "text"});
  EXPECT_EQ(run_ok(args).out, format_tensor(expected_attention(r)) + "\n");
}

TEST(Cli, AttentionSummary) {
  AttentionRun r = attention_run(2, 4, 2, 3, 8, 8, "alibi", true);
  r.seed = "5";
  const ProcessResult run = run_ok(attention_args(r));
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 4u) << run.out;
  EXPECT_EQ(lines[0], "attention_forward: out [2, 4, 3, 8] float32");
  EXPECT_EQ(lines[1], "inputs: b 2, h 4, hk 2, i 3, j 8, d 8; causal; bias alibi; scale " +
                          format_float_roundtrip(1.0f / std::sqrt(8.0f)) + "; seed 5");
  double sum = 0.0;
  double max_abs = 0.0;
  for (float x : expected_attention(r).to_float_vector()) {
    sum += x;
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
  }
  char checksum[128];
  std::snprintf(checksum, sizeof checksum, "checksum: sum %.9g, max |x| %.9g", sum, max_abs);
  EXPECT_EQ(lines[2], checksum);
  EXPECT_EQ(lines[3].rfind("time: ", 0), 0u) << lines[3];
  EXPECT_EQ(lines[3].substr(lines[3].size() - 3), " ms") << lines[3];
  EXPECT_GE(std::stod(lines[3].substr(6)), 0.0) << lines[3];
  // With --check, one more line.
  std::vector<std::string> args = attention_args(r);
  args.push_back("--check");
  const std::vector<std::string> checked = lines_of(run_ok(args).out);
  ASSERT_EQ(checked.size(), 5u);
  EXPECT_EQ(checked[4].rfind("check: ok, max |fused - reference| ", 0), 0u) << checked[4];
  EXPECT_NE(checked[4].find("tolerance 1e-05 + 0.0001 |reference|"), std::string::npos)
      << checked[4];
}

TEST(Cli, AttentionCheckPassesForEveryBiasKind) {
  struct Size {
    const char* name;
    std::int64_t b, h, hk, i, j, d;
  };
  const Size sizes[] = {
      {"i = j", 1, 2, 2, 65, 65, 64},
      {"grouped-query", 2, 6, 2, 17, 17, 8},
      {"decode i = 1", 1, 4, 2, 1, 300, 32},
      {"chunk i < j", 1, 3, 1, 20, 90, 80},
  };
  for (const Size& size : sizes) {
    for (const char* bias : {"none", "alibi", "table", "t5", "dense"}) {
      for (const bool causal : {false, true}) {
        AttentionRun r = attention_run(size.b, size.h, size.hk, size.i, size.j, size.d,
                                       std::string(bias) == "t5" ? "table" : bias, causal);
        if (std::string(bias) == "t5") r.table_from = "t5";
        std::vector<std::string> args = attention_args(r);
        args.push_back("--check");
        const ProcessResult run = run_ok(args);
        const std::vector<std::string> lines = lines_of(run.out);
        ASSERT_FALSE(lines.empty()) << describe(args, run);
        EXPECT_EQ(lines.back().rfind("check: ok, ", 0), 0u)
            << size.name << ": " << describe(args, run);
      }
    }
  }
  // 16-bit inputs, and --check with a tensor format (silent when it passes).
  for (const char* dtype : {"bfloat16", "float16"}) {
    AttentionRun r = attention_run(1, 4, 2, 5, 33, 16, "alibi", true);
    r.dtype = dtype;
    std::vector<std::string> args = attention_args(r);
    args.push_back("--check");
    EXPECT_EQ(lines_of(run_ok(args).out).back().rfind("check: ok, ", 0), 0u) << dtype;
    args.insert(args.end(), {"--format", "json"});
    EXPECT_EQ(run_ok(args).out, json_line(expected_attention(r))) << dtype;
  }
}

TEST(Cli, AttentionEmptyAndKeylessShapes) {
  // No keys: every row outputs zeros; no heads or no queries: an empty output.
  for (const AttentionRun& r : {attention_run(1, 2, 2, 3, 0, 4, "alibi", false),
                                attention_run(1, 2, 2, 3, 0, 4, "table", true),
                                attention_run(1, 2, 2, 0, 5, 4, "dense", true),
                                attention_run(0, 2, 2, 3, 5, 4, "none", false),
                                attention_run(1, 2, 2, 4, 2, 4, "alibi", true)}) {
    std::vector<std::string> args = attention_args(r);
    args.insert(args.end(), {"--format", "json"});
    EXPECT_EQ(run_ok(args).out, json_line(expected_attention(r))) << describe_run(r);
  }
}

TEST(Cli, AttentionGivenInputs) {
  const AttentionInputs in = random_attention_inputs(
      [] {
        AttentionShape s;
        s.b = 1;
        s.h = 4;
        s.hk = 2;
        s.i = 3;
        s.j = 6;
        s.d = 8;
        return s;
      }(),
      true, 77);
  TempFile file;
  save_safetensors(file.path(), {{"q", in.q}, {"k", in.k}, {"v", in.v}, {"bias", in.dense}});
  AttentionOptions causal;
  causal.causal = true;
  EXPECT_EQ(run_ok({"attention", "--inputs", file.path(), "--bias", "alibi", "--causal", "--format",
                    "json"})
                .out,
            json_line(attention_forward(in.q, in.k, in.v, AttentionBias::alibi(alibi_slopes(4)),
                                        causal)));
  EXPECT_EQ(
      run_ok({"attention", "--inputs", file.path(), "--bias", "dense", "--format", "json"}).out,
      json_line(attention_forward(in.q, in.k, in.v, AttentionBias::dense_bias(in.dense))));
  EXPECT_EQ(run_ok({"attention", "--inputs", file.path(), "--bias", "table", "--seed", "3",
                    "--dtype", "bf16", "--format", "json"})
                .out,
            json_line(attention_forward(
                in.q.to(DType::kBFloat16), in.k.to(DType::kBFloat16), in.v.to(DType::kBFloat16),
                AttentionBias::distance_table(DynamicPositionBias(16, 4, 3).distance_table(6)))));
  const std::vector<std::string> summary =
      lines_of(run_ok({"attention", "--inputs", file.path(), "--check"}).out);
  ASSERT_EQ(summary.size(), 5u);
  EXPECT_EQ(summary[1], "inputs: b 1, h 4, hk 2, i 3, j 6, d 8; not causal; bias none; scale " +
                            format_float_roundtrip(1.0f / std::sqrt(8.0f)) + "; from " +
                            file.path());
  EXPECT_EQ(summary[4].rfind("check: ok, ", 0), 0u) << summary[4];

  // A file without v, with a 3-d q, or none at all.
  TempFile no_v;
  save_safetensors(no_v.path(), {{"q", in.q}, {"k", in.k}});
  expect_bad_argument({"attention", "--inputs", no_v.path()},
                      "--inputs: '" + no_v.path() + "' has no tensor 'v'");
  expect_bad_argument({"attention", "--inputs", file.path(), "--bias", "dense", "--heads", "4"},
                      "excludes");
  TempFile flat;
  save_safetensors(flat.path(), {{"q", in.q.slice(0, 0, 1).contiguous_copy()},
                                 {"k", Tensor::full({2, 6, 8}, 0.0f)},
                                 {"v", Tensor::full({2, 6, 8}, 0.0f)}});
  expect_bad_argument({"attention", "--inputs", flat.path()},
                      "got q [1, 4, 3, 8], k [2, 6, 8], v [2, 6, 8]");
  // Errors of given inputs name their shapes too, also a non-finite slope.
  expect_bad_argument(
      {"attention", "--inputs", file.path(), "--bias", "alibi", "--slopes", "0.5,0.25,inf,1"},
      "attention_forward: ALiBi slope 2 is not finite (inf) (q [1, 4, 3, 8], k [1, 2, 6, 8], v [1, 2, "
      "6, 8])");
  expect_bad_argument({"attention", "--inputs", "/nonexistent/qkv.safetensors"},
                      "--inputs: cannot open safetensors file '/nonexistent/qkv.safetensors'");
}

// Every tensor alone fits in memory (the library accepts each), but q, k, v
// and the output together do not: the tool refuses before drawing anything,
// rather than being killed by the OOM killer half-way through the inputs.
TEST(Cli, AttentionRefusesTensorsThatTogetherExceedMemory) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  ASSERT_GT(pages, 0);
  ASSERT_GT(page_size, 0);
  const double memory = static_cast<double>(pages) * static_cast<double>(page_size);
  // h = 1, d = 1, i = j = n: q, k, v and out are 4 n bytes each, a third of
  // the memory, so four of them need 4/3 of it.
  const auto n = static_cast<std::int64_t>(memory / 12.0);
  const std::string length = std::to_string(n);
  expect_bad_argument({"attention", "--heads", "1", "-i", length, "-j", length, "-d", "1"},
                      "bytes, more than this machine's");
}

// ------------------------------------------------------------ check-golden

TEST(Cli, CheckGoldenProjectCopyPasses) {
  const std::string golden = std::string(POSBIAS_GOLDEN_COPY_DIR) + "/golden.json";
  const ProcessResult run = run_ok({"check-golden", golden});
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), POSBIAS_GOLDEN_SUMMARY);
  EXPECT_EQ(run.out.find("FAIL"), std::string::npos) << run.out;
}

TEST(Cli, CheckGoldenReportsEveryKindOfBrokenCase) {
  const std::string golden = std::string(POSBIAS_CLI_TEST_DATA) + "/golden_corrupted.json";
  const ProcessResult run = run_posbias({"check-golden", golden});
  EXPECT_EQ(run.exit_code, 1) << describe({"check-golden", golden}, run);
  EXPECT_EQ(run.err, "");
  const std::vector<std::string> expected = {
      "FAIL case 1 (alibi_slopes): element [1] (flat 1): got 0.0625, expected 0.07",
      "FAIL case 2 (alibi_positional_bias): call 1 (i = 1, j = 4): shape [1, 1, 4], "
      "expected [1, 1, 5]",
      "FAIL case 3 (alibi_bias): element [0, 0, 1, 0] (flat 3): got -0.2, expected -0.3",
      "skip case 4: unknown kind 'rope_frequencies'",
      "FAIL case 5 (attention): attention_forward: element [0, 0, 0, 1] (flat 1): got 2, "
      "expected 2.5; attention_reference: element [0, 0, 0, 1] (flat 1): got 2, expected 2.5",
      "FAIL case 6 (alibi_slopes): malformed case: missing field 'heads'",
      "FAIL case 7 (ggml_slopes): malformed case: field 'heads' must be an integer, got "
      "string \"8\"",
      "FAIL case 9 (alibi_positional_bias): malformed case: call 0: field 'shape' [1, 2, 2] "
      "holds 4 elements but 'data' has 3",
      "FAIL case 10 (alibi_slopes): posbias refused the case: heads must be >= 1, got 0",
      "FAIL case 11 (no kind): malformed case: a case must be an object, got number 42",
      "FAIL case 12 (no kind): malformed case: missing field 'kind'",
      "FAIL case 14 (dynamic_position_bias): call 0 (i = 2, j = 3): element [0, 1, 1] (flat 4): "
      "got 0.493492, expected 0.5",
      "FAIL case 15 (dynamic_position_bias): grad (i = 1, j = 2) of 'mlp.2.bias': element [0] "
      "(flat 0): got 1.3354039, expected 1.3",
      "FAIL case 16 (dynamic_position_bias): call 0 (i = 1, j = 3): element [0, 0, 1] (flat 1): "
      "got 0.7310586, expected 0.75",
      "FAIL case 18 (t5_bucket): rel 3 (index 1): got bucket 0, expected 3",
      "FAIL case 19 (dynamic_position_bias_file): error: cannot open safetensors file '" +
          std::string(POSBIAS_CLI_TEST_DATA) + "/missing.safetensors': No such file or directory",
      "FAIL case 20 (dynamic_position_bias): malformed case: layers[0]: expected a 'linear' "
      "layer, got 'silu'",
      "FAIL case 23 (attention): malformed case: field 'bias': field 'type' must be \"none\", "
      "\"alibi\" or \"distance_table\", got \"rope\"",
      "FAIL case 24 (attention): malformed case: field 'q' must have 4 dimensions [b, h, i, d], "
      "got shape [1, 1, 2]",
      "FAIL case 25 (attention): posbias refused the case: attention_forward: the distance table "
      "must be float32 [h, >= 2j - 1] = [1, >= 3], got float32 table [1, 2] (q [1, 1, 1, 2], "
      "k [1, 1, 2, 2], v [1, 1, 2, 2])",
      "6 passed, 19 failed, 1 skipped",
  };
  EXPECT_EQ(lines_of(run.out), expected) << run.out;
}

TEST(Cli, CheckGoldenBadFilesExitTwo) {
  TempFile not_json;
  { std::ofstream(not_json.path()) << "{\"cases\": [1, 2"; }
  TempFile no_cases;
  { std::ofstream(no_cases.path()) << "{\"format\": \"v1\"}"; }
  for (const std::string& path :
       {std::string("/nonexistent/golden.json"), not_json.path(), no_cases.path(),
        std::filesystem::temp_directory_path().string()}) {
    const ProcessResult run = run_posbias({"check-golden", path});
    EXPECT_EQ(run.exit_code, 2) << describe({"check-golden", path}, run);
    EXPECT_EQ(run.out, "");
    const std::vector<std::string> lines = lines_of(run.err);
    ASSERT_EQ(lines.size(), 1u) << run.err;
    EXPECT_EQ(lines[0].rfind("posbias: error: ", 0), 0u) << run.err;
    EXPECT_NE(lines[0].find(path), std::string::npos) << run.err;
  }
}

// ------------------------------------------------------------------- bench

TEST(Cli, BenchQuickJsonIsOneObjectPerCase) {
  const ProcessResult run =
      run_ok({"bench", "alibi", "--quick", "--json", "--repetitions", "1", "--warmup", "0"});
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    const json doc = json::parse(line);
    EXPECT_TRUE(doc.at("case").is_string()) << line;
    EXPECT_TRUE(doc.at("median_ms").is_number()) << line;
    EXPECT_TRUE(doc.at("baselines").is_object()) << line;
  }
}

// The dashboard interface of each suite (--quick sizes): every case the
// issues name, each with its same-run baselines and figures, all positive
// and finite (a baseline that silently failed would print 0 or nothing).
struct BenchSuiteCases {
  std::string suite;
  // case name -> the baselines and the extra fields it must carry
  std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases;
};

TEST(Cli, BenchQuickSuitesPrintEveryCaseWithItsBaselines) {
  const std::vector<BenchSuiteCases> suites = {
      {"alibi",
       {{"alibi_h16_n1024_f32", {"fill", "fill_store"}, {"bytes", "gbps", "fraction_of_fill"}},
        {"alibi_h16_n1024_bf16", {"fill"}, {"bytes"}},
        {"alibi_h16_n1024_f16", {"fill"}, {"bytes"}},
        {"alibi_forward_h16_n1024_f32", {"alloc_fill"}, {"fraction_of_alloc_fill"}},
        {"alibi_cache_hit_h16_n1024", {"cache_hit_n256"}, {"ratio_to_small"}}}},
      {"dpb",
       {{"dpb_forward_d64_h8_n1024", {"fill"}, {"fraction_of_fill"}},
        {"dpb_table_d64_h8_n1024", {"naive"}, {"speedup_vs_naive"}},
        {"dpb_backward_d64_h8_n512", {"read"}, {"fraction_of_read"}}}},
      {"attention",
       {{"attention_alibi_causal_h16_n512_d64", {"no_bias"}, {"alibi_cost_over_no_bias"}},
        {"attention_none_causal_h16_n512_d64", {"alibi"}, {"gflops"}},
        {"attention_table_causal_h16_n512_d64", {"no_bias"}, {"table_cost_over_no_bias"}},
        {"attention_alibi_noncausal_h16_n512_d64", {"sgemm_gflops"}, {"gflops"}},
        {"decode_alibi_h32_n4096_d128", {"read_gbps"}, {"gbps"}},
        {"memory_h16_n2048_d64", {}, {"peak_bytes", "io_bytes"}}}},
  };
  for (const BenchSuiteCases& suite : suites) {
    const ProcessResult run =
        run_ok({"bench", suite.suite, "--quick", "--json", "--repetitions", "1", "--warmup", "0"});
    std::map<std::string, json> by_case;
    for (const std::string& line : lines_of(run.out)) {
      const json doc = json::parse(line);
      by_case[doc.at("case").get<std::string>()] = doc;
    }
    for (const auto& [name, baselines, extra] : suite.cases) {
      SCOPED_TRACE(suite.suite + " " + name);
      ASSERT_EQ(by_case.count(name), 1u) << run.out;
      const json& doc = by_case[name];
      const auto positive = [](const json& v) {
        return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0.0;
      };
      if (name.rfind("memory_", 0) != 0) {
        EXPECT_TRUE(positive(doc.at("median_ms"))) << doc;
      }
      for (const std::string& b : baselines) {
        EXPECT_TRUE(doc.at("baselines").contains(b) && positive(doc["baselines"][b])) << b << doc;
      }
      for (const std::string& e : extra) {
        ASSERT_TRUE(doc.contains(e)) << e << doc;
        if (e.find("_cost_over_") != std::string::npos) {  // a difference: any sign
          EXPECT_TRUE(doc[e].is_number() && std::isfinite(doc[e].get<double>())) << e << doc;
        } else {
          EXPECT_TRUE(positive(doc[e])) << e << doc;
        }
      }
    }
  }
}

// ----------------------------------------------------------- bad arguments

struct BadArgs {
  std::string name;  // the test's name
  std::vector<std::string> args;
  std::string message_part;  // must appear in the error line
};

class BadArgument : public testing::TestWithParam<BadArgs> {};

TEST_P(BadArgument, ExitsTwoWithOneErrorLine) {
  const BadArgs& bad = GetParam();
  const ProcessResult run = run_posbias(bad.args);
  EXPECT_EQ(run.exit_code, 2) << describe(bad.args, run);
  EXPECT_EQ(run.out, "") << describe(bad.args, run);
  const std::vector<std::string> lines = lines_of(run.err);
  ASSERT_EQ(lines.size(), 1u) << describe(bad.args, run);
  EXPECT_EQ(lines[0].rfind("posbias: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(bad.message_part), std::string::npos)
      << "expected '" << bad.message_part << "' in: " << lines[0];
}

INSTANTIATE_TEST_SUITE_P(
    Cli, BadArgument,
    testing::Values(
        BadArgs{"NoCommand", {}, "no command given"},
        BadArgs{"UnknownCommand", {"frobnicate"}, "unknown command 'frobnicate'"},
        BadArgs{"UnknownTopLevelOption", {"--nope"}, "--nope"},
        BadArgs{"DemoTakesNoArguments", {"demo", "extra"}, "extra"},
        BadArgs{"SlopesWithoutHeads", {"slopes"}, "--heads is required"},
        BadArgs{"SlopesZeroHeads", {"slopes", "--heads", "0"}, "heads must be >= 1, got 0"},
        BadArgs{"SlopesHeadsNotANumber", {"slopes", "--heads", "abc"}, "abc"},
        BadArgs{"SlopesHeadsNotAnInteger", {"slopes", "--heads", "2.5"}, "2.5"},
        BadArgs{"SlopesHeadsWithoutValue", {"slopes", "--heads"}, "--heads"},
        BadArgs{"SlopesMaxBiasNan",
                {"slopes", "--heads", "8", "--max-bias", "nan"},
                "max_bias must be finite"},
        BadArgs{
            "SlopesMaxBiasOverflow", {"slopes", "--heads", "8", "--max-bias", "1e999"}, "max_bias"},
        BadArgs{"SlopesRangePastTheHeads", {"slopes", "--heads", "8", "--range", "4:9"}, "[4, 9)"},
        BadArgs{"SlopesRangeNotARange",
                {"slopes", "--heads", "8", "--range", "4"},
                "--range must be H0:H1"},
        BadArgs{"SlopesUnknownFormat", {"slopes", "--heads", "8", "--format", "xml"}, "xml"},
        BadArgs{"AlibiWithoutHeads", {"alibi", "-i", "1", "-j", "1"}, "--heads is required"},
        BadArgs{"AlibiWithoutJ", {"alibi", "--heads", "2", "-i", "1"}, "-j is required"},
        BadArgs{"AlibiZeroHeads",
                {"alibi", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"AlibiTotalHeadsBelowHeads",
                {"alibi", "--heads", "4", "--total-heads", "2", "-i", "1", "-j", "1"},
                "total_heads = 2, heads = 4"},
        BadArgs{"AlibiNegativeI", {"alibi", "--heads", "4", "-i", "-1", "-j", "2"}, "i = -1"},
        BadArgs{"AlibiNegativeJ", {"alibi", "--heads", "4", "-i", "2", "-j", "-3"}, "j = -3"},
        BadArgs{"AlibiTooLarge",
                {"alibi", "--heads", "16", "-i", "100000000", "-j", "100000000"},
                "[16, 100000000, 100000000]"},
        BadArgs{"AlibiHeadsOverflowInt64",
                {"alibi", "--heads", "99999999999999999999", "-i", "1", "-j", "1"},
                "does not fit in a 64-bit integer"},
        BadArgs{"AlibiUnknownDtype",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--dtype", "float64"},
                "float64"},
        BadArgs{"AlibiTooFewSlopes",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--slopes", "0.5"},
                "got 1"},
        BadArgs{"AlibiInfiniteSlope",
                {"alibi", "--heads", "1", "-i", "1", "-j", "1", "--slopes", "inf"},
                "not finite"},
        BadArgs{"AlibiSlopeNotANumber",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--slopes", "0.5,x"},
                "--slopes"},
        BadArgs{"AlibiUnknownOption",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--bogus"},
                "--bogus"},
        BadArgs{"AlibiBiasZeroHeads",
                {"alibi-bias", "--heads", "0", "-i", "3", "-j", "3"},
                "n_heads must be >= 1"},
        BadArgs{"AlibiBiasTooFewSlopes",
                {"alibi-bias", "--heads", "2", "--slopes", "-0.2", "-i", "3", "-j", "3"},
                "got 1"},
        BadArgs{
            "AlibiBiasNegativeLength", {"alibi-bias", "--heads", "2", "-i", "-3", "-j", "3"}, "-3"},
        BadArgs{
            "DpbWithoutDim", {"dpb", "--heads", "2", "-i", "1", "-j", "1"}, "--dim is required"},
        BadArgs{"DpbZeroDim",
                {"dpb", "--dim", "0", "--heads", "2", "-i", "1", "-j", "1"},
                "dim must be >= 1, got 0"},
        BadArgs{"DpbZeroHeads",
                {"dpb", "--dim", "4", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"DpbZeroDepth",
                {"dpb", "--dim", "4", "--heads", "2", "--variant", "x-transformers", "--depth", "0",
                 "-i", "1", "-j", "1"},
                "depth must be >= 1, got 0"},
        BadArgs{"DpbDepthOfZeta",
                {"dpb", "--dim", "4", "--heads", "2", "--depth", "3", "-i", "1", "-j", "1"},
                "--depth, --log-distance and --norm are options of --variant x-transformers"},
        BadArgs{"DpbNormOfZeta",
                {"dpb", "--dim", "4", "--heads", "2", "--norm", "-i", "1", "-j", "1"},
                "got --depth 2 --norm"},
        BadArgs{
            "DpbUnknownVariant",
            {"dpb", "--dim", "4", "--heads", "2", "--variant", "lucidrains", "-i", "1", "-j", "1"},
            "lucidrains"},
        BadArgs{"DpbIAboveJ",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "6", "-j", "5"},
                "need 0 <= i <= j (i and j are lengths), got i = 6, j = 5"},
        BadArgs{"DpbNegativeI",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "-1", "-j", "5"},
                "got i = -1, j = 5"},
        BadArgs{"DpbNegativeJ",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "0", "-j", "-2"},
                "got i = 0, j = -2"},
        BadArgs{"DpbWithoutLengths",
                {"dpb", "--dim", "4", "--heads", "2"},
                "-i is required (or --table with -j, or --save FILE)"},
        BadArgs{"DpbWithoutJ", {"dpb", "--dim", "4", "--heads", "2", "-i", "3"}, "-j is required"},
        BadArgs{"DpbTableWithI",
                {"dpb", "--dim", "4", "--heads", "2", "--table", "-i", "1", "-j", "3"},
                "-i is not used with --table"},
        BadArgs{"DpbTableZeroJ",
                {"dpb", "--dim", "4", "--heads", "2", "--table", "-j", "0"},
                "j must be >= 1, got 0"},
        BadArgs{"DpbTooLarge",
                {"dpb", "--dim", "4", "--heads", "16", "-i", "100000000", "-j", "100000000"},
                "[16, 100000000, 100000000]"},
        BadArgs{"DpbSeedAndWeights",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", "1",
                 "--weights", "w.safetensors"},
                "--seed excludes --weights"},
        BadArgs{"DpbNegativeSeed",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", "-1"},
                "--seed must be an integer in [0, 18446744073709551615], got '-1'"},
        BadArgs{"DpbSeedOverflow",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed",
                 "18446744073709551616"},
                "got '18446744073709551616'"},
        BadArgs{"DpbUnknownDtype",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--dtype", "int8"},
                "int8"},
        BadArgs{"T5WithoutHeads", {"t5", "-i", "1", "-j", "1"}, "--heads is required"},
        BadArgs{"T5ZeroHeads",
                {"t5", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"T5NegativeI", {"t5", "--heads", "2", "-i", "-1", "-j", "1"}, "i = -1"},
        BadArgs{"T5BucketsNegativeJ",
                {"t5", "-i", "1", "-j", "-4", "--buckets"},
                "i and j must be >= 0, got i = 1, j = -4"},
        BadArgs{"T5TooFewBuckets",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--num-buckets", "2"},
                "num_buckets"},
        BadArgs{"T5BucketsTooFewBuckets",
                {"t5", "-i", "1", "-j", "1", "--num-buckets", "2", "--buckets"},
                "num_buckets"},
        BadArgs{"T5MaxDistanceTooSmall",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--max-distance", "8"},
                "max_distance"},
        BadArgs{
            "T5NanScale", {"t5", "--heads", "2", "-i", "1", "-j", "1", "--scale", "nan"}, "scale"},
        BadArgs{
            "T5TableZeroJ", {"t5", "--heads", "2", "-j", "0", "--table"}, "j must be >= 1, got 0"},
        BadArgs{"T5BucketsJsonPastMemory",
                {"t5", "-i", "100000000", "-j", "100000000", "--buckets", "--format", "json"},
                "--buckets --format json: the bucket grid [100000000, 100000000] (int64) needs "
                "80000000000000000 bytes, more than this machine's"},
        BadArgs{"T5BucketsJsonOverflow",
                {"t5", "-i", "4000000000", "-j", "4000000000", "--buckets", "--format", "json"},
                "the bucket grid [4000000000, 4000000000] (int64) is too large: its size in bytes "
                "overflows int64"},
        BadArgs{"T5TableWithI",
                {"t5", "--heads", "2", "--table", "-i", "1", "-j", "3"},
                "-i is not used with --table (the table depends on j)"},
        BadArgs{
            "T5WithoutI", {"t5", "--heads", "2", "-j", "3"}, "-i is required (or --table with -j)"},
        BadArgs{"T5BucketsWithoutI", {"t5", "-j", "3", "--buckets"}, "-i is required"},
        BadArgs{"T5BucketsAndTable",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--table", "--buckets"},
                "excludes"},
        BadArgs{"T5BucketWithoutRel", {"t5-bucket"}, "--rel is required"},
        BadArgs{"T5BucketRelNotANumber", {"t5-bucket", "--rel", "1,x"}, "--rel"},
        BadArgs{"T5BucketTooFewBuckets",
                {"t5-bucket", "--rel", "1", "--num-buckets", "3"},
                "num_buckets"},
        BadArgs{"AttentionWithoutHeads",
                {"attention", "-i", "1", "-j", "1", "-d", "4"},
                "--heads is required (or --inputs)"},
        BadArgs{"AttentionWithoutD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1"},
                "-d is required"},
        BadArgs{"AttentionHeadsNotAMultipleOfKvHeads",
                {"attention", "--batch", "2", "--heads", "6", "--kv-heads", "4", "-i", "3", "-j",
                 "5", "-d", "8"},
                "the query heads h = 6 must be a multiple of the key/value heads hk = 4 (q [2, 6, "
                "3, 8], k [2, 4, 5, 8], v [2, 4, 5, 8])"},
        BadArgs{"AttentionZeroD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "0"},
                "d must be >= 1, got 0"},
        BadArgs{"AttentionNegativeI",
                {"attention", "--heads", "2", "-i", "-1", "-j", "1", "-d", "4"},
                "-i must be >= 0, got -1"},
        BadArgs{"AttentionNegativeJ",
                {"attention", "--heads", "2", "-i", "1", "-j", "-5", "-d", "4"},
                "-j must be >= 0, got -5"},
        BadArgs{"AttentionNegativeBatch",
                {"attention", "--batch", "-1", "--heads", "2", "-i", "1", "-j", "1", "-d", "4"},
                "--batch must be >= 0, got -1"},
        BadArgs{"AttentionUnknownBias",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--bias", "rope"},
                "rope"},
        BadArgs{"AttentionNanScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", "nan"},
                "scale must be finite"},
        BadArgs{"AttentionInfiniteScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", "inf"},
                "scale must be finite"},
        BadArgs{"AttentionTableIAboveJ",
                {"attention", "--heads", "2", "-i", "5", "-j", "3", "-d", "4", "--bias", "table"},
                "non-causal attention needs i <= j, got i = 5, j = 3"},
        BadArgs{"AttentionTooLarge",
                {"attention", "--heads", "64", "-i", "1000000", "-j", "1000000", "-d", "1000000"},
                "[1, 64, 1000000, 1000000]"},
        BadArgs{"AttentionDenseTooLarge",
                {"attention", "--heads", "64", "-i", "1000000", "-j", "1000000", "-d", "1",
                 "--bias", "dense"},
                "[1, 64, 1000000, 1000000]"},
        BadArgs{"AttentionWrongSlopeCount",
                {"attention", "--heads", "4", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", "0.5,0.25"},
                "got 2 slopes for h = 4"},
        BadArgs{"AttentionInfiniteSlope",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", "inf"},
                "finite"},
        BadArgs{"AttentionNanSlopeNamesTheShapes",
                {"attention", "--heads", "2", "-i", "1", "-j", "3", "-d", "4", "--bias", "alibi",
                 "--slopes", "0.5,nan"},
                "attention_forward: ALiBi slope 1 is not finite (nan) (q [1, 2, 1, 4], k [1, 2, 3, 4], "
                "v [1, 2, 3, 4])"},
        BadArgs{"AttentionSlopesWithoutAlibi",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--slopes", "0.5"},
                "--slopes is an option of --bias alibi"},
        BadArgs{
            "AttentionTableFromWithoutTable",
            {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--table-from", "t5"},
            "--table-from is an option of --bias table"},
        BadArgs{"AttentionUnknownTableFrom",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "table",
                 "--table-from", "rope"},
                "rope"},
        BadArgs{"AttentionUnknownDtype",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--dtype", "int8"},
                "int8"},
        BadArgs{"AttentionUnknownFormat",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--format", "xml"},
                "xml"},
        BadArgs{"AttentionNegativeSeed",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--seed", "-3"},
                "--seed must be an integer"},
        BadArgs{"AttentionZeroHeadsAlibi",
                {"attention", "--heads", "0", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi"},
                "heads must be >= 1, got 0"},
        BadArgs{"CheckGoldenWithoutFile", {"check-golden"}, "file is required"},
        BadArgs{"CheckGoldenTwoFiles", {"check-golden", "a.json", "b.json"}, "b.json"},
        BadArgs{"BenchWithoutSuite", {"bench"}, "suite is required"},
        BadArgs{"BenchUnknownSuite", {"bench", "no-such-suite", "--quick"}, "no-such-suite"},
        BadArgs{"BenchZeroRepetitions",
                {"bench", "alibi", "--repetitions", "0"},
                "--repetitions must be >= 1, got 0"},
        BadArgs{"BenchNegativeWarmup",
                {"bench", "alibi", "--warmup", "-1"},
                "--warmup must be >= 0, got -1"},
        // An empty value: CLI11 2.1 reads it as 0 or as "not given" unless
        // refused (cli/app.cc, refuse_empty_values); every option kind.
        BadArgs{"SlopesEmptyHeads", {"slopes", "--heads", ""}, "--heads: the value is empty ('')"},
        BadArgs{"SlopesEmptyMaxBias",
                {"slopes", "--heads", "8", "--max-bias", ""},
                "--max-bias: the value is empty ('')"},
        BadArgs{"SlopesEmptyRange",
                {"slopes", "--heads", "8", "--range", ""},
                "--range: the value is empty ('')"},
        BadArgs{"AlibiEmptySlopes",
                {"alibi", "--slopes", "", "-i", "1", "-j", "2"},
                "--slopes: the value is empty ('')"},
        BadArgs{"AlibiEmptyI",
                {"alibi", "--heads", "2", "-i", "", "-j", "2"},
                "-i: the value is empty ('')"},
        BadArgs{"AlibiEmptyJ",
                {"alibi", "--heads", "2", "-i", "1", "-j", ""},
                "-j: the value is empty ('')"},
        BadArgs{"AlibiEmptyTotalHeads",
                {"alibi", "--heads", "2", "--total-heads", "", "-i", "1", "-j", "2"},
                "--total-heads: the value is empty ('')"},
        BadArgs{"AlibiEmptyDtype",
                {"alibi", "--heads", "2", "-i", "1", "-j", "2", "--dtype", ""},
                "--dtype: the value is empty ('')"},
        BadArgs{"AlibiEmptyPlot",
                {"alibi", "--heads", "2", "-i", "1", "-j", "2", "--plot", ""},
                "--plot: the value is empty ('')"},
        // Comma items: CLI11's own delimiter would drop the empty ones.
        BadArgs{"AlibiEmptySlopeItem",
                {"alibi", "--heads", "2", "--slopes", "0.5,,0.25", "-i", "1", "-j", "2"},
                "--slopes: item 2 of '0.5,,0.25' is empty"},
        BadArgs{"AlibiTrailingCommaInSlopes",
                {"alibi", "--slopes", "0.5,", "-i", "1", "-j", "2"},
                "--slopes: item 2 of '0.5,' is empty"},
        BadArgs{"AlibiSlopePastFloat32",
                {"alibi", "--slopes", "1e39", "-i", "1", "-j", "2"},
                "--slopes: '1e39' is past the float32 range"},
        BadArgs{"AlibiBiasEmptySlopes",
                {"alibi-bias", "--heads", "1", "--slopes", "", "-i", "2", "-j", "2"},
                "--slopes: the value is empty ('')"},
        BadArgs{"AlibiBiasEmptyHeads",
                {"alibi-bias", "--heads", "", "-i", "2", "-j", "2"},
                "--heads: the value is empty ('')"},
        BadArgs{"AlibiBiasEmptyQLen",
                {"alibi-bias", "--heads", "1", "-i", "", "-j", "2"},
                "--q-len: the value is empty ('')"},
        BadArgs{"DpbEmptyDim",
                {"dpb", "--dim", "", "--heads", "2", "-i", "1", "-j", "1"},
                "--dim: the value is empty ('')"},
        BadArgs{"DpbEmptyDepth",
                {"dpb", "--dim", "4", "--heads", "2", "--variant", "x-transformers", "--depth", "",
                 "-i", "1", "-j", "1"},
                "--depth: the value is empty ('')"},
        BadArgs{"DpbEmptySeed",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", ""},
                "--seed: the value is empty ('')"},
        BadArgs{"DpbEmptySave",
                {"dpb", "--dim", "4", "--heads", "2", "--save", ""},
                "--save: the value is empty ('')"},
        BadArgs{"T5EmptyHeads",
                {"t5", "--heads", "", "-i", "1", "-j", "1"},
                "--heads: the value is empty ('')"},
        BadArgs{"T5EmptyScale",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--scale", ""},
                "--scale: the value is empty ('')"},
        BadArgs{"T5EmptyNumBuckets",
                {"t5", "-i", "1", "-j", "1", "--buckets", "--num-buckets", ""},
                "--num-buckets: the value is empty ('')"},
        BadArgs{"T5EmptyMaxDistance",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--max-distance", ""},
                "--max-distance: the value is empty ('')"},
        BadArgs{"T5BucketEmptyRel", {"t5-bucket", "--rel", ""}, "--rel: the value is empty ('')"},
        BadArgs{"T5BucketEmptyRelItem",
                {"t5-bucket", "--rel", "1,,2"},
                "--rel: item 2 of '1,,2' is empty"},
        BadArgs{"T5BucketRelPastInt64",
                {"t5-bucket", "--rel", "1,99999999999999999999"},
                "--rel: item 2 of '1,99999999999999999999' ('99999999999999999999') does not fit "
                "in a 64-bit integer"},
        BadArgs{"AttentionEmptyD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", ""},
                "-d: the value is empty ('')"},
        BadArgs{"AttentionEmptyBatch",
                {"attention", "--batch", "", "--heads", "2", "-i", "1", "-j", "1", "-d", "4"},
                "--batch: the value is empty ('')"},
        BadArgs{"AttentionEmptyKvHeads",
                {"attention", "--heads", "2", "--kv-heads", "", "-i", "1", "-j", "1", "-d", "4"},
                "--kv-heads: the value is empty ('')"},
        BadArgs{"AttentionEmptyScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", ""},
                "--scale: the value is empty ('')"},
        BadArgs{"AttentionEmptySlopes",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", ""},
                "--slopes: the value is empty ('')"},
        BadArgs{"AttentionCommaAsSlopes",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", ","},
                "--slopes: item 1 of ',' is empty"},
        BadArgs{"AttentionEmptyInputs",
                {"attention", "--inputs", ""},
                "--inputs: the value is empty ('')"},
        BadArgs{"DemoEmptyLength", {"demo", "--length", ""}, "--length: the value is empty ('')"},
        BadArgs{"DemoEmptyRepetitions",
                {"demo", "--repetitions", ""},
                "--repetitions: the value is empty ('')"},
        BadArgs{"DemoEmptyOut", {"demo", "--out", ""}, "--out: the value is empty ('')"},
        BadArgs{"CheckGoldenEmptyFile", {"check-golden", ""}, "file: the value is empty ('')"},
        BadArgs{"BenchEmptyRepetitions",
                {"bench", "alibi", "--repetitions", ""},
                "--repetitions: the value is empty ('')"},
        BadArgs{"BenchEmptyWarmup",
                {"bench", "alibi", "--warmup", ""},
                "--warmup: the value is empty ('')"}),
    [](const testing::TestParamInfo<BadArgs>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace posbias::cli
