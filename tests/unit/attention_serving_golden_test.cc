// The serving cases of the golden vectors (serving.json: attention_masked,
// attention_varlen, attention_paged), computed by an independent PyTorch
// implementation: every case through the fused call and its reference at
// the README's attention tolerance (1e-5 + 1e-4 |want|), nothing skipped, and
// the count of cases per kind asserted so none is silently dropped.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using Json = nlohmann::json;
using test::Shape;

Json load_serving() {
  const std::string dir = test::golden_dir("serving.json");
  if (dir.empty()) return Json();
  std::ifstream file(dir + "/serving.json");
  return Json::parse(file);
}

Tensor tensor_of(const Json& t) {
  return Tensor::from_vector(t.at("shape").get<Shape>(), t.at("data").get<std::vector<float>>());
}

Tensor int32_of(const std::vector<float>& values) {
  return Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values).to(DType::kInt32);
}

AttentionBias bias_of(const Json& b) {
  const std::string type = b.at("type");
  if (type == "alibi") {
    const Json& s = b.at("slopes");
    return AttentionBias::alibi(s.is_object() ? s.at("data").get<std::vector<float>>()
                                              : s.get<std::vector<float>>());
  }
  if (type == "distance_table") return AttentionBias::distance_table(tensor_of(b.at("table")));
  if (type != "none") throw std::runtime_error("unknown bias type " + type);
  return AttentionBias::none();
}

AttentionOptions options_of(const Json& c) {
  AttentionOptions opt;
  opt.causal = c.at("causal").get<bool>();
  opt.scale = c.at("scale").get<float>();
  const std::vector<std::int64_t> w = c.at("window").get<std::vector<std::int64_t>>();
  opt.window = {w.at(0), w.at(1)};
  opt.softcap = c.at("softcap").get<float>();
  if (c.contains("q_offset")) opt.q_offset = c.at("q_offset").get<std::int64_t>();
  if (c.contains("key_mask") && !c.at("key_mask").is_null()) {
    opt.key_mask = tensor_of(c.at("key_mask")).to(DType::kUInt8);
  }
  return opt;
}

void check_case(const Json& c, const std::string& what) {
  const std::string kind = c.at("kind");
  const AttentionBias bias = bias_of(c.at("bias"));
  const AttentionOptions opt = options_of(c);
  const std::vector<float> want = c.at("out").at("data").get<std::vector<float>>();
  const Shape want_shape = c.at("out").at("shape").get<Shape>();
  std::vector<std::pair<std::string, Tensor>> got;
  if (kind == "attention_masked") {
    const Tensor q = tensor_of(c.at("q")), k = tensor_of(c.at("k")), v = tensor_of(c.at("v"));
    got.emplace_back("forward", attention_forward(q, k, v, bias, opt));
    got.emplace_back("forward_lse", attention_forward_lse(q, k, v, bias, opt).out);
    got.emplace_back("reference", attention_reference(q, k, v, bias, opt));
  } else if (kind == "attention_varlen") {
    const Tensor q = tensor_of(c.at("q")), k = tensor_of(c.at("k")), v = tensor_of(c.at("v"));
    const Tensor cq = int32_of(c.at("cu_seqlens_q").get<std::vector<float>>());
    const Tensor ck = int32_of(c.at("cu_seqlens_k").get<std::vector<float>>());
    got.emplace_back("varlen_forward", attention_varlen_forward(q, k, v, cq, ck, bias, opt));
    got.emplace_back("varlen_forward_lse",
                     attention_varlen_forward_lse(q, k, v, cq, ck, bias, opt).out);
    got.emplace_back("varlen_reference", attention_varlen_reference(q, k, v, cq, ck, bias, opt));
  } else {
    ASSERT_EQ(kind, "attention_paged");
    const Tensor q = tensor_of(c.at("q"));
    const Tensor kc = tensor_of(c.at("k_cache")), vc = tensor_of(c.at("v_cache"));
    const Tensor lens = int32_of(c.at("cache_seqlens").get<std::vector<float>>());
    const Tensor table = tensor_of(c.at("block_table")).to(DType::kInt32);
    got.emplace_back("kvcache_forward",
                     attention_kvcache_forward(q, kc, vc, lens, table, bias, opt));
    got.emplace_back("kvcache_reference",
                     attention_kvcache_reference(q, kc, vc, lens, table, bias, opt));
  }
  for (const auto& [name, out] : got) {
    ASSERT_EQ(out.shape(), want_shape) << what << " " << name;
    test::expect_close(out.to_float_vector(), want, what + " " + name, 1e-5, 1e-4);
  }
}

TEST(AttentionServingGolden, EveryCaseMatchesPyTorch) {
  const Json doc = load_serving();
  ASSERT_FALSE(doc.is_null()) << "serving.json not found in tests/data/golden or ../shared/golden";
  int n = 0;
  for (const Json& c : doc.at("cases")) {
    const std::string kind = c.at("kind");
    if (kind.rfind("attention_", 0) != 0) continue;
    const std::string what = "serving case " + std::to_string(n++) + " (" + kind + ")";
    SCOPED_TRACE(what);
    check_case(c, what);
  }
  EXPECT_GT(n, 0);
}

// The kinds the file holds, counted: a case of a new kind, or one dropped,
// changes these numbers and fails here rather than passing silently.
TEST(AttentionServingGolden, CountsOfCasesPerKind) {
  const Json doc = load_serving();
  ASSERT_FALSE(doc.is_null()) << "serving.json not found";
  std::map<std::string, int> count;
  for (const Json& c : doc.at("cases")) ++count[c.at("kind").get<std::string>()];
  const std::map<std::string, int> want = {{"attention_masked", 4},
                                           {"attention_varlen", 3},
                                           {"attention_paged", 2},
                                           {"dynamic_position_bias_file", 1}};
  EXPECT_EQ(count, want);
}

}  // namespace
}  // namespace posbias
