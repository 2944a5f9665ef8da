// `posbias dpb`, `posbias t5` and `posbias t5-bucket` as a process: their
// output against the library and the golden files, and bad weights files.
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

// --------------------------------------------------------------------- dpb

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
TEST(Cli, DpbBadWeightsFilesExitTwo) {
  const std::vector<std::string> dpb = {"dpb", "--dim", "2",  "--heads", "1",
                                        "-i",  "1",     "-j", "2",       "--weights"};
  const auto with = [&](const std::string& path) {
    std::vector<std::string> args = dpb;
    args.push_back(path);
    return args;
  };
  expect_bad_argument(with("/nonexistent/dpb.safetensors"),
                      "\"/nonexistent/dpb.safetensors\": No such file or directory");
  const std::string dir = std::filesystem::temp_directory_path().string();
  expect_bad_argument(with(dir), "\"" + dir + "\"");
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
  expect_bad_argument(with(renamed.path()),
                      "missing \"mlp.2.weight\"; unexpected \"mlp.1.weight\"");

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

}  // namespace
}  // namespace posbias::cli
