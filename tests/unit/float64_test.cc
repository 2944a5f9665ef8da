// float64 outside attention (issue 18): ALiBi (alibi_bias, alibi_bias_into,
// alibi_bias_custom_pos, AlibiPositionalBias, AlibiBias::build) and the
// distance-table expansion and reduction take the core's reference path in
// double. Checked against the formulas written here in double (exactly: no
// arithmetic but one product or the sums), against the float32 path to
// float32 rounding, and the dtype refusals that remain.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/distance_table.h"
#include "posbias/slopes.h"

namespace posbias {
namespace {

std::vector<double> values64(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat64);
  const Tensor c = t.contiguous_copy();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

// -slope[h] |k - q| in double for the given positions, zero heads appended.
std::vector<double> naive_alibi(const std::vector<float>& slopes, std::int64_t total,
                                const std::vector<std::int64_t>& qp,
                                const std::vector<std::int64_t>& kp) {
  std::vector<double> out;
  for (std::int64_t h = 0; h < total; ++h) {
    const double s = h < static_cast<std::int64_t>(slopes.size()) ? slopes[h] : 0.0;
    for (std::int64_t q : qp) {
      for (std::int64_t k : kp) out.push_back(-s * static_cast<double>(std::llabs(k - q)) + 0.0);
    }
  }
  return out;
}

std::vector<std::int64_t> range(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> v;
  for (std::int64_t x = lo; x < hi; ++x) v.push_back(x);
  return v;
}

TEST(Float64, AlibiCallsMatchTheDoubleFormula) {
  const std::vector<float> slopes = alibi_slopes(6);
  for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{5, 9}, {9, 5}, {1, 300}, {0, 4}}) {
    const Tensor b = alibi_bias(slopes, 8, i, j, DType::kFloat64);
    ASSERT_EQ(b.shape(), (std::vector<std::int64_t>{8, i, j}));
    const std::vector<double> want = naive_alibi(slopes, 8, range(j - i, j), range(0, j));
    EXPECT_EQ(values64(b), want) << i << "x" << j;
    std::vector<double> into(want.size(), -7.0);
    alibi_bias_into(slopes, 8, i, j, DType::kFloat64, into.data());
    EXPECT_EQ(into, want);
    // float32 path: the same values rounded once.
    const std::vector<float> f32 = alibi_bias(slopes, 8, i, j).to_float_vector();
    for (std::size_t e = 0; e < want.size(); ++e) {
      ASSERT_EQ(f32[e], static_cast<float>(want[e])) << e;
    }
  }
  // A slope float32 cannot multiply exactly at a long distance: double does.
  const Tensor far = alibi_bias({0.1f}, 1, 1, 1 << 20, DType::kFloat64);
  EXPECT_EQ(values64(far)[0], -static_cast<double>(0.1f) * ((1 << 20) - 1));
  const std::vector<std::int64_t> qp = {-3, 7, 100}, kp = {0, 5, -20, 1000};
  EXPECT_EQ(values64(alibi_bias_custom_pos(slopes, 7, qp, kp, DType::kFloat64)),
            naive_alibi(slopes, 7, qp, kp));
}

TEST(Float64, AlibiModulesBuildInDouble) {
  AlibiPositionalBias m(4, 6, DType::kFloat64);
  EXPECT_EQ(m.dtype(), DType::kFloat64);
  EXPECT_EQ(values64(m.forward(3, 5)), naive_alibi(m.slopes(), 6, range(2, 5), range(0, 5)));
  // AlibiBias (the seed's module): slope * (r - c) top-left, clamped at 0 when causal.
  const std::vector<float> s = {0.5f, 0.125f};
  for (bool causal : {false, true}) {
    const Tensor b = AlibiBias(2, causal, s).build(3, 4, DType::kFloat64);
    const std::vector<double> got = values64(b);
    std::size_t e = 0;
    for (int h = 0; h < 2; ++h) {
      for (std::int64_t r = 0; r < 3; ++r) {
        for (std::int64_t c = 0; c < 4; ++c, ++e) {
          const std::int64_t d = causal ? std::max<std::int64_t>(r - c, 0) : std::llabs(r - c);
          EXPECT_EQ(got[e], static_cast<double>(s[h]) * static_cast<double>(d));
        }
      }
    }
  }
}

TEST(Float64, DistanceTableExpandAndReduceInDouble) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const std::int64_t heads = 3, n = 11;
  Tensor table = Tensor::empty({heads, n}, DType::kFloat64);
  for (std::int64_t e = 0; e < heads * n; ++e) table.mutable_data<double>()[e] = u(gen);
  for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{4, 6}, {6, 4}, {1, 6}, {0, 3}}) {
    const std::int64_t centre = (n - 1) / 2;
    const Tensor out = expand_distance_table(table, i, j, DType::kFloat64);
    const std::vector<double> got = values64(out);
    Tensor grad = Tensor::empty({heads, i, j}, DType::kFloat64);
    std::vector<double> want_red(static_cast<std::size_t>(heads * n), 0.0);
    std::size_t e = 0;
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t r = 0; r < i; ++r) {
        for (std::int64_t c = 0; c < j; ++c, ++e) {
          const std::int64_t entry = centre + (j - i + r) - c;
          EXPECT_EQ(got[e], table.data<double>()[h * n + entry]);
          const double g = u(gen);
          grad.mutable_data<double>()[e] = g;
          want_red[static_cast<std::size_t>(h * n + entry)] += g;  // row order, as documented
        }
      }
    }
    const Tensor red = reduce_distance_table(grad, n);
    EXPECT_EQ(values64(red), want_red) << i << "x" << j;
    // float32 table and output from the float64 table: the rounded entries.
    const std::vector<float> f32 = expand_distance_table(table, i, j).to_float_vector();
    for (std::size_t x = 0; x < got.size(); ++x) ASSERT_EQ(f32[x], static_cast<float>(got[x]));
    // The float32 reduction of the same gradient agrees to float32 rounding.
    const std::vector<float> red32 =
        reduce_distance_table(grad.to(DType::kFloat32), n).to_float_vector();
    for (std::size_t x = 0; x < want_red.size(); ++x) {
      EXPECT_NEAR(red32[x], want_red[x], 1e-5) << x;
    }
  }
  // A float32 table expanded to float64: its entries widened exactly.
  const Tensor t32 = table.to(DType::kFloat32);
  const std::vector<double> w = values64(expand_distance_table(t32, 2, 3, DType::kFloat64));
  EXPECT_EQ(w[0], static_cast<double>(t32.data<float>()[5 + 1 - 0]));  // r 0, c 0: centre + 1
}

TEST(Float64, OtherDtypesAreStillRefusedWithTheirNames) {
  try {
    alibi_bias({0.5f}, 1, 2, 2, DType::kInt32);
    FAIL() << "int32 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "dtype int32 is not a float dtype (expected float32, bfloat16, float16 or "
                  "float64)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(expand_distance_table(Tensor::full({1, 3}, 0.0f, DType::kInt32), 1, 1),
               std::invalid_argument);
}

}  // namespace
}  // namespace posbias
