// The usage examples of zeta's AlibiPositionalBias documentation
// (seeds/000 and 001), in C++. Built and run by the tests: the program
// checks every value it prints against the formula
//   bias[h][r][c] = -slope[h] * |c - (j - i + r)|   (0 for heads 4..7)
// and exits non-zero if one differs.
#include <posbias/posbias.h>

#include <cmath>
#include <cstdint>
#include <iostream>

namespace {

// Every element of `bias` against the formula; returns the number of misses.
int check(const posbias::Tensor& bias, const std::vector<float>& slopes, std::int64_t i,
          std::int64_t j) {
  int misses = 0;
  for (std::int64_t h = 0; h < bias.size(0); ++h) {
    const float m = h < static_cast<std::int64_t>(slopes.size()) ? slopes[h] : 0.0f;
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        const float want = -m * static_cast<float>(std::llabs(c - (j - i + r)));
        if (bias.at({h, r, c}) != want) ++misses;
      }
    }
  }
  return misses;
}

}  // namespace

int main() {
  // Example 1: Initialize and compute bias.
  posbias::AlibiPositionalBias bias_module(/*heads=*/4, /*total_heads=*/8);
  posbias::Tensor bias = bias_module.forward(10, 10);
  std::cout << "Example 1: bias_module(10, 10), shape [8, 10, 10]; head 0:\n"
            << posbias::format_tensor(bias.slice(0, 0, 1)) << "\n";
  int misses = check(bias, bias_module.slopes(), 10, 10);

  // Example 2: Retrieve stored bias (the bottom-right block of the stored one).
  posbias::Tensor stored = bias_module.forward(5, 5);
  std::cout << "Example 2: bias_module(5, 5), a view of the stored bias: "
            << (stored.shares_storage_with(bias) ? "yes" : "no") << "; head 0:\n"
            << posbias::format_tensor(stored.slice(0, 0, 1)) << "\n";
  misses += check(stored, bias_module.slopes(), 5, 5);
  if (!stored.shares_storage_with(bias)) ++misses;

  // Example 3: Computing bias for different dimensions (the last 8 of 15 positions).
  posbias::Tensor wide = bias_module.forward(8, 15);
  std::cout << "Example 3: bias_module(8, 15); head 0:\n"
            << posbias::format_tensor(wide.slice(0, 0, 1)) << "\n";
  misses += check(wide, bias_module.slopes(), 8, 15);
  if (wide.shape() != std::vector<std::int64_t>{8, 8, 15}) ++misses;

  std::cout << (misses == 0 ? "all values match -slope * |c - (j - i + r)|\n" : "MISMATCH\n");
  return misses == 0 ? 0 : 1;
}
