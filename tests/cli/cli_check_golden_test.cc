// `posbias check-golden` as a process: the project's golden file passes, a
// broken one is reported case by case, unreadable files exit 2.
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

// ------------------------------------------------------------ check-golden

TEST(Cli, CheckGoldenProjectCopyPasses) {
  const std::string golden = std::string(POSBIAS_GOLDEN_COPY_DIR) + "/golden.json";
  const ProcessResult run = run_ok({"check-golden", golden});
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), POSBIAS_GOLDEN_SUMMARY);
  EXPECT_EQ(run.out.find("FAIL"), std::string::npos) << run.out;
}

// serving.json: every attention_masked, attention_varlen and attention_paged
// case passes, nothing is skipped; its dynamic_position_bias_file case names
// dpb_hidden.safetensors, which is not beside it, so that case fails (exit 1).
TEST(Cli, CheckGoldenServingCopy) {
  const std::string golden = std::string(POSBIAS_GOLDEN_COPY_DIR) + "/serving.json";
  const ProcessResult run = run_posbias({"check-golden", golden});
  EXPECT_EQ(run.exit_code, 1) << describe({"check-golden", golden}, run);
  EXPECT_EQ(lines_of(run.out),
            (std::vector<std::string>{
                "FAIL case 9 (dynamic_position_bias_file): error: cannot open safetensors file \"" +
                    std::string(POSBIAS_GOLDEN_COPY_DIR) +
                    "/dpb_hidden.safetensors\": No such file or directory",
                "9 passed, 1 failed, 0 skipped"}))
      << run.out;
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
      "skip case 4: unknown kind \"rope_frequencies\"",
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
      "FAIL case 19 (dynamic_position_bias_file): error: cannot open safetensors file \"" +
          std::string(POSBIAS_CLI_TEST_DATA) + "/missing.safetensors\": No such file or directory",
      "FAIL case 20 (dynamic_position_bias): malformed case: layers[0]: expected a 'linear' "
      "layer, got \"silu\"",
      "FAIL case 23 (attention): malformed case: field 'bias': field 'type' must be \"none\", "
      "\"alibi\" or \"distance_table\", got \"rope\"",
      "FAIL case 24 (attention): malformed case: field 'q' must have 4 dimensions [b, h, i, d], "
      "got shape [1, 1, 2]",
      "FAIL case 25 (attention): posbias refused the case: attention_forward: the distance table "
      "must be float32 [h, n] with h = 1 and n odd (read at its centre (n - 1) / 2), got "
      "float32 table [1, 2] (q [1, 1, 1, 2], k [1, 1, 2, 2], v [1, 1, 2, 2])",
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

}  // namespace
}  // namespace posbias::cli
