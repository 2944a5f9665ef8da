// `posbias slopes`, `posbias alibi` and `posbias alibi-bias` as a process:
// their output against the library.
#include <gtest/gtest.h>

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

#include "cli_process.h"
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

}  // namespace
}  // namespace posbias::cli
