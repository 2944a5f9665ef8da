// The golden-vector checker's T5 bucket and attention kinds: library-made
// cases pass (both paths), wrong, malformed or refused ones fail with a clear
// message.
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
       "malformed case: field 'bias': field 'table' must have 2 dimensions [h, n], got shape [5]"},
      {edited([](json& e) { e.erase("out"); }), "malformed case: missing field 'out'"},
      {edited([](json& e) { e["out"] = json::array(); }),
       "malformed case: field 'out': must be an object with 'shape' and 'data', got array"},
      {edited([](json& e) { e["out"]["data"].erase(0); }),
       "malformed case: field 'out': field 'shape' [1, 2, 2, 2] holds 8 elements but 'data' has 7"},
      // Cases the library refuses, with the shapes in the message.
      {edited([](json& e) { e["bias"]["slopes"] = {0.5}; }),
       "posbias refused the case: attention_forward: ALiBi needs one slope per query head or one "
       "set per sequence: got 1 slopes for h = 2, b = 1 (h or b * h slopes) (q [1, 2, 2, 2], "
       "k [1, 2, 3, 2], v [1, 2, 3, 2])"},
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
       "posbias refused the case: attention_forward: the distance table must be float32 [h, n] "
       "with h = 2 and n odd (read at its centre (n - 1) / 2), got float32 table [2, 4]"},
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

}  // namespace
}  // namespace posbias::cli
