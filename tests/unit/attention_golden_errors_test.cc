// Attention against the golden PyTorch vectors, and its bad input: every
// argument error names the shapes.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_close;
using test::expect_throw_with;
using test::golden_dir;
using test::kInf;
using test::random_tensor;
using test::Shape;
using Json = nlohmann::json;

// --------------------------------------------------------------- golden

TEST(AttentionGolden, MatchesPyTorch) {
  const std::string dir = golden_dir();
  if (dir.empty()) GTEST_SKIP() << "no golden.json found";
  std::ifstream file(dir + "/golden.json");
  const Json doc = Json::parse(file);
  auto tensor_of = [](const Json& t) {
    return Tensor::from_vector(t.at("shape").get<Shape>(), t.at("data").get<std::vector<float>>());
  };
  int n = 0;
  for (const Json& c : doc.at("cases")) {
    if (c.at("kind") != "attention") continue;
    ++n;
    const Tensor q = tensor_of(c.at("q")), k = tensor_of(c.at("k")), v = tensor_of(c.at("v"));
    AttentionOptions opt;
    opt.causal = c.at("causal").get<bool>();
    opt.scale = c.at("scale").get<float>();
    const Json& b = c.at("bias");
    const std::string type = b.at("type");
    AttentionBias bias;
    if (type == "alibi") {
      bias = AttentionBias::alibi(b.at("slopes").get<std::vector<float>>());
    } else if (type == "distance_table") {
      bias = AttentionBias::distance_table(tensor_of(b.at("table")));
    } else {
      ASSERT_EQ(type, "none");
    }
    const std::vector<float> want = c.at("out").at("data").get<std::vector<float>>();
    const std::string what = "golden attention case " + std::to_string(n) + " (" + type + ")";
    expect_close(attention_forward(q, k, v, bias, opt).to_float_vector(), want, what, 1e-5, 1e-4);
    expect_close(attention_reference(q, k, v, bias, opt).to_float_vector(), want,
                 what + " reference", 1e-5, 1e-4);
  }
  EXPECT_GE(n, 7);
}

// ------------------------------------------------------------ bad input

TEST(Attention, BadInputThrowsWithTheShapes) {
  const Tensor q = random_tensor({1, 4, 3, 8}, 1);
  const Tensor k = random_tensor({1, 2, 5, 8}, 2);
  using E = std::invalid_argument;
  auto fwd = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv,
                 const AttentionBias& bias = AttentionBias::none(), AttentionOptions opt = {}) {
    return [=] { attention_forward(qq, kk, vv, bias, opt); };
  };
  expect_throw_with<E>(fwd(q, k, random_tensor({1, 2, 6, 8}, 3)), "v [1, 2, 6, 8]");
  expect_throw_with<E>(fwd(q, random_tensor({1, 2, 5, 7}, 3), random_tensor({1, 2, 5, 7}, 3)),
                       "k [1, 2, 5, 7]");
  expect_throw_with<E>(fwd(q, random_tensor({1, 3, 5, 8}, 3), random_tensor({1, 3, 5, 8}, 3)),
                       "hk = 3");
  expect_throw_with<E>(fwd(q, random_tensor({2, 2, 5, 8}, 3), random_tensor({2, 2, 5, 8}, 3)),
                       "q [1, 4, 3, 8], k [2, 2, 5, 8]");
  expect_throw_with<E>(fwd(random_tensor({4, 3, 8}, 1), k, k), "q [4, 3, 8]");
  const Tensor q0 = Tensor::empty({1, 4, 3, 0}, DType::kFloat32);
  const Tensor k0 = Tensor::empty({1, 2, 5, 0}, DType::kFloat32);
  expect_throw_with<E>(fwd(q0, k0, k0), "d must be >= 1, got 0");
  expect_throw_with<E>(fwd(q, k.to(DType::kBFloat16), k), "bfloat16");
  AttentionOptions nan_scale;
  nan_scale.scale = NAN;
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::none(), nan_scale), "scale must be finite");
  AttentionOptions inf_scale;
  inf_scale.scale = kInf;
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::none(), inf_scale), "q [1, 4, 3, 8]");
  // Options are doubles; float32 calls use their float32 roundings, which
  // must stay finite (and softcap > 0).
  AttentionOptions big_scale;
  big_scale.scale = 1e300;
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::none(), big_scale),
                       "scale must be finite as a float32 (a float32 call), got 1e+300");
  AttentionOptions tiny_cap;
  tiny_cap.softcap = 1e-50;
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::none(), tiny_cap),
                       "softcap must be a finite float32 > 0 (a float32 call), got 1e-50");
  tiny_cap.softcap = -0.5;
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::none(), tiny_cap),
                       "softcap must be finite and >= 0 (0: off), got -0.5");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::alibi({1, 2, 3})), "got 3 slopes for h = 4");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::alibi({1, 2, NAN, 3})),
                       "ALiBi slope 2 is not finite (nan) (q [1, 4, 3, 8], k [1, 2, 5, 8]");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::distance_table(random_tensor({4, 8}, 4))),
                       "table [4, 8]");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::distance_table(random_tensor({3, 9}, 4))),
                       "h = 4 and n odd");
  // A stride-0 k may have any j: 2 * distance + 1 must not overflow (UBSan)
  // in the message.
  const std::int64_t huge_j = (std::int64_t{1} << 62) + 1;
  float zero = 0.0f;
  const Tensor k_huge =
      Tensor::from_blob(&zero, {1, 2, huge_j, 8}, {0, 0, 0, 0}, DType::kFloat32);
  expect_throw_with<E>(fwd(random_tensor({1, 4, 1, 8}, 1), k_huge, k_huge,
                           AttentionBias::distance_table(random_tensor({4, 9}, 4))),
                       "longest visible distance 4611686018427387904: n >= 2 * "
                       "4611686018427387904 + 1");
  // Centred: non-causal i > j puts row 0 at -1, 5 keys away from key 4.
  expect_throw_with<E>(
      fwd(random_tensor({1, 2, 6, 8}, 1), random_tensor({1, 2, 5, 8}, 2),
          random_tensor({1, 2, 5, 8}, 2), AttentionBias::distance_table(random_tensor({2, 9}, 4))),
      "centre (n - 1) / 2 = 4 and must cover the longest visible distance 5: n >= 11");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::dense_bias(random_tensor({2, 3, 5}, 4))),
                       "[2, 3, 5]");
  expect_throw_with<E>(fwd(q, k, k, AttentionBias::dense_bias(random_tensor({1, 1, 1, 3, 5}, 4))),
                       "[1, 1, 1, 3, 5]");
  expect_throw_with<E>(
      fwd(q, k, k, AttentionBias::dense_bias(random_tensor({3, 5}, 4).to(DType::kFloat16))),
      "float16");
  // Stride-0 views (from_blob) of k, v and the table can claim any length:
  // the kernel's copy of the table is refused before it is sized.
  float one = 1.0f;
  const std::int64_t long_j = std::int64_t{1} << 45;
  const Tensor k_view = Tensor::from_blob(&one, {1, 1, long_j, 1}, {0, 0, 0, 0}, DType::kFloat32);
  const Tensor table_view = Tensor::from_blob(&one, {1, 2 * long_j - 1}, {0, 0}, DType::kFloat32);
  EXPECT_THROW(attention_forward(Tensor::full({1, 1, 1, 1}, 1.0f), k_view, k_view,
                                 AttentionBias::distance_table(table_view)),
               std::length_error);
  // The reference checks the same way.
  EXPECT_THROW(attention_reference(q, k, k, AttentionBias::alibi({1})), E);
}

}  // namespace
}  // namespace posbias
