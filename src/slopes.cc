#include "posbias/slopes.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "checks.h"

namespace posbias {
namespace {

// 2^floor(log2 n) for n >= 1, exactly, without floating point.
std::int64_t floor_pow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

void check_heads(const char* what, std::int64_t heads) {
  detail::check_at_least(what, heads, 1);
  detail::check_at_most(what, heads, detail::kMaxHeads);
}

void check_range(std::int64_t total_heads, std::int64_t h0, std::int64_t h1) {
  check_heads("total_heads", total_heads);
  if (h0 < 0 || h1 < h0 || h1 > total_heads) {
    throw std::invalid_argument(
        "head range [" + std::to_string(h0) + ", " + std::to_string(h1) +
        ") must satisfy 0 <= h0 <= h1 <= total_heads = " +
        std::to_string(total_heads));
  }
}

void check_max_bias(float max_bias) {
  if (!std::isfinite(max_bias)) {
    throw std::invalid_argument("max_bias must be finite, got " +
                                std::to_string(max_bias));
  }
}

// Slope of head h of the standard `heads`-head schedule (SPEC: ALiBi slopes).
float standard_slope(std::int64_t heads, std::int64_t h) {
  const std::int64_t c = floor_pow2(heads);
  const double cd = static_cast<double>(c);
  if (h < c) return static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / cd));
  return static_cast<float>(
      std::exp2(-4.0 * static_cast<double>(2 * (h - c) + 1) / cd));
}

// Slope of head h of ggml's max_bias schedule, in float as ggml computes it.
float max_bias_slope(std::int64_t heads, std::int64_t h, float max_bias) {
  if (max_bias <= 0.0f) return 1.0f;
  const auto nl2 = static_cast<float>(floor_pow2(heads));
  const float m0 = std::pow(2.0f, -max_bias / nl2);
  const float m1 = std::pow(2.0f, -(max_bias / 2.0f) / nl2);
  if (static_cast<float>(h) < nl2) return std::pow(m0, static_cast<float>(h + 1));
  return std::pow(m1, static_cast<float>(2 * (h - static_cast<std::int64_t>(nl2)) + 1));
}

}  // namespace

std::vector<float> alibi_slopes(std::int64_t heads) {
  check_heads("heads", heads);
  return alibi_slopes_range(heads, 0, heads);
}

std::vector<float> alibi_slopes_max_bias(std::int64_t heads, float max_bias) {
  check_heads("heads", heads);
  return alibi_slopes_range_max_bias(heads, 0, heads, max_bias);
}

std::vector<float> alibi_slopes_range(std::int64_t total_heads, std::int64_t h0,
                                      std::int64_t h1) {
  check_range(total_heads, h0, h1);
  std::vector<float> slopes;
  slopes.reserve(static_cast<std::size_t>(h1 - h0));
  for (std::int64_t h = h0; h < h1; ++h) slopes.push_back(standard_slope(total_heads, h));
  return slopes;
}

std::vector<float> alibi_slopes_range_max_bias(std::int64_t total_heads,
                                               std::int64_t h0, std::int64_t h1,
                                               float max_bias) {
  check_range(total_heads, h0, h1);
  check_max_bias(max_bias);
  std::vector<float> slopes;
  slopes.reserve(static_cast<std::size_t>(h1 - h0));
  for (std::int64_t h = h0; h < h1; ++h) {
    slopes.push_back(max_bias_slope(total_heads, h, max_bias));
  }
  return slopes;
}

}  // namespace posbias
