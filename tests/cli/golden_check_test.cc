// The golden-vector checker (cli/golden_check.h) as a library: the project's
// reference vectors pass, and every way a case can be wrong is reported as a
// failure (or, for kinds it does not check, a skip), never a pass or a crash.
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

namespace posbias::cli {
namespace {

using json = nlohmann::json;

// A golden file with the given cases (JSON text of each, comma-separated).
std::string golden(const std::string& cases) {
  return R"({"format": "test", "cases": [)" + cases + "]}";
}

CaseResult only_case(const std::string& case_json) {
  const GoldenReport report = check_golden_text(golden(case_json), ".");
  EXPECT_EQ(report.cases.size(), 1u);
  return report.cases.at(0);
}

void expect_fails_with(const std::string& case_json, const std::string& message_part) {
  const CaseResult c = only_case(case_json);
  EXPECT_EQ(c.status, CaseStatus::kFailed) << case_json;
  EXPECT_NE(c.message.find(message_part), std::string::npos)
      << "expected '" << message_part << "' in: " << c.message;
}

void expect_passes(const std::string& case_json) {
  const CaseResult c = only_case(case_json);
  EXPECT_EQ(c.status, CaseStatus::kPassed) << case_json << "\n" << c.message;
}

void expect_project_golden_passes(const std::string& path) {
  const GoldenReport report = check_golden_file(path);
  EXPECT_EQ(report.summary(), POSBIAS_GOLDEN_SUMMARY);
  const std::vector<std::string> checked = golden_checked_kinds();
  const std::vector<std::string> pending = golden_pending_kinds();
  std::set<std::string> seen;
  for (const CaseResult& c : report.cases) {
    seen.insert(c.kind);
    const bool is_checked = std::count(checked.begin(), checked.end(), c.kind) > 0;
    if (is_checked) {
      EXPECT_EQ(c.status, CaseStatus::kPassed)
          << "case " << c.index << " (" << c.kind << "): " << c.message;
    } else {
      // Only kinds of the format that this build does not compute yet.
      EXPECT_EQ(c.status, CaseStatus::kSkipped) << "case " << c.index;
      EXPECT_TRUE(c.known_kind) << "case " << c.index << " has kind " << c.kind;
      EXPECT_GT(std::count(pending.begin(), pending.end(), c.kind), 0) << c.kind;
    }
  }
  // The file exercises every kind this build checks.
  for (const std::string& kind : checked) EXPECT_EQ(seen.count(kind), 1u) << kind;
}

// ------------------------------------------------- the project's vectors

TEST(GoldenCheck, ProjectCopyPasses) {
  expect_project_golden_passes(std::string(POSBIAS_GOLDEN_COPY_DIR) + "/golden.json");
}

TEST(GoldenCheck, SharedGoldenPasses) {
  const std::string path = std::string(POSBIAS_SHARED_GOLDEN_DIR) + "/golden.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " does not exist";
  expect_project_golden_passes(path);
}

TEST(GoldenCheck, KindTable) {
  EXPECT_EQ(golden_checked_kinds(),
            (std::vector<std::string>{"alibi_slopes", "ggml_slopes", "alibi_positional_bias",
                                      "alibi_bias", "dynamic_position_bias",
                                      "dynamic_position_bias_file", "t5_bucket", "attention"}));
  // Every kind of the format is checked: nothing is pending.
  EXPECT_EQ(golden_pending_kinds(), std::vector<std::string>{});
}

// ------------------------------------------------------- correct cases pass

TEST(GoldenCheck, EachKindPasses) {
  expect_passes(R"({"kind": "alibi_slopes", "heads": 6,
                    "slopes": [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]})");
  expect_passes(R"({"kind": "ggml_slopes", "heads": 2, "max_bias": 4,
                    "slopes": [0.25, 0.0625]})");
  // Prefill, then a decode step served from the stored bias, then a block.
  expect_passes(R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 2,
                    "slopes": [0.5], "calls": [
      {"i": 2, "j": 3, "shape": [2, 2, 3], "data": [-0.5, 0, -0.5, -1, -0.5, 0, 0, 0, 0, 0, 0, 0]},
      {"i": 1, "j": 3, "shape": [2, 1, 3], "data": [-1, -0.5, 0, 0, 0, 0]},
      {"i": 1, "j": 1, "shape": [2, 1, 1], "data": [0, 0]}]})");
  expect_passes(R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
                    "slopes": null, "calls": [
      {"i": 1, "j": 2, "shape": [1, 1, 2], "data": [-0.00390625, 0]}]})");
  expect_passes(R"({"kind": "alibi_bias", "n_heads": 1, "causal": true, "slopes": [-0.2],
                    "q_len": 2, "k_len": 2, "shape": [1, 1, 2, 2], "data": [0, 0, -0.2, 0]})");
  expect_passes(R"({"kind": "alibi_bias", "n_heads": 1, "causal": false, "slopes": null,
                    "q_len": 1, "k_len": 2, "shape": [1, 1, 1, 2], "data": [0, -0.05]})");
}

TEST(GoldenCheck, Tolerance) {
  // |got - want| <= 1e-6 + 1e-5 |want|; for want 0.5 that is 6e-6.
  expect_passes(R"({"kind": "ggml_slopes", "heads": 1, "max_bias": 1, "slopes": [0.500005]})");
  expect_fails_with(R"({"kind": "ggml_slopes", "heads": 1, "max_bias": 1, "slopes": [0.500007]})",
                    "got 0.5, expected 0.500007");
  expect_passes(R"({"kind": "alibi_slopes", "heads": 1, "slopes": [0.0039072]})");
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 1, "slopes": [0.0039076]})",
                    "expected 0.0039076");
}

// ----------------------------------------------------- wrong values, shapes

TEST(GoldenCheck, WrongValueNamesTheFirstBadElement) {
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 4,
                        "slopes": [0.25, 0.0625, 0.02, 0.004]})",
                    "element [2] (flat 2): got 0.015625, expected 0.02 (2 of 4 elements differ)");
  expect_fails_with(R"({"kind": "alibi_bias", "n_heads": 1, "causal": false, "slopes": [-0.2],
                        "q_len": 2, "k_len": 2, "shape": [1, 1, 2, 2], "data": [0, -0.2, -0.2, 1]})",
                    "element [0, 0, 1, 1] (flat 3): got -0, expected 1");
}

TEST(GoldenCheck, WrongShapeFails) {
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 2, "slopes": [0.0625]})",
                    "shape [2], expected [1]");
  expect_fails_with(R"({"kind": "alibi_bias", "n_heads": 1, "causal": false, "slopes": [-0.2],
                        "q_len": 2, "k_len": 2, "shape": [1, 2, 2], "data": [0, -0.2, -0.2, 0]})",
                    "shape [1, 1, 2, 2], expected [1, 2, 2]");
  // Same element count, different shape: still a failure.
  expect_fails_with(R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
                        "slopes": [0.5], "calls": [
      {"i": 2, "j": 2, "shape": [1, 2, 2], "data": [0, -0.5, -0.5, 0]},
      {"i": 1, "j": 2, "shape": [1, 2, 1], "data": [-0.5, 0]}]})",
                    "call 1 (i = 1, j = 2): shape [1, 1, 2], expected [1, 2, 1]");
}

TEST(GoldenCheck, TopLeftCacheBlockWouldFail) {
  // After (3, 3) the decode step (1, 3) must be the LAST row [-1, -0.5, 0];
  // a checker (or module) using the top-left block would see [0, -0.5, -1].
  expect_fails_with(R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
                        "slopes": [0.5], "calls": [
      {"i": 3, "j": 3, "shape": [1, 3, 3], "data": [0, -0.5, -1, -0.5, 0, -0.5, -1, -0.5, 0]},
      {"i": 1, "j": 3, "shape": [1, 1, 3], "data": [0, -0.5, -1]}]})",
                    "call 1 (i = 1, j = 3): element [0, 0, 0] (flat 0): got -1, expected 0");
}

TEST(GoldenCheck, NonFiniteExpectedValues) {
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 1, "slopes": ["nan"]})", "expected nan");
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 1, "slopes": ["-inf"]})", "expected -inf");
}

// ---------------------------------------------------- skipped, never passed

TEST(GoldenCheck, UnknownKindIsSkippedAndSaysSo) {
  const CaseResult c = only_case(R"({"kind": "alibi_slopez", "heads": 1, "slopes": [1]})");
  EXPECT_EQ(c.status, CaseStatus::kSkipped);
  EXPECT_FALSE(c.known_kind);
  EXPECT_EQ(c.message, "unknown kind 'alibi_slopez'");
}

TEST(GoldenCheck, PendingKindsAreSkipped) {
  for (const std::string& kind : golden_pending_kinds()) {
    const CaseResult c = only_case(R"({"kind": ")" + kind + R"("})");
    EXPECT_EQ(c.status, CaseStatus::kSkipped) << kind;
    EXPECT_TRUE(c.known_kind) << kind;
  }
  // attention was pending until the fused kernel existed: an empty case is
  // now checked, and fails as malformed instead of being skipped.
  expect_fails_with(R"({"kind": "attention"})", "malformed case: missing field 'q'");
}

// ----------------------------------------------- malformed cases: failures

TEST(GoldenCheck, MalformedCasesFailWithAClearMessage) {
  const std::pair<const char*, const char*> cases[] = {
      {R"(42)", "a case must be an object, got number 42"},
      {R"([1, 2])", "a case must be an object, got array"},
      {R"({"heads": 1})", "missing field 'kind'"},
      {R"({"kind": 7})", "field 'kind' must be a string, got number 7"},
      {R"({"kind": "alibi_slopes", "slopes": [1]})", "missing field 'heads'"},
      {R"({"kind": "alibi_slopes", "heads": "4", "slopes": [1]})",
       "field 'heads' must be an integer, got string \"4\""},
      {R"({"kind": "alibi_slopes", "heads": 4.5, "slopes": [1]})",
       "field 'heads' must be an integer, got number 4.5"},
      {R"({"kind": "alibi_slopes", "heads": 18446744073709551615, "slopes": [1]})",
       "field 'heads' is out of range"},
      {R"({"kind": "alibi_slopes", "heads": 1})", "missing field 'slopes'"},
      {R"({"kind": "alibi_slopes", "heads": 1, "slopes": 0.5})",
       "field 'slopes' must be an array of numbers, got number 0.5"},
      {R"({"kind": "alibi_slopes", "heads": 1, "slopes": [true]})",
       "field 'slopes'[0] must be a number, got boolean true"},
      {R"({"kind": "ggml_slopes", "heads": 1, "slopes": [1]})", "missing field 'max_bias'"},
      {R"({"kind": "ggml_slopes", "heads": 1, "max_bias": "8", "slopes": [1]})",
       "field 'max_bias' must be a number"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "calls": []})",
       "missing field 'total_heads'"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1})",
       "missing field 'calls'"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1, "calls": {}})",
       "field 'calls' must be an array"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1, "calls": [3]})",
       "call 0: must be an object"},
      // A case that checks nothing must not count as passed.
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1, "calls": []})",
       "field 'calls' is empty: the case would check nothing"},
      {R"({"kind": "alibi_positional_bias", "heads": 2, "total_heads": 1, "calls": []})",
       "field 'calls' is empty: the case would check nothing"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
           "calls": [{"i": 1, "shape": [1, 1, 1], "data": [0]}]})",
       "call 0: missing field 'j'"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
           "calls": [{"i": 1, "j": 1, "shape": [1, -1, 1], "data": [0]}]})",
       "call 0: field 'shape' has a negative extent"},
      {R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
           "calls": [{"i": 1, "j": 1, "shape": [1, 1, 1], "data": [0, 0]}]})",
       "call 0: field 'shape' [1, 1, 1] holds 1 elements but 'data' has 2"},
      {R"({"kind": "alibi_bias", "n_heads": 1, "causal": "yes", "slopes": null, "q_len": 1,
           "k_len": 1, "shape": [1, 1, 1, 1], "data": [0]})",
       "field 'causal' must be true or false"},
      {R"({"kind": "alibi_bias", "n_heads": 1, "causal": true, "slopes": [], "q_len": 1,
           "k_len": 1, "shape": [1, 1, 1, 1], "data": [0]})",
       "field 'slopes' is an empty list"},
      {R"({"kind": "alibi_bias", "n_heads": 1, "causal": true, "slopes": null, "q_len": 1,
           "k_len": 1, "shape": [1, 1, 1, 1]})",
       "missing field 'data'"},
  };
  for (const auto& [case_json, message] : cases) {
    SCOPED_TRACE(case_json);
    expect_fails_with(case_json, std::string("malformed case: ") + message);
  }
}

TEST(GoldenCheck, ArgumentsThePosbiasLibraryRefusesAreFailures) {
  expect_fails_with(R"({"kind": "alibi_slopes", "heads": 0, "slopes": []})",
                    "posbias refused the case: heads must be >= 1, got 0");
  expect_fails_with(R"({"kind": "alibi_positional_bias", "heads": 2, "total_heads": 1,
                        "calls": [{"i": 1, "j": 1, "shape": [2, 1, 1], "data": [0, 0]}]})",
                    "posbias refused the case");
  expect_fails_with(R"({"kind": "alibi_positional_bias", "heads": 1, "total_heads": 1,
                        "calls": [{"i": 100000000000, "j": 100000000000,
                                   "shape": [1, 1, 1], "data": [0]}]})",
                    "posbias refused the case");
  expect_fails_with(R"({"kind": "alibi_bias", "n_heads": 2, "causal": true, "slopes": [-0.1],
                        "q_len": 1, "k_len": 1, "shape": [1, 2, 1, 1], "data": [0, 0]})",
                    "posbias refused the case: AlibiBias: slopes must have n_heads = 2");
}

// ------------------------------------------------------ DynamicPositionBias

// {"shape", "data"} of a tensor, every value exact.
json tensor_json(const Tensor& t) { return json::parse(to_json(t)); }

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
       "malformed case: params 'mlp.0.bias': must be an object with 'shape' and 'data'"},
      {edited(zeta, [](json& c) { c["params"]["mlp.0.bias"]["shape"] = {3}; }),
       "malformed case: params 'mlp.0.bias': field 'shape' [3] holds 3 elements but 'data' has 2"},
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
       "malformed case: field 'grad': 'param_grads' has 'mlp.6.bias', which is not a parameter"},
      {edited(xt, [](json& c) { c["layers"].erase(c["layers"].size() - 1); }),
       "malformed case: field 'layers' has 6 layers; depth 2 with norm needs 7 (linear, "
       "layernorm, silu per block, then linear)"},
      {edited(xt, [](json& c) { c["norm"] = false; }),
       "malformed case: field 'layers' has 7 layers; depth 2 without norm needs 5"},
      {edited(xt, [](json& c) { c["depth"] = 4000000000000000000; }),
       "malformed case: field 'layers' has 7 layers; depth 4000000000000000000 with norm needs "
       "more"},
      {edited(xt, [](json& c) { std::swap(c["layers"][1], c["layers"][2]); }),
       "malformed case: layers[1]: expected a 'layernorm' layer, got 'silu'"},
      {edited(xt, [](json& c) { c["layers"][4]["eps"] = 1e-6; }),
       "malformed case: layers[4]: eps 1e-06 differs from the first LayerNorm's"},
      {edited(xt, [](json& c) { c["layers"][0].erase("bias"); }),
       "malformed case: layers[0]: missing field 'bias'"},
      {edited(xt, [](json& c) { c.erase("log_distance"); }),
       "malformed case: missing field 'log_distance'"},
      // Cases the library refuses.
      {edited(zeta, [](json& c) { c["params"].erase("mlp.2.bias"); }),
       "posbias refused the case: DynamicPositionBias::load_state_dict: missing mlp.2.bias"},
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

// ------------------------------------------------------------- T5 buckets

TEST(GoldenCheck, T5Buckets) {
  // The examples of include/posbias/t5.h.
  expect_passes(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32, "max_distance": 128,
                    "rel": [-7, 7, 0], "buckets": [7, 23, 0]})");
  expect_passes(R"({"kind": "t5_bucket", "causal": true, "num_buckets": 32, "max_distance": 128,
                    "rel": [-128, 5], "buckets": [31, 0]})");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32,
                        "max_distance": 128, "rel": [-7, 7, 1, 2], "buckets": [7, 7, 17, 17]})",
                    "rel 7 (index 1): got bucket 23, expected 7 (2 of 4 differ)");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32,
                        "max_distance": 128, "rel": [1, 2], "buckets": [17]})",
                    "malformed case: field 'rel' has 2 values but 'buckets' has 1");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32,
                        "max_distance": 128, "rel": [1.5], "buckets": [17]})",
                    "malformed case: field 'rel'[0] must be an integer, got number 1.5");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32,
                        "max_distance": 128, "rel": 1, "buckets": [17]})",
                    "malformed case: field 'rel' must be an array, got number 1");
  expect_fails_with(R"({"kind": "t5_bucket", "num_buckets": 32, "max_distance": 128,
                        "rel": [1], "buckets": [17]})",
                    "malformed case: missing field 'causal'");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 32,
                        "max_distance": 128, "rel": [], "buckets": []})",
                    "malformed case: field 'rel' is empty: the case would check nothing");
  expect_fails_with(R"({"kind": "t5_bucket", "causal": false, "num_buckets": 2,
                        "max_distance": 128, "rel": [1], "buckets": [1]})",
                    "posbias refused the case");
}

// -------------------------------------------------------------- attention

// An attention case on seeded inputs whose `out` is attention_reference's:
// bias "none", "alibi" (alibi_slopes(h)) or "distance_table" (a T5 table). scale 0.3, or null for
// the default.
json library_attention_case(const AttentionShape& s, bool causal, const std::string& bias_type,
                            std::uint64_t seed, bool default_scale = false) {
  const AttentionInputs in = random_attention_inputs(s, false, seed);
  AttentionOptions options;
  options.causal = causal;
  if (!default_scale) options.scale = 0.3f;
  json c = {{"kind", "attention"},
            {"causal", causal},
            {"q", tensor_json(in.q)},
            {"k", tensor_json(in.k)},
            {"v", tensor_json(in.v)}};
  c["scale"] = default_scale ? json(nullptr) : json(0.3);
  AttentionBias bias = AttentionBias::none();
  if (bias_type == "none") {
    c["bias"] = {{"type", "none"}};
  } else if (bias_type == "alibi") {
    bias = AttentionBias::alibi(alibi_slopes(s.h));
    c["bias"] = {{"type", "alibi"}, {"slopes", alibi_slopes(s.h)}};
  } else {
    // T5's two-sided table: not symmetric, so the direction of the index matters.
    const Tensor table = RelativePositionBias(1.0f, false, 32, 128, s.h, seed).distance_table(s.j);
    bias = AttentionBias::distance_table(table);
    c["bias"] = {{"type", "distance_table"}, {"table", tensor_json(table)}};
  }
  c["out"] = tensor_json(attention_reference(in.q, in.k, in.v, bias, options));
  return c;
}

AttentionShape attention_shape(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                               std::int64_t j, std::int64_t d) {
  AttentionShape s;
  s.b = b;
  s.h = h;
  s.hk = hk;
  s.i = i;
  s.j = j;
  s.d = d;
  return s;
}

TEST(GoldenCheck, AttentionAgainstTheLibrary) {
  const AttentionShape shapes[] = {
      attention_shape(1, 2, 2, 5, 5, 4),     // i = j
      attention_shape(2, 4, 2, 3, 7, 8),     // grouped-query, a chunk (i < j)
      attention_shape(1, 3, 1, 1, 9, 3),     // decode, multi-query
      attention_shape(1, 2, 1, 70, 70, 16),  // more than one query/key block
  };
  std::uint64_t seed = 1;
  for (const AttentionShape& s : shapes) {
    for (const char* bias : {"none", "alibi", "distance_table"}) {
      for (const bool causal : {false, true}) {
        SCOPED_TRACE(std::string(bias) + (causal ? " causal" : "") + " h " + std::to_string(s.h) +
                     " hk " + std::to_string(s.hk) + " i " + std::to_string(s.i) + " j " +
                     std::to_string(s.j));
        expect_passes(library_attention_case(s, causal, bias, seed++).dump());
      }
    }
  }
  // scale null: the default 1 / sqrt(d).
  expect_passes(library_attention_case(shapes[1], true, "alibi", 99, true).dump());
}

TEST(GoldenCheck, AttentionTolerance) {
  // |got - want| <= 1e-5 + 1e-4 |want| (not the 1e-6 + 1e-5 of the other kinds).
  const json c = library_attention_case(attention_shape(1, 2, 2, 4, 6, 8), true, "alibi", 5);
  const double want = c["out"]["data"][3].get<double>();
  const double tol = 1e-5 + 1e-4 * std::fabs(want);
  json inside = c;
  inside["out"]["data"][3] = want + 0.5 * tol;
  expect_passes(inside.dump());
  json outside = c;
  outside["out"]["data"][3] = want + 3 * tol;
  const CaseResult r = only_case(outside.dump());
  EXPECT_EQ(r.status, CaseStatus::kFailed);
  // Both paths are compared and named.
  EXPECT_EQ(r.message.rfind("attention_forward: element [0, 0, 0, 3] (flat 3): got ", 0), 0u)
      << r.message;
  EXPECT_NE(r.message.find("; attention_reference: element [0, 0, 0, 3] (flat 3): got "),
            std::string::npos)
      << r.message;
}

TEST(GoldenCheck, AttentionWrongCasesFail) {
  const json c =
      library_attention_case(attention_shape(1, 2, 1, 3, 5, 4), true, "distance_table", 8);
  const auto edited = [&](const std::function<void(json&)>& edit) {
    json e = c;
    edit(e);
    return e.dump();
  };
  // The output of the other causality, the other alignment of the table
  // (mirrored), another scale: all differ somewhere.
  expect_fails_with(edited([](json& e) { e["causal"] = false; }), "attention_forward: element ");
  expect_fails_with(edited([](json& e) {
                      json& data = e["bias"]["table"]["data"];
                      const std::size_t n = 9;  // 2j - 1 per head
                      for (std::size_t h = 0; h < 2; ++h) {
                        for (std::size_t x = 0; x < n / 2; ++x) {
                          std::swap(data[h * n + x], data[h * n + n - 1 - x]);
                        }
                      }
                    }),
                    "attention_forward: element ");
  expect_fails_with(edited([](json& e) { e["scale"] = 0.31; }), "attention_forward: element ");
  // An output of another shape.
  expect_fails_with(edited([](json& e) {
                      e["out"]["shape"] = {1, 2, 4, 3};
                    }),
                    "attention_forward: shape [1, 2, 3, 4], expected [1, 2, 4, 3]");
}

TEST(GoldenCheck, AttentionMalformedOrRefusedCases) {
  const json c = library_attention_case(attention_shape(1, 2, 2, 2, 3, 2), false, "alibi", 4);
  const auto edited = [&](const std::function<void(json&)>& edit) {
    json e = c;
    edit(e);
    return e.dump();
  };
  const std::pair<std::string, std::string> cases[] = {
      {edited([](json& e) { e.erase("q"); }), "malformed case: missing field 'q'"},
      {edited([](json& e) { e["k"] = nullptr; }),
       "malformed case: field 'k': must be an object with 'shape' and 'data', got null"},
      {edited([](json& e) { e["v"].erase("data"); }),
       "malformed case: field 'v': missing field 'data'"},
      {edited([](json& e) {
         e["q"]["shape"] = {2, 2, 2};
       }),
       "malformed case: field 'q' must have 4 dimensions [b, h, i, d], got shape [2, 2, 2]"},
      {edited([](json& e) {
         e["k"]["shape"] = {1, 2, 6};
       }),
       "malformed case: field 'k' must have 4 dimensions [b, hk, j, d], got shape [1, 2, 6]"},
      {edited([](json& e) {
         e["q"]["shape"] = {1, 2, 2, 3};
       }),
       "malformed case: field 'q': field 'shape' [1, 2, 2, 3] holds 12 elements but 'data' has 8"},
      {edited([](json& e) { e.erase("causal"); }), "malformed case: missing field 'causal'"},
      {edited([](json& e) { e.erase("scale"); }), "malformed case: missing field 'scale'"},
      {edited([](json& e) { e["scale"] = "0.5"; }),
       "malformed case: field 'scale' must be a number, got string"},
      {edited([](json& e) { e.erase("bias"); }), "malformed case: missing field 'bias'"},
      {edited([](json& e) { e["bias"] = "alibi"; }),
       "malformed case: field 'bias' must be an object, got string"},
      {edited([](json& e) { e["bias"].erase("type"); }),
       "malformed case: field 'bias': missing field 'type'"},
      {edited([](json& e) { e["bias"]["type"] = "dense"; }),
       "malformed case: field 'bias': field 'type' must be \"none\", \"alibi\" or "
       "\"distance_table\", got \"dense\""},
      {edited([](json& e) { e["bias"].erase("slopes"); }),
       "malformed case: field 'bias': missing field 'slopes'"},
      {edited([](json& e) {
         e["bias"] = {{"type", "distance_table"}};
       }),
       "malformed case: field 'bias': missing field 'table'"},
      {edited([](json& e) {
         e["bias"] = {{"type", "distance_table"},
                      {"table", {{"shape", {5}}, {"data", {0, 0, 0, 0, 0}}}}};
       }),
       "malformed case: field 'bias': field 'table' must have 2 dimensions [h, 2j - 1], got "
       "shape [5]"},
      {edited([](json& e) { e.erase("out"); }), "malformed case: missing field 'out'"},
      {edited([](json& e) { e["out"] = json::array(); }),
       "malformed case: field 'out': must be an object with 'shape' and 'data', got array"},
      {edited([](json& e) { e["out"]["data"].erase(0); }),
       "malformed case: field 'out': field 'shape' [1, 2, 2, 2] holds 8 elements but 'data' has 7"},
      // Cases the library refuses, with the shapes in the message.
      {edited([](json& e) { e["bias"]["slopes"] = {0.5}; }),
       "posbias refused the case: attention_forward: ALiBi needs one slope per query head: got 1 "
       "slopes for h = 2 (q [1, 2, 2, 2], k [1, 2, 3, 2], v [1, 2, 3, 2])"},
      {edited([](json& e) {
         e["bias"]["slopes"] = {0.5, "inf"};
       }),
       "posbias refused the case"},
      {edited([](json& e) { e["scale"] = "nan"; }),
       "posbias refused the case: attention_forward: scale must be finite"},
      {edited([](json& e) {
         e["bias"] = {{"type", "distance_table"},
                      {"table", {{"shape", {2, 4}}, {"data", {0, 0, 0, 0, 0, 0, 0, 0}}}}};
       }),
       "posbias refused the case: attention_forward: the distance table must be float32 [h, >= "
       "2j - 1] = [2, >= 5], got float32 table [2, 4]"},
      {edited([](json& e) {
         e["k"]["shape"] = {1, 3, 2, 2};
         e["v"]["shape"] = {1, 3, 2, 2};
       }),
       "posbias refused the case: attention_forward: the query heads h = 2 must be a multiple of "
       "the key/value heads hk = 3"},
      {edited([](json& e) {
         e["v"]["shape"] = {1, 2, 1, 6};
       }),
       "posbias refused the case: attention_forward: k and v must have the same shape"},
  };
  for (const auto& [case_json, message] : cases) {
    SCOPED_TRACE(case_json);
    expect_fails_with(case_json, message);
  }
}

// ------------------------------------------------------------ whole files

TEST(GoldenCheck, SummaryCountsEveryCase) {
  const GoldenReport report =
      check_golden_text(golden(R"({"kind": "alibi_slopes", "heads": 1, "slopes": [0.00390625]},
                {"kind": "alibi_slopes", "heads": 1, "slopes": [0.5]},
                {"kind": "attention"},
                {"kind": "something_new"},
                {"no": "kind"})"),
                        ".");
  // The empty attention case is malformed (failed); only the unknown kind
  // is skipped.
  EXPECT_EQ(report.passed(), 1u);
  EXPECT_EQ(report.failed(), 3u);
  EXPECT_EQ(report.skipped(), 1u);
  EXPECT_EQ(report.summary(), "1 passed, 3 failed, 1 skipped");
  for (std::size_t k = 0; k < report.cases.size(); ++k) EXPECT_EQ(report.cases[k].index, k);
  EXPECT_EQ(check_golden_text(golden(""), ".").summary(), "0 passed, 0 failed, 0 skipped");
}

TEST(GoldenCheck, FilesThatAreNotGoldenFilesThrow) {
  for (const char* text : {"", "{", "not json", "[]", "{\"cases\": 3}", "{\"format\": 1}",
                           "{\"cases\": [] } trailing"}) {
    EXPECT_THROW(check_golden_text(text, "."), GoldenFileError) << text;
  }
  EXPECT_THROW(check_golden_file("/nonexistent/golden.json"), GoldenFileError);
  EXPECT_THROW(check_golden_file(std::filesystem::temp_directory_path().string()), GoldenFileError);
}

}  // namespace
}  // namespace posbias::cli
