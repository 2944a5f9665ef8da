#include "posbias/slopes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace posbias {
namespace {

// The schedule from its definition in the paper's reference code: for a power
// of two n, start = 2^(-8/n) and slope h = start^(h+1); otherwise the
// closest power of two c, then every other slope of the 2c schedule.
std::vector<double> reference_slopes(int n) {
  auto pow2_schedule = [](int m) {
    std::vector<double> s;
    const double start = std::pow(2.0, -8.0 / m);
    for (int h = 0; h < m; ++h) s.push_back(std::pow(start, h + 1));
    return s;
  };
  int c = 1;
  while (c * 2 <= n) c *= 2;
  std::vector<double> s = pow2_schedule(c);
  if (c != n) {
    const std::vector<double> twice = pow2_schedule(2 * c);
    for (int k = 0; static_cast<int>(s.size()) < n; k += 2) s.push_back(twice[k]);
  }
  return s;
}

TEST(Slopes, SpecExamples) {
  const std::vector<float> eight = alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(eight[h], std::ldexp(1.0f, -(h + 1)));
  EXPECT_EQ(alibi_slopes(6), (std::vector<float>{0.25f, 0.0625f, 0.015625f,
                                                 0.00390625f, 0.5f, 0.125f}));
  const std::vector<float> twelve = alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(twelve[h], eight[h]);
  EXPECT_EQ(twelve[8], 0.707106769f);
  EXPECT_EQ(twelve[9], 0.353553385f);
  EXPECT_EQ(twelve[10], 0.176776692f);
  EXPECT_EQ(twelve[11], 0.0883883461f);
  EXPECT_EQ(alibi_slopes(1), std::vector<float>{0.00390625f});
}

TEST(Slopes, MatchReferenceScheduleForManyHeadCounts) {
  // Includes the non-powers of two that broke ports: 12, 20, 40, 48, 96.
  for (int n = 1; n <= 130; ++n) {
    const std::vector<float> got = alibi_slopes(n);
    const std::vector<double> want = reference_slopes(n);
    ASSERT_EQ(got.size(), want.size());
    for (int h = 0; h < n; ++h) {
      EXPECT_NEAR(got[h], want[h], 1e-7 * want[h]) << "n = " << n << ", h = " << h;
      EXPECT_EQ(got[h], static_cast<float>(want[h])) << "n = " << n << ", h = " << h;
    }
  }
}

TEST(Slopes, MaxBiasEightEqualsStandard) {
  for (int n : {1, 2, 3, 5, 8, 12, 16, 20, 32, 40, 48, 64, 96}) {
    const std::vector<float> a = alibi_slopes(n);
    const std::vector<float> b = alibi_slopes_max_bias(n, 8.0f);
    for (int h = 0; h < n; ++h) EXPECT_NEAR(b[h], a[h], 1e-6f * a[h]) << n << " " << h;
  }
}

TEST(Slopes, MaxBiasFormula) {
  // ggml: m0 = 2^(-max_bias / nl2), m1 = 2^(-(max_bias / 2) / nl2).
  const int n = 12;
  const float max_bias = 4.0f;
  const double nl2 = 8.0;
  const std::vector<float> s = alibi_slopes_max_bias(n, max_bias);
  for (int h = 0; h < n; ++h) {
    const double want = h < 8 ? std::pow(std::pow(2.0, -max_bias / nl2), h + 1)
                              : std::pow(std::pow(2.0, -(max_bias / 2) / nl2),
                                         2 * (h - 8) + 1);
    EXPECT_NEAR(s[h], want, 1e-6 * want) << h;
  }
  // ggml uses slope 1 when max_bias <= 0.
  EXPECT_EQ(alibi_slopes_max_bias(5, 0.0f), std::vector<float>(5, 1.0f));
  EXPECT_EQ(alibi_slopes_max_bias(5, -3.0f), std::vector<float>(5, 1.0f));
}

TEST(Slopes, TensorParallelRangeIsASliceOfTheFullSchedule) {
  for (int total : {8, 12, 16, 40}) {
    const std::vector<float> full = alibi_slopes(total);
    for (int h0 = 0; h0 <= total; h0 += 3) {
      for (int h1 = h0; h1 <= total; h1 += 5) {
        const std::vector<float> part = alibi_slopes_range(total, h0, h1);
        EXPECT_EQ(part, std::vector<float>(full.begin() + h0, full.begin() + h1));
      }
    }
    // Never the schedule of h1 - h0 heads.
    EXPECT_NE(alibi_slopes_range(total, total / 2, total), alibi_slopes(total - total / 2));
  }
  const std::vector<float> mb = alibi_slopes_max_bias(12, 6.0f);
  EXPECT_EQ(alibi_slopes_range_max_bias(12, 4, 10, 6.0f),
            std::vector<float>(mb.begin() + 4, mb.begin() + 10));
}

void expect_invalid(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Slopes, BadInputsThrowWithValues) {
  expect_invalid([] { alibi_slopes(0); }, "got 0");
  expect_invalid([] { alibi_slopes(-3); }, "got -3");
  expect_invalid([] { alibi_slopes_max_bias(0, 8.0f); }, "got 0");
  expect_invalid([] { alibi_slopes_max_bias(4, std::nanf("")); }, "max_bias");
  expect_invalid([] { alibi_slopes_max_bias(4, INFINITY); }, "inf");
  expect_invalid([] { alibi_slopes_range(8, 3, 2); }, "[3, 2)");
  expect_invalid([] { alibi_slopes_range(8, 0, 9); }, "total_heads = 8");
  expect_invalid([] { alibi_slopes_range(8, -1, 2); }, "[-1, 2)");
  expect_invalid([] { alibi_slopes_range(0, 0, 0); }, "total_heads");
  expect_invalid([] { alibi_slopes(std::int64_t{1} << 40); }, "1099511627776");
}

}  // namespace
}  // namespace posbias
