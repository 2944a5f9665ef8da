// The usage examples of zeta's DynamicPositionBias documentation
// (seeds/003), in C++: basic usage (and what module(0, 5) really returns),
// the integration with attention, and inspecting the bias. Built and run
// by the tests; exits non-zero if a value it prints does not hold.
#include <posbias/posbias.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>

int main() {
  int failures = 0;
  const auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::cout << "UNEXPECTED: " << what << "\n";
    }
  };

  // 1. Basic usage. The documentation's "positions 0 to 5": i and j are
  // lengths, so module(0, 5) is 0 queries against 5 keys, an empty tensor.
  posbias::DynamicPositionBias module(/*dim=*/64, /*heads=*/8, /*seed=*/0);
  posbias::Tensor bias = module.forward(0, 5);
  std::cout << "module(0, 5): shape [" << bias.size(0) << ", " << bias.size(1) << ", "
            << bias.size(2) << "], " << bias.numel() << " elements\n";
  expect(bias.shape() == std::vector<std::int64_t>{8, 0, 5}, "module(0, 5) is [8, 0, 5]");
  bias = module.forward(5, 5);  // positions 0..4 against 0..4, what was meant
  std::cout << "module(5, 5), head 0:\n" << posbias::format_tensor(bias.slice(0, 0, 1)) << "\n";

  // 2. Integration with attention: the bias as a distance table read inside
  // the fused kernel, against the same bias materialised ([8, 5, 5]).
  const std::int64_t heads = 8, len = 5, dim = 16;
  posbias::Tensor q = posbias::Tensor::empty({1, heads, len, dim}, posbias::DType::kFloat32);
  float* p = q.mutable_data<float>();
  for (std::int64_t k = 0; k < q.numel(); ++k) p[k] = std::sin(0.37f * static_cast<float>(k));
  posbias::AttentionOptions opt;
  opt.causal = true;
  const posbias::Tensor fused = posbias::attention_forward(
      q, q, q, posbias::AttentionBias::distance_table(module.distance_table(len)), opt);
  const posbias::Tensor dense =
      posbias::attention_forward(q, q, q, posbias::AttentionBias::dense_bias(bias), opt);
  float diff = 0;
  const std::vector<float> a = fused.to_float_vector(), b = dense.to_float_vector();
  for (std::size_t k = 0; k < a.size(); ++k) diff = std::max(diff, std::fabs(a[k] - b[k]));
  std::cout << "attention with the table vs the materialised bias: largest difference " << diff
            << "\n";
  expect(diff <= 1e-5f, "fused == materialised");

  // 3. Inspecting the bias: each head as a row of shades over the distance
  // 0..15 (darkest = smallest), where the documentation used matplotlib;
  // `posbias dpb --dim 64 --heads 8 -i 16 -j 16 --plot dpb.png` draws it.
  const posbias::Tensor table = module.table(16);  // [8, 16]: head by distance
  const std::string shades = " .:-=+*#%@";
  for (std::int64_t h = 0; h < 8; ++h) {
    const std::vector<float> row = table.slice(0, h, h + 1).to_float_vector();
    const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
    std::string line;
    for (float v : row) {
      const float t = *hi > *lo ? (v - *lo) / (*hi - *lo) : 0.5f;
      line += shades[static_cast<std::size_t>(std::lround(t * 9))];
    }
    std::cout << "head " << h << " |" << line << "| " << *lo << " .. " << *hi << "\n";
  }
  // The bias depends only on the distance: row r of module(16, 16) is the
  // table read at |r - c|.
  const posbias::Tensor full = module.forward(16, 16);
  bool toeplitz = true;
  for (std::int64_t h = 0; h < 8; ++h) {
    for (std::int64_t r = 0; r < 16; ++r) {
      for (std::int64_t c = 0; c < 16; ++c) {
        toeplitz = toeplitz && full.at({h, r, c}) == table.at({h, std::llabs(r - c)});
      }
    }
  }
  expect(toeplitz, "bias[h][r][c] == table[h][|r - c|]");
  return failures == 0 ? 0 : 1;
}
