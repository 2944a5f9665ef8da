// float32 -> bfloat16 / float16 rounding, checked against references that
// work from the definition (nearest representable value, ties to even)
// rather than from bit tricks.
#include "posbias/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

namespace posbias {
namespace {

// Reference bfloat16 rounding: the two neighbours with 16 zero low bits,
// compared in double.
std::uint16_t reference_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t lower = u & 0xFFFF0000u;
  const std::uint32_t upper = lower + 0x10000u;  // may step to inf: correct
  const double dx = std::fabs(static_cast<double>(x));
  const double dl = std::fabs(static_cast<double>(bits_float(lower)));
  const double du = (upper & 0x7FFFFFFFu) >= 0x7F800000u
                        ? std::ldexp(1.0, 128)  // "next value" past FLT_MAX
                        : std::fabs(static_cast<double>(bits_float(upper)));
  const double below = dx - dl;
  const double above = du - dx;
  if (below < above) return static_cast<std::uint16_t>(lower >> 16);
  if (above < below) return static_cast<std::uint16_t>(upper >> 16);
  return static_cast<std::uint16_t>(((lower >> 16) & 1u) ? (upper >> 16) : (lower >> 16));
}

// All finite non-negative float16 values in increasing order (bits 0..0x7BFF
// are monotonic), as doubles.
const std::vector<double>& half_values() {
  static const std::vector<double> v = [] {
    std::vector<double> out;
    for (std::uint32_t b = 0; b <= 0x7BFFu; ++b) {
      out.push_back(static_cast<double>(to_float(float16{static_cast<std::uint16_t>(b)})));
    }
    return out;
  }();
  return v;
}

// Reference float16 rounding by search: nearest of the two neighbouring
// values, ties to even; 65504 + half an ulp (65520) and above is infinity.
std::uint16_t reference_f16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7C00u;
  const auto& v = half_values();
  const auto it = std::upper_bound(v.begin(), v.end(), a);
  const auto lo = static_cast<std::uint32_t>((it - v.begin()) - 1);
  if (lo == 0x7BFFu) return sign | 0x7BFFu;
  const double below = a - v[lo];
  const double above = v[lo + 1] - a;
  std::uint32_t pick = lo;
  if (above < below || (above == below && (lo & 1u))) pick = lo + 1;
  return static_cast<std::uint16_t>(sign | pick);
}

std::vector<float> interesting_floats() {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, 65519.99f,
                           65520.0f, 65536.0f, -65520.0f, 1e-8f, 5.96e-8f,
                           2.98e-8f, 6.1e-5f, 6.103515625e-05f, 3.0e38f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(), 2048.0f,
                           2049.0f, 2051.0f, 4097.0f, -8191.0f, 0.1f, -0.2f};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int k = 0; k < 200000; ++k) {
    const float f = bits_float(bits(rng));
    if (std::isfinite(f)) xs.push_back(f);
  }
  // Values in float16's range, including every tie between float16 values.
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int k = 0; k < 100000; ++k) xs.push_back(small(rng));
  for (std::uint32_t b = 0; b < 0x7BFFu; b += 7) {
    const double mid = 0.5 * (half_values()[b] + half_values()[b + 1]);
    xs.push_back(static_cast<float>(mid));
  }
  // Integers (distances times slopes are often integers or dyadic).
  for (int d = 0; d < 70000; d += 3) xs.push_back(static_cast<float>(-d));
  return xs;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_EQ(parse_dtype("bf16"), DType::kBFloat16);
  EXPECT_EQ(parse_dtype("half"), DType::kFloat16);
  EXPECT_THROW(parse_dtype("float64"), std::invalid_argument);
  try {
    parse_dtype("int8");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos);
  }
}

TEST(DType, BFloat16RoundsToNearestEven) {
  for (float x : interesting_floats()) {
    ASSERT_EQ(to_bfloat16(x).bits, reference_bf16(x)) << "x = " << x;
  }
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; even is 1.
  EXPECT_EQ(to_float(to_bfloat16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(to_float(to_bfloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
}

TEST(DType, BFloat16RoundTripsAndKeepsNaN) {
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const bfloat16 h{static_cast<std::uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(to_bfloat16(f))));
    } else {
      ASSERT_EQ(to_bfloat16(f).bits, h.bits);
    }
  }
}

TEST(DType, Float16RoundsToNearestEven) {
  for (float x : interesting_floats()) {
    ASSERT_EQ(to_float16(x).bits, reference_f16(x)) << "x = " << x;
  }
  EXPECT_EQ(to_float(to_float16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(to_float(to_float16(65520.0f))));
  EXPECT_EQ(to_float(to_float16(65519.0f)), 65504.0f);
  // Integers are exact up to 2048; 2049 ties to 2048, 2051 to 2052.
  EXPECT_EQ(to_float(to_float16(2049.0f)), 2048.0f);
  EXPECT_EQ(to_float(to_float16(2051.0f)), 2052.0f);
}

TEST(DType, Float16RoundTripsEveryValue) {
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const float16 h{static_cast<std::uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(to_float16(f))));
    } else {
      ASSERT_EQ(to_float16(f).bits, h.bits) << "bits " << b;
    }
  }
}

}  // namespace
}  // namespace posbias
