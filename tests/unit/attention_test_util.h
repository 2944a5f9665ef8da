// Shared by the attention forward tests: random inputs and the element-wise
// tolerance check.
#ifndef POSBIAS_TESTS_UNIT_ATTENTION_TEST_UTIL_H_
#define POSBIAS_TESTS_UNIT_ATTENTION_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "posbias/tensor.h"

namespace posbias::test {

using Shape = std::vector<std::int64_t>;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// The best instruction set of each vector width that Highway compiled and
// this CPU has (AVX-512, AVX2, 128-bit): their tiles and softmax paths
// differ; the same width's targets share them.
inline std::vector<std::int64_t> TargetsByWidth() {
  std::vector<std::int64_t> out;
  std::vector<std::string> widths;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const std::string name = hwy::TargetName(target);
    const std::string width = name.rfind("AVX3", 0) == 0 ? "512" : name == "AVX2" ? "256" : "128";
    if (std::find(widths.begin(), widths.end(), width) != widths.end()) continue;
    widths.push_back(width);
    out.push_back(target);
  }
  return out;
}

// Whether a call must skip some flushed block (the forward's tiles, the
// backward's blocks), must not, or may.
enum class Skip : std::uint8_t { kMust, kMustNot, kMay };

// The flushed skips' switch, POSBIAS_FLUSHED_TILES (read at each call): on
// (unset, the default) or off ("0").
inline void set_flushed_skip(bool on) {
  if (on) {
    unsetenv("POSBIAS_FLUSHED_TILES");
  } else {
    setenv("POSBIAS_FLUSHED_TILES", "0", 1);
  }
}

// A call with and without the flushed skips on each of TargetsByWidth():
// run() makes the call and returns what it computed, with `skipped`, how
// many blocks it skipped (the kernel's counter, read around the call);
// same(on, off) compares the two runs' results. With the skip off nothing
// may be skipped; with it on, `skip` says whether something must be.
template <class RunFn, class SameFn>
void expect_skip_keeps_bits(const std::string& what, Skip skip, const RunFn& run,
                            const SameFn& same) {
  SCOPED_TRACE(what);
  for (const std::int64_t target : TargetsByWidth()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    set_flushed_skip(true);
    const auto on = run();
    set_flushed_skip(false);
    const auto off = run();
    set_flushed_skip(true);
    hwy::SetSupportedTargetsForTest(0);
    EXPECT_EQ(off.skipped, 0);
    if (skip == Skip::kMust) {
      EXPECT_GT(on.skipped, 0);
    } else if (skip == Skip::kMustNot) {
      EXPECT_EQ(on.skipped, 0);
    }
    same(on, off);
  }
}

inline Tensor random_tensor(const Shape& shape, std::uint32_t seed, float lo = -1.0f,
                            float hi = 1.0f) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(shape, v);
}

// [b, h, len, d] data stored as [b, len, h, d] (a transposed view).
inline Tensor random_bhld_strided(const Shape& shape, std::uint32_t seed) {
  return random_tensor({shape[0], shape[2], shape[1], shape[3]}, seed).transpose(1, 2);
}

// |got - want| <= atol + rtol |want|, NaN only where want is NaN.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         const std::string& what, double atol, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double a = got[k];
    const double b = want[k];
    if (std::isnan(b) ? !std::isnan(a) : !(std::fabs(a - b) <= atol + rtol * std::fabs(b))) {
      FAIL() << what << ": element " << k << " is " << a << ", expected " << b;
    }
  }
}

}  // namespace posbias::test

#endif  // POSBIAS_TESTS_UNIT_ATTENTION_TEST_UTIL_H_
