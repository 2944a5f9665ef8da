// The "ALiBi" seed (seeds/002): its worked example on a 3x3 score table, and
// its generic AlibiBias(n_heads, causal, slopes) builder, causal and not.
// Built and run by the tests; the printed Step 2 and Step 3 tables are
// compared with the seed's text (examples/alibi_worked_example.expected).
#include <posbias/posbias.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

// A table as the seed prints it: "    T1  T2  T3", then "T1 1.0 2.0 3.0", ...
void print_table(const std::vector<float>& v, int n) {
  std::string header = "   ";
  for (int c = 0; c < n; ++c) header += " T" + std::to_string(c + 1) + " ";
  while (!header.empty() && header.back() == ' ') header.pop_back();
  std::cout << header << "\n";
  for (int r = 0; r < n; ++r) {
    std::cout << "T" << r + 1;
    for (int c = 0; c < n; ++c) {
      const float x = v[static_cast<std::size_t>(r * n + c)];
      char cell[16];
      std::snprintf(cell, sizeof cell, " %.1f", x == 0.0f ? 0.0f : x);  // no "-0.0"
      std::cout << cell;
    }
    std::cout << "\n";
  }
}

}  // namespace

int main() {
  // Step 1: attention scores of 3 tokens.
  const std::vector<float> scores = {1.0f, 2.0f, 3.0f, 2.0f, 1.5f, 2.5f, 3.0f, 2.5f, 1.2f};
  std::cout << "Step 1: scores\n";
  print_table(scores, 3);

  // Step 2: penalties, slope -0.2, absolute distance (the non-causal form).
  posbias::AlibiBias alibi(/*n_heads=*/1, /*causal=*/false, {-0.2f});
  const std::vector<float> bias = alibi.build(3, 3).to_float_vector();  // [1, 1, 3, 3]
  std::cout << "Step 2: penalties\n";
  print_table(bias, 3);

  // Step 3: scores + penalties.
  std::vector<float> sum(9);
  for (std::size_t k = 0; k < 9; ++k) sum[k] = scores[k] + bias[k];
  std::cout << "Step 3: scores + penalties\n";
  print_table(sum, 3);

  // The builder with the seed's default slopes, causal and not.
  posbias::AlibiBias causal(/*n_heads=*/4);  // causal = true, slopes linspace(-0.05, -0.5, 4)
  posbias::AlibiBias both(/*n_heads=*/4, /*causal=*/false);
  const posbias::Tensor c = causal.build(4, 4);  // [1, 4, 4, 4]
  const posbias::Tensor n = both.build(4, 4);
  std::cout << "AlibiBias(4).build(4, 4), head 3 (slope -0.5), causal:\n"
            << posbias::format_tensor(c.slice(1, 3, 4)) << "\n"
            << "non-causal:\n"
            << posbias::format_tensor(n.slice(1, 3, 4)) << "\n";
  // Causal: slope * max(r - c, 0); future keys get 0 (masking is separate).
  const bool ok = c.at({0, 3, 3, 0}) == -1.5f && c.at({0, 3, 0, 3}) == 0.0f &&
                  n.at({0, 3, 0, 3}) == -1.5f && causal.slopes()[0] == -0.05f;
  return ok ? 0 : 1;
}
