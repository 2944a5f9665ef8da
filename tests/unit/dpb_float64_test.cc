// The float64 references of the module tables (dpb.h: dpb_distance_table_f64
// and its backward; t5.h: t5_distance_table_f64 and its backward): values
// against the tests' own double MLP (dpb_reference.h) and the naive bucket
// gather, gradients against that MLP's backward and against central finite
// differences of the core's forward, strided inputs, thread-count
// independence and every refusal.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpb_reference.h"
#include "posbias/dpb.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::RefMlp;

Tensor f64_from(const std::vector<std::int64_t>& shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  double* p = t.mutable_data<double>();
  for (std::size_t k = 0; k < v.size(); ++k) p[k] = v[k];
  return t;
}

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.is_contiguous() ? t : t.contiguous_copy();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

// The module's float32 parameters as float64 tensors (exact), by name.
TensorMap f64_params(const DynamicPositionBias& m) {
  TensorMap out;
  for (const std::string& name : m.parameter_names()) {
    const Tensor& p = m.parameter(name);
    const std::vector<float> f = p.to_float_vector();
    out[name] = f64_from(p.shape(), std::vector<double>(f.begin(), f.end()));
  }
  return out;
}

std::vector<double> random_doubles(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0;
  return v;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// sum(table * g) of the core's float64 forward.
double loss(const DpbOptions& o, const TensorMap& p, std::int64_t j, const std::vector<double>& g) {
  const std::vector<double> t = values(dpb_distance_table_f64(o, p, j));
  double s = 0.0;
  for (std::size_t k = 0; k < t.size(); ++k) s += t[k] * g[k];
  return s;
}

class DpbFloat64 : public ::testing::TestWithParam<int> {};

TEST_P(DpbFloat64, TableMatchesTheDoubleMlp) {
  const DpbOptions o = test::variants(6, 3)[static_cast<std::size_t>(GetParam())];
  DynamicPositionBias m(o, 11);
  test::randomise_norms(m, 5);
  RefMlp ref(m);
  ref.set_double_inputs();
  const TensorMap p = f64_params(m);
  for (std::int64_t j : {1, 2, 5, 17, 300}) {
    const Tensor t = dpb_distance_table_f64(o, p, j);
    ASSERT_EQ(t.dtype(), DType::kFloat64);
    ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{3, 2 * j - 1}));
    const std::vector<double> got = values(t);
    const double scale = max_abs(got);
    for (std::int64_t e = 0; e < 2 * j - 1; ++e) {
      const std::vector<double> want = ref.forward(ref.input(e - (j - 1)));
      for (std::int64_t h = 0; h < 3; ++h) {
        ASSERT_NEAR(got[static_cast<std::size_t>(h * (2 * j - 1) + e)], want[h], 1e-13 * scale)
            << test::describe(o) << " j " << j << " entry " << e << " head " << h;
      }
    }
    // The float32 module agrees to float32's precision.
    const std::vector<float> f = m.distance_table(j).to_float_vector();
    for (std::size_t k = 0; k < f.size(); ++k) {
      ASSERT_NEAR(f[k], got[k], 1e-4 * scale + 1e-6) << test::describe(o) << " j " << j;
    }
  }
}

TEST_P(DpbFloat64, BackwardMatchesTheDoubleMlpAndFiniteDifferences) {
  const DpbOptions o = test::variants(5, 2)[static_cast<std::size_t>(GetParam())];
  DynamicPositionBias m(o, 3);
  test::randomise_norms(m, 9);
  RefMlp ref(m);
  ref.set_double_inputs();
  const TensorMap p = f64_params(m);
  for (std::int64_t j : {1, 4, 9}) {
    const std::int64_t len = 2 * j - 1;
    const std::vector<double> g = random_doubles(static_cast<std::size_t>(2 * len), 17 + j);
    const TensorMap got = dpb_backward_distance_table_f64(o, p, j, f64_from({2, len}, g));
    ASSERT_EQ(got.size(), m.parameter_names().size());
    std::map<std::string, std::vector<double>> want;
    for (std::int64_t e = 0; e < len; ++e) {
      const std::vector<double> gy = {g[static_cast<std::size_t>(e)],
                                      g[static_cast<std::size_t>(len + e)]};
      ref.backward(ref.input(e - (j - 1)), gy, want);
    }
    for (const std::string& name : m.parameter_names()) {
      const Tensor& t = got.at(name);
      ASSERT_EQ(t.dtype(), DType::kFloat64) << name;
      ASSERT_EQ(t.shape(), m.parameter(name).shape()) << name;
      const std::vector<double> gv = values(t);
      const std::vector<double>& wv = want.at(name);
      const double scale = max_abs(wv) + 1e-300;
      for (std::size_t k = 0; k < gv.size(); ++k) {
        ASSERT_NEAR(gv[k], wv[k], 1e-12 * scale)
            << test::describe(o) << " " << name << "[" << k << "] j " << j;
      }
      // Central differences of the core's forward at two entries.
      for (std::size_t k : {std::size_t{0}, gv.size() - 1}) {
        TensorMap q = p;
        std::vector<double> pv = values(p.at(name));
        const double h = 1e-6 * std::max(1.0, std::fabs(pv[k]));
        pv[k] += h;
        q[name] = f64_from(p.at(name).shape(), pv);
        const double up = loss(o, q, j, g);
        pv[k] -= 2 * h;
        q[name] = f64_from(p.at(name).shape(), pv);
        const double down = loss(o, q, j, g);
        EXPECT_NEAR((up - down) / (2 * h), gv[k], 1e-6 * (1.0 + std::fabs(gv[k])))
            << test::describe(o) << " " << name << "[" << k << "] j " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, DpbFloat64,
                         ::testing::Range(0, static_cast<int>(test::variants(4, 2).size())));

TEST(DpbFloat64Strides, StridedParametersAndGradientGiveTheSameResults) {
  const DpbOptions o = test::xt_options(4, 3, 2, true, true);
  DynamicPositionBias m(o, 2);
  test::randomise_norms(m, 1);
  const TensorMap p = f64_params(m);
  TensorMap strided;
  for (const auto& [name, t] : p) {
    if (t.dim() == 2 && t.size(0) == t.size(1)) {
      // The transpose of a tensor holding the transposed values.
      const Tensor tt = t.transpose(0, 1).contiguous_copy().transpose(0, 1);
      ASSERT_FALSE(tt.is_contiguous());
      strided[name] = tt;
    } else {
      strided[name] = t;
    }
  }
  const std::int64_t j = 6;
  EXPECT_EQ(values(dpb_distance_table_f64(o, strided, j)), values(dpb_distance_table_f64(o, p, j)));
  const std::vector<double> g = random_doubles(3 * 11, 4);
  const Tensor gt = f64_from({11, 3}, g).transpose(0, 1);  // [3, 11], strided
  const Tensor gc = gt.contiguous_copy();
  const TensorMap a = dpb_backward_distance_table_f64(o, strided, j, gt);
  const TensorMap b = dpb_backward_distance_table_f64(o, p, j, gc);
  for (const auto& [name, t] : a) EXPECT_EQ(values(t), values(b.at(name))) << name;
}

TEST(DpbFloat64Threads, ForwardDoesNotDependOnTheThreadCount) {
  const DpbOptions o = test::xt_options(32, 4, 2, false, true);
  DynamicPositionBias m(o, 8);
  const TensorMap p = f64_params(m);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<double> one = values(dpb_distance_table_f64(o, p, 700));
  omp_set_num_threads(std::max(2, before));
  const std::vector<double> two = values(dpb_distance_table_f64(o, p, 700));
  omp_set_num_threads(before);
  EXPECT_EQ(one, two);
}

TEST(DpbFloat64Errors, RefusesBadArgumentsWithTheirValues) {
  using E = std::invalid_argument;
  const DpbOptions o = test::xt_options(4, 2, 1, false, false);
  DynamicPositionBias m(o, 0);
  const TensorMap p = f64_params(m);
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, p, 0); }, "j must be >= 1, got 0");
  TensorMap missing = p;
  missing.erase("mlp.1.bias");
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, missing, 3); },
                             "missing parameter \"mlp.1.bias\"");
  TensorMap extra = p;
  extra["mlp.9.weight"] = f64_from({1}, {0.0});
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, extra, 3); },
                             "unexpected parameter \"mlp.9.weight\"");
  TensorMap f32 = p;
  f32["mlp.0.0.weight"] = m.parameter("mlp.0.0.weight");
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, f32, 3); },
                             "\"mlp.0.0.weight\" must be float64 [4, 1], got float32 [4, 1]");
  TensorMap shape = p;
  shape["mlp.1.weight"] = f64_from({3, 4}, std::vector<double>(12, 0.0));
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, shape, 3); },
                             "must be float64 [2, 4], got float64 [3, 4]");
  TensorMap nan = p;
  nan["mlp.1.bias"] = f64_from({2}, {0.0, NAN});
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(o, nan, 3); },
                             "\"mlp.1.bias\" has a non-finite value at flat index 1");
  DpbOptions zeta_norm;
  zeta_norm.dim = 4;
  zeta_norm.heads = 2;
  zeta_norm.norm = true;
  test::expect_throw_with<E>([&] { dpb_distance_table_f64(zeta_norm, p, 3); },
                             "the zeta variant has depth 2");
  test::expect_throw_with<E>(
      [&] {
        dpb_backward_distance_table_f64(o, p, 3, f64_from({2, 4}, std::vector<double>(8)));
      },
      "grad must be float64 [2, 5] ([heads, 2j - 1] for j = 3), got float64 [2, 4]");
  test::expect_throw_with<E>(
      [&] {
        dpb_backward_distance_table_f64(o, p, 3, Tensor::full({2, 5}, 0.0f));
      },
      "got float32 [2, 5]");
  EXPECT_THROW(dpb_distance_table_f64(o, p, std::int64_t{1} << 62), std::length_error);
}

// ------------------------------------------------------------------- T5

TEST(T5Float64, TableAndBackwardMatchTheNaiveGatherAndScatter) {
  for (bool causal : {false, true}) {
    const std::int64_t nb = 8, md = 20, heads = 3;
    const std::vector<double> w = random_doubles(static_cast<std::size_t>(nb * heads), 2);
    const Tensor e = f64_from({nb, heads}, w);
    const double scale = 0.1;  // not a float: the reference keeps it in double
    for (std::int64_t j : {1, 3, 40}) {
      const std::int64_t len = 2 * j - 1;
      const std::vector<double> t = values(t5_distance_table_f64(e, scale, causal, nb, md, j));
      std::vector<double> g = random_doubles(static_cast<std::size_t>(heads * len), 5 + j);
      std::vector<double> want_g(static_cast<std::size_t>(nb * heads), 0.0);
      for (std::int64_t k = 0; k < len; ++k) {
        const std::int64_t b = t5_relative_position_bucket((j - 1) - k, causal, nb, md);
        for (std::int64_t h = 0; h < heads; ++h) {
          ASSERT_EQ(t[static_cast<std::size_t>(h * len + k)],
                    w[static_cast<std::size_t>(b * heads + h)] * scale);
          want_g[static_cast<std::size_t>(b * heads + h)] +=
              g[static_cast<std::size_t>(h * len + k)];
        }
      }
      const std::vector<double> got = values(
          t5_backward_distance_table_f64(f64_from({heads, len}, g), scale, causal, nb, md, j));
      for (std::size_t k = 0; k < got.size(); ++k) {
        ASSERT_NEAR(got[k], want_g[k] * scale, 1e-15) << "causal " << causal << " j " << j;
      }
    }
  }
}

TEST(T5Float64, RefusesBadArgumentsWithTheirValues) {
  using E = std::invalid_argument;
  const Tensor e = f64_from({8, 2}, std::vector<double>(16, 0.5));
  test::expect_throw_with<E>([&] { t5_distance_table_f64(e, 1.0, false, 8, 20, 0); },
                             "j must be >= 1, got 0");
  test::expect_throw_with<E>([&] { t5_distance_table_f64(e, NAN, false, 8, 20, 3); },
                             "scale must be finite, got nan");
  test::expect_throw_with<E>([&] { t5_distance_table_f64(e, 1.0, false, 2, 20, 3); },
                             "num_buckets must be >= 4");
  test::expect_throw_with<E>([&] { t5_distance_table_f64(e, 1.0, false, 8, 2, 3); },
                             "max_distance must be > max_exact = 2");
  test::expect_throw_with<E>(
      [&] { t5_distance_table_f64(e, 1.0, false, 6, 20, 3); },
      "embedding must be float64 [num_buckets = 6, heads >= 1], got float64 [8, 2]");
  test::expect_throw_with<E>(
      [&] {
        t5_distance_table_f64(Tensor::full({8, 2}, 1.0f), 1.0, false, 8, 20, 3);
      },
      "got float32 [8, 2]");
  std::vector<double> bad(16, 0.5);
  bad[5] = INFINITY;
  test::expect_throw_with<E>(
      [&] {
        t5_distance_table_f64(f64_from({8, 2}, bad), 1.0, false, 8, 20, 3);
      },
      "non-finite value at [2, 1]");
  test::expect_throw_with<E>(
      [&] {
        t5_backward_distance_table_f64(f64_from({2, 4}, std::vector<double>(8)), 1.0, false, 8, 20,
                                       3);
      },
      "grad must be float64 [heads, 2j - 1 = 5] for j = 3, got float64 [2, 4]");
}

}  // namespace
}  // namespace posbias
