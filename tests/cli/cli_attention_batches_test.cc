// `posbias attention` with the options of issue 16 and on serving and
// training batches, as a process: its JSON output against the library's call
// on the same seeded inputs (NormalGenerator: q, k, v in order), and --check
// (fused against the plain path) for every form, including the paged cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "cli_process.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

Tensor int32_tensor(const std::vector<std::int64_t>& shape, const std::vector<std::int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  for (std::size_t x = 0; x < v.size(); ++x) t.mutable_data<std::int32_t>()[x] = v[x];
  return t;
}

Tensor drawn(const std::vector<std::int64_t>& shape, NormalGenerator& gen) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  gen.fill(t);
  return t;
}

// The last line of a summary that has a --check line.
std::string check_line(const std::vector<std::string>& args) {
  const std::vector<std::string> lines = lines_of(run_ok(args).out);
  return lines.empty() ? "" : lines.back();
}

TEST(Cli, AttentionOptionsAreTheLibrarysOnTheSeededInputs) {
  // b 2, h 4, hk 2, i 5, j 7, d 8: q_offset, window, softcap, a left-padded
  // key mask and per-sequence slopes at once.
  AttentionShape s;
  s.b = 2;
  s.h = 4;
  s.hk = 2;
  s.i = 5;
  s.j = 7;
  s.d = 8;
  const AttentionInputs in = random_attention_inputs(s, false, 3);
  AttentionOptions options;
  options.causal = true;
  options.q_offset = 4;
  options.window = {3, -1};
  options.softcap = 5.0f;
  Tensor mask = Tensor::empty({2, 7}, DType::kUInt8);
  for (std::int64_t c = 0; c < 7; ++c) {
    mask.mutable_data<std::uint8_t>()[c] = 1;                       // length 7
    mask.mutable_data<std::uint8_t>()[7 + c] = c >= 7 - 4 ? 1 : 0;  // length 4, left-padded
  }
  options.key_mask = mask;
  std::vector<float> slopes;
  for (int seq = 0; seq < 2; ++seq) {
    for (float x : alibi_slopes(4)) slopes.push_back(x * (1.0f + 0.5f * static_cast<float>(seq)));
  }
  const Tensor want = attention_forward(in.q, in.k, in.v, AttentionBias::alibi(slopes), options);
  const std::vector<std::string> args = {
      "attention",  "--batch",    "2",          "--heads",
      "4",          "--kv-heads", "2",          "-i",
      "5",          "-j",         "7",          "-d",
      "8",          "--seed",     "3",          "--causal",
      "--q-offset", "4",          "--window",   "3,-1",
      "--softcap",  "5",          "--key-mask", "7,4",
      "--left-pad", "--bias",     "alibi",      "--slopes-per-sequence",
      "--format",   "json"};
  EXPECT_EQ(run_ok(args).out, json_line(want));
}

TEST(Cli, AttentionTableWithMoreQueriesThanKeys) {
  // Non-causal i > j: rows before key 0 reach distances up to i - 1; the tool
  // builds the centred table [h, 2 max(i, j) - 1] (refused before issue 16).
  AttentionShape s;
  s.h = 2;
  s.hk = 2;
  s.i = 5;
  s.j = 3;
  s.d = 4;
  const AttentionInputs in = random_attention_inputs(s, false, 0);
  const Tensor want = attention_forward(
      in.q, in.k, in.v,
      AttentionBias::distance_table(DynamicPositionBias(16, 2, 0).distance_table(5)));
  EXPECT_EQ(run_ok({"attention", "--heads", "2", "-i", "5", "-j", "3", "-d", "4", "--bias", "table",
                    "--format", "json"})
                .out,
            json_line(want));
}

TEST(Cli, AttentionPackedBatchIsVarlenForward) {
  NormalGenerator gen(9);
  const Tensor q = drawn({3 + 0 + 6, 4, 8}, gen);
  const Tensor k = drawn({5 + 2 + 6, 2, 8}, gen);
  const Tensor v = drawn({5 + 2 + 6, 2, 8}, gen);
  AttentionOptions options;
  options.causal = true;
  options.window = {4, -1};
  const Tensor want = attention_varlen_forward(q, k, v, int32_tensor({4}, {0, 3, 3, 9}),
                                               int32_tensor({4}, {0, 5, 7, 13}),
                                               AttentionBias::alibi(alibi_slopes(4)), options);
  EXPECT_EQ(
      run_ok({"attention", "--heads", "4",         "--kv-heads", "2",           "-d",    "8",
              "--seed",    "9",       "--seqlens", "3,0,6",      "--seqlens-k", "5,2,6", "--causal",
              "--window",  "4,-1",    "--bias",    "alibi",      "--format",    "json"})
          .out,
      json_line(want));
}

TEST(Cli, AttentionSlabCacheIsKvcacheForward) {
  NormalGenerator gen(2);
  const Tensor q = drawn({2, 2, 4, 8}, gen);
  const Tensor k = drawn({2, 9, 1, 8}, gen);
  const Tensor v = drawn({2, 9, 1, 8}, gen);
  AttentionOptions options;
  options.causal = true;
  options.softcap = 10.0f;
  const Tensor want = attention_kvcache_forward(
      q, k.to(DType::kFloat16), v.to(DType::kFloat16), int32_tensor({2}, {9, 4}),
      Tensor::empty({0}, DType::kInt32), AttentionBias::alibi(alibi_slopes(4)), options);
  EXPECT_EQ(
      run_ok({"attention",  "--heads",  "4",         "--kv-heads", "1",      "-d",
              "8",          "-i",       "2",         "--seed",     "2",      "--cache-seqlens",
              "9,4",        "--causal", "--softcap", "10",         "--bias", "alibi",
              "--kv-dtype", "float16",  "--format",  "json"})
          .out,
      json_line(want));
}

TEST(Cli, AttentionCheckPassesForEveryForm) {
  const std::vector<std::vector<std::string>> runs = {
      {"--batch", "2", "-i", "6", "-j", "6", "--bias", "table", "--window", "2,2", "--key-mask",
       "6,2"},
      {"-i", "3", "-j", "40", "--bias", "table", "--table-from", "t5", "--causal", "--q-offset",
       "30", "--dtype", "float32", "--kv-dtype", "bfloat16"},
      {"--seqlens", "17,1,0,40", "--causal", "--bias", "table", "--softcap", "20"},
      {"--seqlens", "4,9", "--seqlens-k", "12,3", "--bias", "alibi", "--slopes-per-sequence"},
      {"--cache-seqlens", "37,5,0,70", "--paged", "--block-size", "16", "--causal", "--bias",
       "table", "--kv-dtype", "float16"},
      {"-i", "3", "--cache-seqlens", "20,3", "--paged", "--block-size", "1", "--causal", "--window",
       "5,0", "--bias", "alibi", "--slopes-per-sequence", "--dtype", "bfloat16"},
  };
  for (const std::vector<std::string>& extra : runs) {
    std::vector<std::string> args = {"attention", "--heads", "4",  "--kv-heads",
                                     "2",         "-d",      "16", "--check"};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_EQ(check_line(args).rfind("check: ok, ", 0), 0u) << describe(args, run_ok(args));
  }
}

TEST(Cli, AttentionPagedSummaryNamesTheLayout) {
  const std::vector<std::string> lines =
      lines_of(run_ok({"attention", "--heads", "2", "-d", "4", "--cache-seqlens", "5,9", "--paged",
                       "--block-size", "4"})
                   .out);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "attention_kvcache_forward: out [2, 1, 2, 4] float32");
  EXPECT_NE(lines[1].find("paged cache [5, 4, 2, 4] (block table [2, 3]) float32"),
            std::string::npos)
      << lines[1];
}

}  // namespace
}  // namespace posbias::cli
