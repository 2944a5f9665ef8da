// `posbias demo` as a process: it states every example of the seed
// documents, and every check it makes holds.
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

}  // namespace
}  // namespace posbias::cli
