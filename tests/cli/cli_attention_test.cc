// `posbias attention` as a process: its output against attention_forward on
// the same seeded inputs, --check, given inputs, and its limits.
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

#include "attention_inputs.h"
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
    // No keys: the tool passes [h, 1] of zeros (n odd; nothing reads it);
    // the modules need j >= 1.
    bias = AttentionBias::distance_table(Tensor::full({r.s.h, 1}, 0.0f));
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
                      "--inputs: \"" + no_v.path() + "\" has no tensor 'v'");
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
      "attention_forward: ALiBi slope 2 is not finite (inf) (q [1, 4, 3, 8], k [1, 2, 6, 8], v [1, "
      "2, "
      "6, 8])");
  expect_bad_argument({"attention", "--inputs", "/nonexistent/qkv.safetensors"},
                      "--inputs: cannot open safetensors file \"/nonexistent/qkv.safetensors\"");
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

}  // namespace
}  // namespace posbias::cli
