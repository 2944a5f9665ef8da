// The softmax's exp (src/kernels/attention_exp-inl.h) on every instruction
// set Highway compiled: within 2 ulp of the double exp over its range, the
// flushes below -40, and what it makes of -inf and NaN; and the soft-cap's
// tanh built on it.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_fused.h"

namespace posbias {
namespace {

using detail::SoftmaxExpKind;

std::vector<float> Exp(SoftmaxExpKind kind, const std::vector<float>& x) {
  std::vector<float> out(x.size(), -1.0f);
  detail::softmax_exp(kind, x.data(), out.data(), static_cast<std::int64_t>(x.size()));
  return out;
}

// Distance in ulps between a float result and the double value (in units
// of the float spacing at the value).
double Ulps(float got, double want) {
  const int exponent = std::ilogb(static_cast<float>(want));
  const double ulp = std::ldexp(1.0, std::max(exponent, -126) - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// x from lo to hi (lo < hi <= 0) in 200001 even steps, and -2^-k for k up
// to 40 (arguments next to 0).
std::vector<float> Sweep(float lo, float hi) {
  std::vector<float> x;
  constexpr int kSteps = 200000;
  for (int c = 0; c <= kSteps; ++c) {
    x.push_back(lo + (hi - lo) * static_cast<float>(c) / static_cast<float>(kSteps));
  }
  for (int k = 1; k <= 40; ++k) x.push_back(-std::ldexp(1.0f, -k));
  return x;
}

TEST(AttentionExp, WithinTwoUlpOverItsRangeOnEveryTarget) {
  const std::vector<float> neg = Sweep(-40.0f, 0.0f);
  std::vector<float> all = neg;
  for (float v = 0.0f; v <= 88.0f; v += 0.0021f) all.push_back(v);
  all.push_back(88.0f);
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const SoftmaxExpKind kind :
         {SoftmaxExpKind::kUnclamped, SoftmaxExpKind::kFlushed, SoftmaxExpKind::kSafe}) {
      const std::vector<float>& x = all;
      const std::vector<float> y = Exp(kind, x);
      double worst = 0.0, sum = 0.0;
      float worst_x = 0.0f;
      for (std::size_t c = 0; c < x.size(); ++c) {
        const double u = Ulps(y[c], std::exp(static_cast<double>(x[c])));
        sum += u;
        if (u > worst) worst = u, worst_x = x[c];
      }
      EXPECT_LE(worst, 2.0) << "kind " << static_cast<int>(kind) << " at x = " << worst_x;
      EXPECT_LE(sum / static_cast<double>(x.size()), 0.5) << "kind " << static_cast<int>(kind);
      // exp(0) is exactly 1: every softmax row's maximum term.
      EXPECT_EQ(Exp(kind, {0.0f, -0.0f}), (std::vector<float>{1.0f, 1.0f}));
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(AttentionExp, FlushesBelowMinusFortyAndKeepsNaNWhereItShould) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> low = {-40.01f, -41.0f, -87.0f, -88.5f, -104.0f, -1000.0f, -1e30f, -inf};
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const SoftmaxExpKind kind :
         {SoftmaxExpKind::kUnclamped, SoftmaxExpKind::kFlushed, SoftmaxExpKind::kSafe}) {
      for (const float y : Exp(kind, low)) EXPECT_EQ(y, 0.0f) << "kind " << static_cast<int>(kind);
      // Just above the flush: e^-40 = 4.25e-18, a normal float.
      EXPECT_NEAR(Exp(kind, {-40.0f})[0], 4.248354e-18f, 1e-23f);
    }
    // NaN: carried through by the unclamped and safe forms (a NaN score
    // must poison its row), flushed to 0 by ExpFlushed.
    EXPECT_TRUE(std::isnan(Exp(SoftmaxExpKind::kUnclamped, {nan})[0]));
    EXPECT_TRUE(std::isnan(Exp(SoftmaxExpKind::kSafe, {nan})[0]));
    EXPECT_EQ(Exp(SoftmaxExpKind::kFlushed, {nan})[0], 0.0f);
    // Above 88 the flushed forms clamp (a softmax argument never is).
    EXPECT_EQ(Exp(SoftmaxExpKind::kFlushed, {100.0f})[0], Exp(SoftmaxExpKind::kFlushed, {88.0f})[0]);
    EXPECT_TRUE(std::isfinite(Exp(SoftmaxExpKind::kSafe, {inf})[0]));
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The soft-cap's tanh: within 1.5e-7 of the double tanh (absolute; the
// score is cap times it) from 0 to 30 either side, odd, exactly +-1 far out
// and at +-inf, NaN kept, and relatively close where it matters least
// (tiny x gives tiny scores: 1e-7 of them is far below a score's ulp at 1).
TEST(AttentionExp, SoftcapTanhWithinAbsoluteBoundOnEveryTarget) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x;
  for (int c = -300000; c <= 300000; ++c) x.push_back(static_cast<float>(c) * 1e-4f);
  for (int k = 1; k <= 40; ++k) {
    x.push_back(std::ldexp(1.0f, -k));
    x.push_back(-std::ldexp(1.0f, -k));
  }
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const std::vector<float> y = Exp(SoftmaxExpKind::kSoftcapTanh, x);
    double worst = 0.0;
    float worst_x = 0.0f;
    for (std::size_t c = 0; c < x.size(); ++c) {
      const double err =
          std::fabs(static_cast<double>(y[c]) - std::tanh(static_cast<double>(x[c])));
      if (err > worst) worst = err, worst_x = x[c];
      ASSERT_EQ(std::signbit(y[c]), std::signbit(x[c])) << "x = " << x[c];
      ASSERT_LE(std::fabs(y[c]), 1.0f) << "x = " << x[c];
    }
    EXPECT_LE(worst, 1.5e-7) << "at x = " << worst_x;
    const std::vector<float> ends =
        Exp(SoftmaxExpKind::kSoftcapTanh, {20.0f, -25.0f, 1e30f, inf, -inf});
    EXPECT_EQ(ends, (std::vector<float>{1.0f, -1.0f, 1.0f, 1.0f, -1.0f}));
    EXPECT_TRUE(std::isnan(Exp(SoftmaxExpKind::kSoftcapTanh, {nan})[0]));
    EXPECT_EQ(Exp(SoftmaxExpKind::kSoftcapTanh, {0.0f})[0], 0.0f);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace posbias
