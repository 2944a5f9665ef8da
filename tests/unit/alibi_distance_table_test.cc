// alibi_distance_table against a naive reference, against the bias it stands
// for (expanded, it is alibi_bias; its causal form is AlibiBias's), and its
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/distance_table.h"
#include "posbias/slopes.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;

// Straight from the contract, by another route: the product of a float slope
// and an integer distance below 2^24 is exact in double, so one rounding to
// float gives the correctly rounded float32 product. Distance 0 (and a
// future key of the unsigned form) is +0.0.
std::vector<float> naive_table(const std::vector<float>& slopes, std::int64_t j, bool signed_d) {
  std::vector<float> out;
  for (float m : slopes) {
    for (std::int64_t d = -(j - 1); d <= j - 1; ++d) {  // d = q - c, entry d + j - 1
      const std::int64_t used = signed_d ? (d < 0 ? -d : d) : (d > 0 ? d : 0);
      out.push_back(used == 0
                        ? 0.0f
                        : static_cast<float>(-static_cast<double>(m) * static_cast<double>(used)));
    }
  }
  return out;
}

// Slopes of every kind the table must carry bit for bit: the schedule,
// negative (the seed's), zero of both signs, tiny and huge.
std::vector<std::vector<float>> slope_lists() {
  return {alibi_slopes(1),
          alibi_slopes(3),
          alibi_slopes(8),
          alibi_slopes(12),
          {-0.05f, -0.2f, -0.5f},
          {0.0f, -0.0f, 1.0f},
          {1e-30f, 3e30f, 0.1f, -7.25f}};
}

TEST(AlibiDistanceTable, MatchesNaiveReference) {
  for (const auto& slopes : slope_lists()) {
    for (std::int64_t j : {1, 2, 3, 5, 16, 17, 64, 257, 4099}) {
      for (bool signed_d : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "heads " << slopes.size() << ", j " << j << ", signed " << signed_d);
        const Tensor t = alibi_distance_table(slopes, j, signed_d);
        ASSERT_EQ(t.shape(),
                  (std::vector<std::int64_t>{static_cast<std::int64_t>(slopes.size()), 2 * j - 1}));
        ASSERT_EQ(t.dtype(), DType::kFloat32);
        ASSERT_TRUE(t.is_contiguous());
        expect_bits_equal(t.to_float_vector(), naive_table(slopes, j, signed_d), "table");
      }
    }
  }
}

TEST(AlibiDistanceTable, WorkedExample) {
  const Tensor t = alibi_distance_table({0.5f}, 3);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{-1.0f, -0.5f, 0.0f, -0.5f, -1.0f}));
  const Tensor past = alibi_distance_table({0.5f}, 3, /*signed_distances=*/false);
  EXPECT_EQ(past.to_float_vector(), (std::vector<float>{0.0f, 0.0f, 0.0f, -0.5f, -1.0f}));
  EXPECT_FALSE(std::signbit(past.to_float_vector()[0]));  // a future key is +0.0
}

TEST(AlibiDistanceTable, ExpandedIsTheAlibiBias) {
  for (std::int64_t h : {1, 3, 8, 12}) {
    const std::vector<float> slopes = alibi_slopes(h);
    for (std::int64_t j : {1, 2, 7, 33, 100}) {
      const Tensor table = alibi_distance_table(slopes, j);
      for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, j / 2, j}) {
        for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          SCOPED_TRACE(::testing::Message() << "h " << h << ", i " << i << ", j " << j);
          const std::vector<float> got = expand_distance_table(table, i, j, dt).to_float_vector();
          const std::vector<float> want = alibi_bias(slopes, h, i, j, dt).to_float_vector();
          ASSERT_EQ(got.size(), want.size());
          for (std::size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], want[e]) << e;
        }
      }
    }
  }
}

TEST(AlibiDistanceTable, UnsignedFormExpandedIsTheCausalSeedBias) {
  // For i = j the bottom-right rows are the top-left ones (q_r = r), so the
  // past-keys-only table with slopes m is AlibiBias(causal) with slopes -m.
  const std::vector<float> slopes = {0.25f, 0.5f, 0.0625f};
  const std::vector<float> negated = {-0.25f, -0.5f, -0.0625f};
  for (std::int64_t j : {1, 4, 19}) {
    const Tensor table = alibi_distance_table(slopes, j, /*signed_distances=*/false);
    const std::vector<float> got = expand_distance_table(table, j, j).to_float_vector();
    const std::vector<float> want = AlibiBias(3, true, negated).build(j, j).to_float_vector();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], want[e]) << "j " << j;
  }
}

TEST(AlibiDistanceTable, LongDistancesAreExactIntegers) {
  // 2^23 - 1, the largest distance of j = 2^23, is exact in float32.
  const std::int64_t j = std::int64_t{1} << 23;
  const std::vector<float> t = alibi_distance_table({1.0f}, j).to_float_vector();
  EXPECT_EQ(t.front(), -8388607.0f);
  EXPECT_EQ(t.back(), -8388607.0f);
  EXPECT_EQ(t[static_cast<std::size_t>(j - 1)], 0.0f);
  EXPECT_EQ(t[static_cast<std::size_t>(j)], -1.0f);
}

TEST(AlibiDistanceTable, BadArguments) {
  expect_throw_with<std::invalid_argument>([] { alibi_distance_table({}, 4); },
                                           "alibi_distance_table: need at least one slope, got 0");
  expect_throw_with<std::invalid_argument>([] { alibi_distance_table({0.5f}, 0); },
                                           "alibi_distance_table: j must be >= 1, got 0");
  expect_throw_with<std::invalid_argument>([] { alibi_distance_table({0.5f}, -3, false); },
                                           "j must be >= 1, got -3");
  expect_throw_with<std::invalid_argument>(
      [] {
        alibi_distance_table({0.5f, std::numeric_limits<float>::quiet_NaN()}, 4);
      },
      "alibi_distance_table: slope 1 is not finite (nan)");
  expect_throw_with<std::invalid_argument>(
      [] { alibi_distance_table({std::numeric_limits<float>::infinity()}, 4); },
      "slope 0 is not finite (inf)");
  // 2j - 1 overflows int64; then a table that cannot fit in memory.
  expect_throw_with<std::length_error>(
      [] { alibi_distance_table({0.5f}, std::numeric_limits<std::int64_t>::max()); },
      "2j - 1 overflows int64 for j = 9223372036854775807");
  expect_throw_with<std::length_error>(
      [] { alibi_distance_table(alibi_slopes(64), std::int64_t{1} << 40); },
      "[64, 2199023255551] (float32) needs 562949953421056 bytes");
}

}  // namespace
}  // namespace posbias
