// DynamicPositionBias against the golden PyTorch vectors: the zeta variant's
// forward and parameter gradients, the x-transformers variant's forward (its
// layers in the golden file's order), and the safetensors file PyTorch wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpb_reference.h"
#include "posbias/dpb.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::describe;
using test::expect_close;
using test::golden_dir;
using test::xt_options;

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Shape = std::vector<std::int64_t>;

std::vector<Json> golden_cases(const std::string& kind) {
  const std::string dir = golden_dir();
  if (dir.empty()) return {};
  std::ifstream in(fs::path(dir) / "golden.json");
  const Json doc = Json::parse(in);
  std::vector<Json> out;
  for (const Json& c : doc.at("cases")) {
    if (c.at("kind") == kind) out.push_back(c);
  }
  return out;
}

Tensor tensor_of(const Json& j) {
  return Tensor::from_vector(j.at("shape").get<Shape>(), j.at("data").get<std::vector<float>>());
}

// ---------------------------------------------------------------- golden

TEST(DpbGolden, ZetaForwardAndGradients) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  int checked = 0;
  for (const Json& c : cases) {
    if (c.at("variant") != "zeta") continue;
    const std::string what = "zeta dim " + std::to_string(c.at("dim").get<int>());
    DynamicPositionBias m(c.at("dim").get<std::int64_t>(), c.at("heads").get<std::int64_t>());
    TensorMap params;
    for (const auto& [name, t] : c.at("params").items()) params.emplace(name, tensor_of(t));
    m.load_state_dict(params);
    for (const Json& call : c.at("calls")) {
      const auto i = call.at("i").get<std::int64_t>();
      const auto j = call.at("j").get<std::int64_t>();
      const Tensor out = m.forward(i, j);
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>()) << what;
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   what + " forward(" + std::to_string(i) + ", " + std::to_string(j) + ")");
    }
    const Json& g = c.at("grad");
    const TensorMap grads = m.backward(g.at("i").get<std::int64_t>(), g.at("j").get<std::int64_t>(),
                                       tensor_of(g.at("grad_output")));
    ASSERT_EQ(grads.size(), g.at("param_grads").size());
    for (const auto& [name, t] : g.at("param_grads").items()) {
      ASSERT_TRUE(grads.count(name)) << name;
      ASSERT_EQ(grads.at(name).shape(), t.at("shape").get<Shape>()) << name;
      expect_close(grads.at(name).to_float_vector(), t.at("data").get<std::vector<float>>(),
                   what + " grad " + name);
    }
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(DpbGolden, XTransformersForward) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  int checked = 0;
  for (const Json& c : cases) {
    if (c.at("variant") != "x-transformers") continue;
    DpbOptions o =
        xt_options(c.at("dim"), c.at("heads"), c.at("depth"), c.at("log_distance"), c.at("norm"));
    // The layers in order: block b is Linear, [LayerNorm], SiLU; then the
    // output Linear.
    TensorMap params;
    std::int64_t block = 0;
    for (const Json& layer : c.at("layers")) {
      const std::string type = layer.at("type");
      const std::string b = std::to_string(block);
      if (type == "linear") {
        const std::string prefix = block < o.depth ? "mlp." + b + ".0" : "mlp." + b;
        params.emplace(prefix + ".weight", tensor_of(layer.at("weight")));
        params.emplace(prefix + ".bias", tensor_of(layer.at("bias")));
      } else if (type == "layernorm") {
        o.layernorm_eps = layer.at("eps").get<float>();
        params.emplace("mlp." + b + ".1.weight", tensor_of(layer.at("weight")));
        params.emplace("mlp." + b + ".1.bias", tensor_of(layer.at("bias")));
      } else if (type == "silu") {
        ++block;
      } else {
        FAIL() << "unknown layer type " << type;
      }
    }
    DynamicPositionBias m(o);
    m.load_state_dict(params);
    for (const Json& call : c.at("calls")) {
      const auto i = call.at("i").get<std::int64_t>();
      const auto j = call.at("j").get<std::int64_t>();
      const Tensor out = m.forward(i, j);
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>());
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   describe(o) + " forward(" + std::to_string(i) + ", " + std::to_string(j) + ")");
    }
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(DpbGolden, SafetensorsFileFromPyTorch) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias_file");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  for (const Json& c : cases) {
    DynamicPositionBias m(c.at("dim").get<std::int64_t>(), c.at("heads").get<std::int64_t>());
    m.load((fs::path(golden_dir()) / c.at("file").get<std::string>()).string());
    for (const Json& call : c.at("calls")) {
      const Tensor out = m.forward(call.at("i"), call.at("j"));
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>());
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   c.at("file").get<std::string>());
    }
  }
}

}  // namespace
}  // namespace posbias
