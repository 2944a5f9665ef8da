// DynamicPositionBias as a module: the seed example, parameter names and
// shapes of both variants, initialisation, the state dict (round trip,
// sharing, strict and atomic loads), safetensors files, copies and clones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpb_reference.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::is_norm_param;
using test::is_weight;
using test::randomise_norms;
using test::xt_options;

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

// ------------------------------------------------ construction, parameters

TEST(DynamicPositionBias, SeedExampleModuleZeroToFiveIsEmpty) {
  // The documentation's module(0, 5): lengths, not positions.
  DynamicPositionBias m(64, 8);
  const Tensor b = m.forward(0, 5);
  EXPECT_EQ(b.shape(), (Shape{8, 0, 5}));
  EXPECT_EQ(b.numel(), 0);
  EXPECT_EQ(m.dim(), 64);
  EXPECT_EQ(m.heads(), 8);
  EXPECT_EQ(m.forward(5, 5).shape(), (Shape{8, 5, 5}));
  EXPECT_EQ(m.forward(0, 0).shape(), (Shape{8, 0, 0}));
}

TEST(DynamicPositionBias, ParameterNamesAndShapes) {
  DynamicPositionBias z(64, 8);
  EXPECT_EQ(z.parameter_names(),
            (std::vector<std::string>{"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
                                      "mlp.4.weight", "mlp.4.bias"}));
  EXPECT_EQ(z.parameter("mlp.0.weight").shape(), (Shape{64, 1}));
  EXPECT_EQ(z.parameter("mlp.0.bias").shape(), (Shape{64}));
  EXPECT_EQ(z.parameter("mlp.2.weight").shape(), (Shape{64, 64}));
  EXPECT_EQ(z.parameter("mlp.4.weight").shape(), (Shape{8, 64}));
  EXPECT_EQ(z.parameter("mlp.4.bias").shape(), (Shape{8}));

  DynamicPositionBias x(xt_options(16, 4, 3, true, true));
  EXPECT_EQ(
      x.parameter_names(),
      (std::vector<std::string>{"mlp.0.0.weight", "mlp.0.0.bias", "mlp.0.1.weight", "mlp.0.1.bias",
                                "mlp.1.0.weight", "mlp.1.0.bias", "mlp.1.1.weight", "mlp.1.1.bias",
                                "mlp.2.0.weight", "mlp.2.0.bias", "mlp.2.1.weight", "mlp.2.1.bias",
                                "mlp.3.weight", "mlp.3.bias"}));
  EXPECT_EQ(x.parameter("mlp.0.0.weight").shape(), (Shape{16, 1}));
  EXPECT_EQ(x.parameter("mlp.1.0.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(x.parameter("mlp.3.weight").shape(), (Shape{4, 16}));
  DynamicPositionBias y(xt_options(16, 4, 1, false, false));
  EXPECT_EQ(y.parameter_names(), (std::vector<std::string>{"mlp.0.0.weight", "mlp.0.0.bias",
                                                           "mlp.1.weight", "mlp.1.bias"}));
  try {
    z.parameter("mlp.1.weight");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.1.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mlp.4.bias"), std::string::npos);  // lists known
  }
}

TEST(DynamicPositionBias, InitialisationLikeNnLinear) {
  DynamicPositionBias a(xt_options(64, 8, 2, false, true), 1234);
  for (const std::string& name : a.parameter_names()) {
    const std::vector<float> v = a.parameter(name).to_float_vector();
    if (is_norm_param(name)) {
      for (float x : v) EXPECT_EQ(x, is_weight(name) ? 1.0f : 0.0f);
      continue;
    }
    const std::int64_t fan_in = name.rfind("mlp.0.0", 0) == 0 ? 1 : 64;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    double lo = 1e9, hi = -1e9, mean = 0.0;
    for (float x : v) {
      lo = std::min(lo, static_cast<double>(x));
      hi = std::max(hi, static_cast<double>(x));
      mean += x / static_cast<double>(v.size());
    }
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LE(hi, bound) << name;
    if (v.size() >= 64) {
      // Spread over the whole interval, centred.
      EXPECT_LT(lo, -0.8 * bound) << name;
      EXPECT_GT(hi, 0.8 * bound) << name;
      EXPECT_LT(std::fabs(mean), 0.25 * bound) << name;
    }
  }
  // Deterministic from the seed; another seed differs.
  DynamicPositionBias b(xt_options(64, 8, 2, false, true), 1234);
  DynamicPositionBias c(xt_options(64, 8, 2, false, true), 1235);
  EXPECT_EQ(a.parameter("mlp.1.0.weight").to_float_vector(),
            b.parameter("mlp.1.0.weight").to_float_vector());
  EXPECT_NE(a.parameter("mlp.1.0.weight").to_float_vector(),
            c.parameter("mlp.1.0.weight").to_float_vector());
  // The same seed gives the same numbers on every platform: pin a few.
  DynamicPositionBias z(4, 2, 0);
  const std::vector<float> w0 = z.parameter("mlp.0.weight").to_float_vector();
  std::mt19937_64 rng(0);
  for (float w : w0) {
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
    EXPECT_EQ(w, static_cast<float>(2.0 * u - 1.0));
  }
}

TEST(DynamicPositionBias, StateDictRoundTripAndSharing) {
  DynamicPositionBias a(xt_options(8, 3, 2, true, true), 1);
  DynamicPositionBias b(xt_options(8, 3, 2, true, true), 2);
  randomise_norms(a, 3);
  EXPECT_NE(a.forward(4, 6).to_float_vector(), b.forward(4, 6).to_float_vector());
  const TensorMap sd = a.state_dict();
  EXPECT_EQ(sd.size(), a.parameter_names().size());
  EXPECT_TRUE(sd.at("mlp.0.0.weight").shares_storage_with(a.parameter("mlp.0.0.weight")));
  const TensorMap held = b.state_dict();
  b.load_state_dict(sd);
  EXPECT_EQ(a.forward(4, 6).to_float_vector(), b.forward(4, 6).to_float_vector());
  // Loading copies into b's storage: its earlier handles see the new values
  // and a's parameters stay a's own.
  EXPECT_EQ(held.at("mlp.1.0.weight").to_float_vector(),
            a.parameter("mlp.1.0.weight").to_float_vector());
  EXPECT_FALSE(b.parameter("mlp.1.0.weight").shares_storage_with(a.parameter("mlp.1.0.weight")));
  // Writing through a handle changes the module (an optimiser step).
  b.state_dict().at("mlp.2.bias").mutable_data<float>()[0] += 1.0f;
  const std::vector<float> fa = a.forward(1, 3).to_float_vector();
  const std::vector<float> fb = b.forward(1, 3).to_float_vector();
  EXPECT_NEAR(fb[0] - fa[0], 1.0f, 1e-6);
  // A 16-bit state dict is converted to float32.
  TensorMap half;
  for (const auto& [name, t] : a.state_dict()) half.emplace(name, t.to(DType::kBFloat16));
  b.load_state_dict(half);
  EXPECT_EQ(b.parameter("mlp.0.0.bias").dtype(), DType::kFloat32);
  EXPECT_EQ(b.parameter("mlp.0.0.bias").to_float_vector(),
            a.parameter("mlp.0.0.bias").to(DType::kBFloat16).to_float_vector());
}

std::string load_error(DynamicPositionBias& m, const TensorMap& state) {
  try {
    m.load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(DynamicPositionBias, LoadStateDictIsStrictAndAtomic) {
  DynamicPositionBias m(64, 8, 1);
  const std::vector<float> before = m.forward(3, 4).to_float_vector();
  const TensorMap good = DynamicPositionBias(64, 8, 2).state_dict();
  const auto contains = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  {
    TensorMap s = good;
    s.erase("mlp.4.bias");
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "missing \"mlp.4.bias\"")) << e;
  }
  {
    TensorMap s = good;
    s.emplace("mlp.6.weight", Tensor::full({1}, 0.0f));
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "unexpected \"mlp.6.weight\"")) << e;
  }
  {
    TensorMap s = good;
    s["mlp.0.weight"] = Tensor::full({64}, 0.0f);
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "mlp.0.weight: expected shape [64, 1], got [64]")) << e;
  }
  {
    TensorMap s = good;
    Tensor w = s.at("mlp.2.weight").contiguous_copy();
    w.mutable_data<float>()[3 * 64 + 5] = std::nanf("");
    s["mlp.2.weight"] = w;
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "mlp.2.weight")) << e;
    EXPECT_TRUE(contains(e, "[3, 5]")) << e;
    EXPECT_TRUE(contains(e, "not finite")) << e;
  }
  {
    TensorMap s = good;
    Tensor b = s.at("mlp.4.bias").contiguous_copy();
    b.mutable_data<float>()[7] = INFINITY;
    s["mlp.4.bias"] = b;
    EXPECT_TRUE(contains(load_error(m, s), "mlp.4.bias: element [7] is not finite (inf)"))
        << load_error(m, s);
  }
  {
    // An x-transformers state dict is not a zeta one.
    const std::string e =
        load_error(m, DynamicPositionBias(xt_options(64, 8, 2, false, false)).state_dict());
    EXPECT_TRUE(contains(e, "missing \"mlp.0.weight\"")) << e;
    EXPECT_TRUE(contains(e, "unexpected \"mlp.0.0.bias\"")) << e;
  }
  // Nothing changed by any failed load (a good tensor before the bad one
  // included).
  EXPECT_EQ(m.forward(3, 4).to_float_vector(), before);
  EXPECT_TRUE(load_error(m, good).empty());
  EXPECT_NE(m.forward(3, 4).to_float_vector(), before);
}

TEST(DynamicPositionBias, ReplacedParameterOfWrongShapeIsReported) {
  DynamicPositionBias m(8, 2);
  m.mutable_parameter("mlp.2.weight") = Tensor::full({8}, 0.0f);
  try {
    m.forward(2, 2);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.2.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[8, 8]"), std::string::npos) << e.what();
  }
  // load_state_dict repairs it.
  m.load_state_dict(DynamicPositionBias(8, 2).state_dict());
  EXPECT_NO_THROW(m.forward(2, 2));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "posbias_dpb_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

TEST(DynamicPositionBias, SaveAndLoadSafetensors) {
  TempDir dir;
  DynamicPositionBias a(xt_options(8, 3, 2, true, true), 9);
  randomise_norms(a, 1);
  a.save(dir.file("dpb.safetensors"));
  // The file holds the state dict under its names, float32.
  const TensorMap raw = load_safetensors(dir.file("dpb.safetensors"));
  ASSERT_EQ(raw.size(), a.parameter_names().size());
  for (const std::string& name : a.parameter_names()) {
    ASSERT_EQ(raw.at(name).dtype(), DType::kFloat32);
    EXPECT_EQ(raw.at(name).to_float_vector(), a.parameter(name).to_float_vector()) << name;
  }
  DynamicPositionBias b(xt_options(8, 3, 2, true, true), 10);
  b.load(dir.file("dpb.safetensors"));
  EXPECT_EQ(a.forward(5, 7).to_float_vector(), b.forward(5, 7).to_float_vector());
  // A file of another module: the error names the file and the problem.
  DynamicPositionBias(8, 3).save(dir.file("zeta.safetensors"));
  try {
    b.load(dir.file("zeta.safetensors"));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zeta.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.forward(5, 7).to_float_vector(), b.forward(5, 7).to_float_vector());
  // Non-finite weights in a file.
  TensorMap bad = a.state_dict();
  Tensor w = bad.at("mlp.1.0.weight").contiguous_copy();
  w.mutable_data<float>()[0] = NAN;
  bad["mlp.1.0.weight"] = w;
  save_safetensors(dir.file("nan.safetensors"), bad);
  try {
    b.load(dir.file("nan.safetensors"));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.1.0.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.load(dir.file("absent.safetensors")), std::runtime_error);
}

TEST(DynamicPositionBias, CopiesShareParametersAndCloneDoesNot) {
  DynamicPositionBias a(4, 2, /*seed=*/1);
  DynamicPositionBias shared = a;
  DynamicPositionBias deep = a.clone();
  const std::vector<float> before = a.forward(3, 5).to_float_vector();
  EXPECT_EQ(deep.forward(3, 5).to_float_vector(), before);
  a.mutable_parameter("mlp.4.bias").mutable_data<float>()[0] += 1.0f;
  EXPECT_EQ(shared.forward(3, 5).to_float_vector(), a.forward(3, 5).to_float_vector());
  EXPECT_EQ(deep.forward(3, 5).to_float_vector(), before);
  EXPECT_NE(a.forward(3, 5).to_float_vector(), before);
}

}  // namespace
}  // namespace posbias
