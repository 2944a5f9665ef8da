// The README's C++ example: ALiBi for 4 of 8 heads, as in zeta's
// AlibiPositionalBias documentation. Built and run by the tests.
#include <posbias/posbias.h>

#include <iostream>

int main() {
  posbias::AlibiPositionalBias bias_module(/*heads=*/4, /*total_heads=*/8);
  posbias::Tensor bias = bias_module.forward(/*i=*/10, /*j=*/10);  // [8, 10, 10]
  posbias::Tensor step = bias_module.forward(1, 10);  // a decode row: a view of the cache
  std::cout << posbias::format_tensor(bias.slice(0, 0, 1)) << "\n";
  std::cout << posbias::format_tensor(step.slice(0, 0, 1)) << "\n";
  // The decode row is the last row of the stored bias: the query is the newest token.
  return step.at({0, 0, 9}) == 0.0f && bias.at({0, 0, 9}) == -2.25f ? 0 : 1;
}
