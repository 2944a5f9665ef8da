// The golden-vector checker's DynamicPositionBias kinds: cases built from the
// library's modules pass, hand-made and malformed ones are judged right, and
// a case's safetensors file is read beside the golden file.
#include "golden_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>

#include "attention_inputs.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "golden_check_test_util.h"

namespace posbias::cli {
namespace {

using json = nlohmann::json;

// ------------------------------------------------------ DynamicPositionBias

// A zeta case with `module`'s parameters, forward calls and the gradient for
// a fixed grad_output, all computed by the library: the checker must pass it.
json library_zeta_case(const DynamicPositionBias& module) {
  json c = {{"kind", "dynamic_position_bias"},
            {"variant", "zeta"},
            {"dim", module.dim()},
            {"heads", module.heads()}};
  for (const auto& [name, tensor] : module.state_dict()) c["params"][name] = tensor_json(tensor);
  c["calls"] = json::array();
  for (const auto& [i, j] : {std::pair<int, int>{3, 3}, {1, 4}, {0, 2}}) {
    json call = tensor_json(module.forward(i, j));
    call["i"] = i;
    call["j"] = j;
    c["calls"].push_back(call);
  }
  std::vector<float> g(static_cast<std::size_t>(module.heads()) * 2 * 3);
  for (std::size_t k = 0; k < g.size(); ++k) g[k] = 0.25f * static_cast<float>(k % 7) - 0.5f;
  const Tensor grad_output = Tensor::from_vector({module.heads(), 2, 3}, g);
  c["grad"] = {{"i", 2}, {"j", 3}, {"grad_output", tensor_json(grad_output)}};
  for (const auto& [name, tensor] : module.backward(2, 3, grad_output)) {
    c["grad"]["param_grads"][name] = tensor_json(tensor);
  }
  return c;
}

// The x-transformers `layers` list of `module`, in module order.
json library_layers(const DynamicPositionBias& module) {
  const DpbOptions& o = module.options();
  json layers = json::array();
  const auto linear = [&](const std::string& prefix) {
    layers.push_back({{"type", "linear"},
                      {"weight", tensor_json(module.parameter(prefix + ".weight"))},
                      {"bias", tensor_json(module.parameter(prefix + ".bias"))}});
  };
  for (std::int64_t b = 0; b < o.depth; ++b) {
    const std::string block = "mlp." + std::to_string(b);
    linear(block + ".0");
    if (o.norm) {
      layers.push_back({{"type", "layernorm"},
                        {"eps", o.layernorm_eps},
                        {"weight", tensor_json(module.parameter(block + ".1.weight"))},
                        {"bias", tensor_json(module.parameter(block + ".1.bias"))}});
    }
    layers.push_back({{"type", "silu"}});
  }
  linear("mlp." + std::to_string(o.depth));
  return layers;
}

json library_x_transformers_case(const DynamicPositionBias& module) {
  const DpbOptions& o = module.options();
  json c = {{"kind", "dynamic_position_bias"},
            {"variant", "x-transformers"},
            {"dim", o.dim},
            {"heads", o.heads},
            {"depth", o.depth},
            {"log_distance", o.log_distance},
            {"norm", o.norm},
            {"layers", library_layers(module)}};
  json call = tensor_json(module.forward(2, 5));
  call["i"] = 2;
  call["j"] = 5;
  c["calls"] = json::array({call});
  return c;
}

// The LayerNorm weights and biases start at 1 and 0: give them other values
// so that a checker mapping them to the wrong block is caught.
DynamicPositionBias x_transformers_module(std::int64_t depth, bool norm, bool log_distance) {
  DpbOptions o;
  o.dim = 4;
  o.heads = 3;
  o.variant = DpbVariant::kXTransformers;
  o.depth = depth;
  o.norm = norm;
  o.log_distance = log_distance;
  DynamicPositionBias module(o, 11);
  float shift = 0.1f;
  for (const std::string& name : module.parameter_names()) {
    if (name.find(".1.") == std::string::npos) continue;
    float* p = module.mutable_parameter(name).mutable_data<float>();
    for (std::int64_t k = 0; k < o.dim; ++k) p[k] += shift * static_cast<float>(k + 1);
    shift += 0.1f;
  }
  return module;
}

TEST(GoldenCheck, DpbZetaByHand) {
  // Every weight 1, every bias 0: bias(d) = silu(silu(d)), the gradients of
  // the sum over the query at distance 1 and 0 worked out by hand
  // (tests/cli/data/golden_corrupted.json uses the same case).
  const std::string params = R"("params": {
      "mlp.0.weight": {"shape": [1, 1], "data": [1]}, "mlp.0.bias": {"shape": [1], "data": [0]},
      "mlp.2.weight": {"shape": [1, 1], "data": [1]}, "mlp.2.bias": {"shape": [1], "data": [0]},
      "mlp.4.weight": {"shape": [1, 1], "data": [1]}, "mlp.4.bias": {"shape": [1], "data": [0]}})";
  const auto grad = [](const std::string& b2) {
    return R"("grad": {"i": 1, "j": 2, "grad_output": {"shape": [1, 1, 2], "data": [1, 1]},
        "param_grads": {
      "mlp.0.weight": {"shape": [1, 1], "data": [0.774979563]},
      "mlp.0.bias": {"shape": [1], "data": [1.02497956]},
      "mlp.2.weight": {"shape": [1, 1], "data": [0.610729188]},
      "mlp.2.bias": {"shape": [1], "data": [)" +
           b2 + R"(]},
      "mlp.4.weight": {"shape": [1, 1], "data": [0.493491975]},
      "mlp.4.bias": {"shape": [1], "data": [2]}}})";
  };
  const auto dpb_case = [&](const std::string& data, const std::string& b2) {
    return R"({"kind": "dynamic_position_bias", "variant": "zeta", "dim": 1, "heads": 1, )" +
           params + R"(, "calls": [{"i": 2, "j": 3, "shape": [1, 2, 3], "data": )" + data + "}], " +
           grad(b2) + "}";
  };
  const std::string right = "[0.493491975, 0, 0.493491975, 1.50336067, 0.493491975, 0]";
  expect_passes(dpb_case(right, "1.3354039"));
  expect_fails_with(dpb_case("[0.493491975, 0, 0.493491975, 1.50336067, 0.5, 0]", "1.3354039"),
                    "call 0 (i = 2, j = 3): element [0, 1, 1] (flat 4): got 0.493492, "
                    "expected 0.5");
  // The top-left convention (queries at 0..i-1) would give row 0 = [0, 0.49, 1.50].
  expect_fails_with(
      dpb_case("[0, 0.493491975, 1.50336067, 0.493491975, 0, 0.493491975]", "1.3354039"),
      "call 0 (i = 2, j = 3): element [0, 0, 0] (flat 0): got 0.493492, "
      "expected 0 (6 of 6 elements differ)");
  expect_fails_with(dpb_case(right, "1.3"),
                    "grad (i = 1, j = 2) of 'mlp.2.bias': element [0] (flat 0): got 1.3354039, "
                    "expected 1.3");
}

TEST(GoldenCheck, DpbZetaAgainstTheLibrary) {
  const DynamicPositionBias module(5, 3, 7);
  const json c = library_zeta_case(module);
  expect_passes(c.dump());

  // One parameter off: the forward calls catch it.
  json changed = c;
  changed["params"]["mlp.2.weight"]["data"][4] =
      changed["params"]["mlp.2.weight"]["data"][4].get<double>() + 0.01;
  expect_fails_with(changed.dump(), "call 0 (i = 3, j = 3)");

  // One gradient off, or two gradients swapped.
  json grad_off = c;
  grad_off["grad"]["param_grads"]["mlp.0.weight"]["data"][2] =
      grad_off["grad"]["param_grads"]["mlp.0.weight"]["data"][2].get<double>() * 1.001 + 1e-3;
  expect_fails_with(grad_off.dump(), "grad (i = 2, j = 3) of 'mlp.0.weight': element [2, 0]");
  json swapped = c;
  std::swap(swapped["grad"]["param_grads"]["mlp.0.bias"],
            swapped["grad"]["param_grads"]["mlp.2.bias"]);
  expect_fails_with(swapped.dump(), "grad (i = 2, j = 3) of 'mlp.0.bias'");
}

TEST(GoldenCheck, DpbXTransformersLayersMapToTheStateDict) {
  for (const auto& [depth, norm, log_distance] :
       {std::tuple<int, bool, bool>{1, false, false}, {2, false, true}, {3, true, true}}) {
    SCOPED_TRACE("depth " + std::to_string(depth) + (norm ? " norm" : "") +
                 (log_distance ? " log_distance" : ""));
    const DynamicPositionBias module = x_transformers_module(depth, norm, log_distance);
    const json c = library_x_transformers_case(module);
    expect_passes(c.dump());
    if (depth < 2) continue;
    // The same layers with blocks 0 and 1 of the hidden dim x dim Linear
    // weights swapped (shapes still fit): the values must differ.
    json swapped = c;
    const std::size_t per_block = norm ? 3 : 2;
    std::swap(swapped["layers"][per_block]["weight"], swapped["layers"][2 * per_block]["weight"]);
    if (depth > 2) expect_fails_with(swapped.dump(), "call 0 (i = 2, j = 5)");
    if (norm) {
      json ln = c;
      std::swap(ln["layers"][1], ln["layers"][per_block + 1]);
      expect_fails_with(ln.dump(), "call 0 (i = 2, j = 5)");
    }
  }
  // A grad field is checked for this variant too when a case has one.
  const DynamicPositionBias module = x_transformers_module(2, true, false);
  json c = library_x_transformers_case(module);
  const Tensor grad_output = Tensor::full({3, 1, 2}, 1.0f);
  c["grad"] = {{"i", 1}, {"j", 2}, {"grad_output", tensor_json(grad_output)}};
  for (const auto& [name, tensor] : module.backward(1, 2, grad_output)) {
    c["grad"]["param_grads"][name] = tensor_json(tensor);
  }
  expect_passes(c.dump());
  c["grad"]["param_grads"]["mlp.1.1.bias"]["data"][0] = 100.0;
  expect_fails_with(c.dump(), "grad (i = 1, j = 2) of 'mlp.1.1.bias': element [0]");
}

TEST(GoldenCheck, DpbMalformedOrRefusedCases) {
  const json zeta = library_zeta_case(DynamicPositionBias(2, 1, 3));
  const json xt = library_x_transformers_case(x_transformers_module(2, true, false));
  const auto edited = [](json c, const std::function<void(json&)>& edit) {
    edit(c);
    return c.dump();
  };
  const std::pair<std::string, std::string> cases[] = {
      {edited(zeta, [](json& c) { c.erase("variant"); }),
       "malformed case: missing field 'variant'"},
      {edited(zeta, [](json& c) { c["variant"] = "lucidrains"; }),
       "malformed case: field 'variant' must be \"zeta\" or \"x-transformers\", got "
       "\"lucidrains\""},
      {edited(zeta, [](json& c) { c.erase("params"); }), "malformed case: missing field 'params'"},
      {edited(zeta, [](json& c) { c["params"]["mlp.0.bias"] = 3; }),
       "malformed case: params \"mlp.0.bias\": must be an object with 'shape' and 'data'"},
      {edited(zeta, [](json& c) { c["params"]["mlp.0.bias"]["shape"] = {3}; }),
       "malformed case: params \"mlp.0.bias\": field 'shape' [3] holds 3 elements but 'data' has 2"},
      {edited(zeta, [](json& c) { c.erase("calls"); }), "malformed case: missing field 'calls'"},
      {edited(zeta, [](json& c) { c["calls"] = json::array(); }),
       "malformed case: field 'calls' is empty: the case would check nothing"},
      {edited(xt, [](json& c) { c["calls"] = json::array(); }),
       "malformed case: field 'calls' is empty: the case would check nothing"},
      {edited(zeta, [](json& c) { c.erase("grad"); }), "malformed case: missing field 'grad'"},
      {edited(zeta, [](json& c) { c["grad"].erase("grad_output"); }),
       "malformed case: field 'grad': missing field 'grad_output'"},
      {edited(zeta, [](json& c) { c["grad"]["param_grads"].erase("mlp.4.bias"); }),
       "malformed case: field 'grad': 'param_grads' has no 'mlp.4.bias'"},
      {edited(zeta,
              [](json& c) {
                c["grad"]["param_grads"]["mlp.6.bias"] = c["grad"]["param_grads"]["mlp.4.bias"];
              }),
       "malformed case: field 'grad': 'param_grads' has \"mlp.6.bias\", which is not a parameter"},
      {edited(xt, [](json& c) { c["layers"].erase(c["layers"].size() - 1); }),
       "malformed case: field 'layers' has 6 layers; depth 2 with norm needs 7 (linear, "
       "layernorm, silu per block, then linear)"},
      {edited(xt, [](json& c) { c["norm"] = false; }),
       "malformed case: field 'layers' has 7 layers; depth 2 without norm needs 5"},
      {edited(xt, [](json& c) { c["depth"] = 4000000000000000000; }),
       "malformed case: field 'layers' has 7 layers; depth 4000000000000000000 with norm needs "
       "more"},
      {edited(xt, [](json& c) { std::swap(c["layers"][1], c["layers"][2]); }),
       "malformed case: layers[1]: expected a 'layernorm' layer, got \"silu\""},
      {edited(xt, [](json& c) { c["layers"][4]["eps"] = 1e-6; }),
       "malformed case: layers[4]: eps 1e-06 differs from the first LayerNorm's"},
      {edited(xt, [](json& c) { c["layers"][0].erase("bias"); }),
       "malformed case: layers[0]: missing field 'bias'"},
      {edited(xt, [](json& c) { c.erase("log_distance"); }),
       "malformed case: missing field 'log_distance'"},
      // Cases the library refuses.
      {edited(zeta, [](json& c) { c["params"].erase("mlp.2.bias"); }),
       "posbias refused the case: DynamicPositionBias::load_state_dict: missing \"mlp.2.bias\""},
      {edited(zeta, [](json& c) { c["dim"] = 3; }),
       "posbias refused the case: DynamicPositionBias::load_state_dict: mlp.0.weight: expected "
       "shape [3, 1], got [2, 1]"},
      {edited(zeta, [](json& c) { c["params"]["mlp.0.bias"]["data"][1] = "nan"; }),
       "posbias refused the case"},
      {edited(zeta, [](json& c) { c["heads"] = 0; }),
       "posbias refused the case: DynamicPositionBias: heads must be >= 1, got 0"},
      {edited(xt, [](json& c) { c["depth"] = 0; }),
       "posbias refused the case: DynamicPositionBias: depth must be >= 1, got 0"},
      {edited(zeta,
              [](json& c) {
                c["grad"]["grad_output"]["shape"] = {1, 3, 2};
              }),
       "posbias refused the case: DynamicPositionBias::backward: gradient must have shape "
       "[1, 2, 3], got [1, 3, 2]"},
      {edited(zeta, [](json& c) { c["calls"][0]["i"] = 4; }),
       "posbias refused the case: DynamicPositionBias::forward: need 0 <= i <= j"},
  };
  for (const auto& [case_json, message] : cases) {
    SCOPED_TRACE(case_json);
    expect_fails_with(case_json, message);
  }
}

// A directory of its own, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "posbias_golden_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(GoldenCheck, DpbFileIsReadBesideTheGoldenFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const DynamicPositionBias module(6, 2, 21);
  module.save(dir.path() + "/weights.safetensors");
  json c = {{"kind", "dynamic_position_bias_file"},
            {"file", "weights.safetensors"},
            {"dim", 6},
            {"heads", 2}};
  json call = tensor_json(module.forward(3, 4));
  call["i"] = 3;
  call["j"] = 4;
  c["calls"] = json::array({call});
  const std::string text = golden(c.dump());
  { std::ofstream(dir.path() + "/golden.json") << text; }

  EXPECT_EQ(check_golden_file(dir.path() + "/golden.json").summary(),
            "1 passed, 0 failed, 0 skipped");
  EXPECT_EQ(check_golden_text(text, dir.path()).summary(), "1 passed, 0 failed, 0 skipped");

  // Looked up beside the golden file, not in the working directory.
  const CaseResult elsewhere = check_golden_text(text, dir.path() + "/sub").cases.at(0);
  EXPECT_EQ(elsewhere.status, CaseStatus::kFailed);
  EXPECT_NE(elsewhere.message.find(dir.path() + "/sub/weights.safetensors"), std::string::npos)
      << elsewhere.message;

  // Weights that do not give the values, or do not fit the module.
  const DynamicPositionBias other(6, 2, 22);
  other.save(dir.path() + "/other.safetensors");
  c["file"] = "other.safetensors";
  const CaseResult wrong = check_golden_text(golden(c.dump()), dir.path()).cases.at(0);
  EXPECT_EQ(wrong.status, CaseStatus::kFailed);
  EXPECT_EQ(wrong.message.rfind("call 0 (i = 3, j = 4): element ", 0), 0u) << wrong.message;
  c["file"] = "weights.safetensors";
  c["dim"] = 5;
  const CaseResult misfit = check_golden_text(golden(c.dump()), dir.path()).cases.at(0);
  EXPECT_EQ(misfit.status, CaseStatus::kFailed);
  EXPECT_NE(misfit.message.find("expected shape [5, 1], got [6, 1]"), std::string::npos)
      << misfit.message;

  expect_fails_with(R"({"kind": "dynamic_position_bias_file", "dim": 6, "heads": 2, "calls": []})",
                    "malformed case: missing field 'file'");
  expect_fails_with(
      R"({"kind": "dynamic_position_bias_file", "file": "", "dim": 6, "heads": 2, "calls": []})",
      "malformed case: field 'file' is empty");
  c["calls"] = json::array();
  const CaseResult no_calls = check_golden_text(golden(c.dump()), dir.path()).cases.at(0);
  EXPECT_EQ(no_calls.status, CaseStatus::kFailed);
  EXPECT_EQ(no_calls.message,
            "malformed case: field 'calls' is empty: the case would check nothing");
}

}  // namespace
}  // namespace posbias::cli
