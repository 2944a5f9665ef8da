// The README's C++ example: ALiBi for 4 of 8 heads, as in zeta's
// AlibiPositionalBias documentation, then the fused attention with the same
// bias computed inside the kernel. The lines of main() up to the checks are
// the README's, verbatim. Built and run by the tests.
#include <posbias/posbias.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

int main() {
  posbias::AlibiPositionalBias bias_module(/*heads=*/4, /*total_heads=*/8);
  posbias::Tensor bias = bias_module.forward(10, 10);  // [8, 10, 10], heads 4..7 zero
  posbias::Tensor step = bias_module.forward(1, 10);   // decode row: a view of the cache
  std::cout << posbias::format_tensor(bias.slice(0, 0, 1)) << "\n";

  posbias::Tensor q = posbias::Tensor::full({1, 8, 128, 64}, 0.1f);   // [b, h, i, d]
  posbias::Tensor kv = posbias::Tensor::full({1, 8, 128, 64}, 0.2f);  // [b, hk, j, d]
  posbias::AttentionOptions opt;
  opt.causal = true;  // the bias is computed inside the kernel, never stored:
  posbias::Tensor out = posbias::attention_forward(
      q, kv, kv, posbias::AttentionBias::alibi(posbias::alibi_slopes(8)), opt);

  // Checks. The decode row is the last row of the stored bias (the query is
  // the newest token) and shares its storage; heads 4..7 are zero.
  std::cout << posbias::format_tensor(step.slice(0, 0, 1)) << "\n";
  bool ok = step.at({0, 0, 9}) == 0.0f && step.at({0, 0, 0}) == -2.25f &&
            bias.at({0, 0, 9}) == -2.25f && bias.at({5, 3, 7}) == 0.0f &&
            step.shares_storage_with(bias) && bias.shape() == std::vector<std::int64_t>{8, 10, 10};
  // Every value is 0.2 (a weighted mean of equal values), whatever the bias.
  ok = ok && out.shape() == std::vector<std::int64_t>{1, 8, 128, 64};
  for (float x : out.to_float_vector()) ok = ok && std::fabs(x - 0.2f) <= 1e-6f;
  if (!ok) std::cerr << "quickstart: unexpected result\n";
  return ok ? 0 : 1;
}
