#include "demo.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

namespace posbias::cli {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::string list_text(const std::vector<float>& values) {
  std::string s = "[";
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (k) s += ", ";
    s += format_float_roundtrip(values[k]);
  }
  return s + "]";
}

// Head h of a [heads, i, j] bias as a 2-D [i, j] tensor, for printing.
Tensor head(const Tensor& bias, std::int64_t h) {
  return Tensor::from_vector({bias.size(1), bias.size(2)},
                             bias.slice(0, h, h + 1).to_float_vector());
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_float_vector() == b.to_float_vector();
}

bool all_zero(const Tensor& t) {
  for (float v : t.to_float_vector()) {
    if (v != 0.0f) return false;
  }
  return true;
}

// Prints the demo and checks each claim it makes.
class Demo {
 public:
  explicit Demo(std::ostream& out) : out_(out) {}

  int run() {
    out_ << "posbias " << version() << ": positional biases, the documentation's examples.\n\n";
    documentation_examples();
    seed_example();
    dpb_examples();
    if (failures_ == 0) {
      out_ << "Every statement above was checked while printing it.\n";
      return 0;
    }
    out_ << failures_ << " statement(s) above did not hold (UNEXPECTED).\n";
    return 1;
  }

 private:
  void say(const std::string& text) { out_ << text << "\n"; }

  void show(const Tensor& t) { out_ << format_tensor(t) << "\n"; }

  // A statement the text makes: printed when it holds, flagged if not.
  void check(bool holds, const std::string& what) {
    if (!holds) {
      ++failures_;
      out_ << "UNEXPECTED: " << what << " does not hold\n";
    }
  }

  void documentation_examples() {
    const std::int64_t heads = 4;
    const std::int64_t total_heads = 8;
    const AlibiPositionalBias bias_module(heads, total_heads);
    const std::vector<float> slopes = bias_module.slopes();

    say("== AlibiPositionalBias(heads=4, total_heads=8) ==");
    say("bias_module = AlibiPositionalBias(heads=4, total_heads=8)");
    say("  Heads 0..3 get the ALiBi slopes of 4 heads,");
    say("  " + list_text(slopes) + "; heads 4..7 get no bias (the");
    say("  total_heads - heads zero heads come last).");
    say("  bias[h][r][c] = -slope[h] * |c - q_r|, where the query of row r sits at");
    say("  key position q_r = j - i + r: the queries are the LAST i of the j keys.");
    check(slopes == alibi_slopes(4), "slopes == alibi_slopes(4)");
    say("");

    // Example 1.
    say("Example 1: bias = bias_module(10, 10)");
    const Tensor bias1 = bias_module.forward(10, 10);
    say("  Shape " + shape_text(bias1.shape()) +
        " = [total_heads, i, j]. With i == j, q_r = r: 0 on the");
    say("  diagonal, -slope * distance in both directions. Head 0 (slope 0.25):");
    show(head(bias1, 0));
    check(bias1.shape() == std::vector<std::int64_t>{8, 10, 10}, "shape [8, 10, 10]");
    check(bias1.at({0, 0, 9}) == -2.25f && bias1.at({0, 9, 0}) == -2.25f &&
              bias1.at({0, 4, 4}) == 0.0f,
          "head 0 values");
    check(all_zero(bias1.slice(0, heads, total_heads)), "heads 4..7 all zero");
    say("  Heads 4..7 are all zero. The module now stores this bias:");
    say("  cached_shape() = " + shape_text(bias_module.cached_shape()) + ".");
    check(bias_module.cached_shape() == bias1.shape(), "cached_shape() after example 1");
    say("");

    // Example 2.
    say("Example 2: bias = bias_module(5, 5)   (\"retrieve stored bias\")");
    const Tensor bias2 = bias_module.forward(5, 5);
    const bool view = bias2.shares_storage_with(bias1);
    say("  Shape " + shape_text(bias2.shape()) +
        ", served from the stored bias without computing anything:");
    say(std::string("  shares_storage_with(example 1) = ") + (view ? "true" : "false") +
        ", is_contiguous() = " + (bias2.is_contiguous() ? "true" : "false") + ",");
    say("  so it is a view, not a copy, and cached_shape() is still " +
        shape_text(bias_module.cached_shape()) + ".");
    say("  It is the BOTTOM-RIGHT block stored[:, 5:, 5:], which equals a fresh");
    say("  [8, 5, 5] build (5 queries at positions 0..4 have the distances of rows");
    say("  5..9 and columns 5..9). zeta's transformer.py returns the top-left block,");
    say("  which is wrong whenever j - i differs from the stored one (see example 4).");
    say("  Head 0:");
    show(head(bias2, 0));
    check(view, "example 2 shares storage with example 1");
    check(bias_module.cached_shape() == std::vector<std::int64_t>{8, 10, 10},
          "cache unchanged by example 2");
    check(same_values(bias2, bias1.slice(1, 5, 10).slice(2, 5, 10)),
          "example 2 == stored[:, 5:, 5:]");
    check(same_values(bias2, alibi_bias(slopes, total_heads, 5, 5)), "example 2 == a fresh build");
    say("");

    // Example 3.
    say("Example 3: bias = bias_module(8, 15)");
    const Tensor bias3 = bias_module.forward(8, 15);
    say("  Shape " + shape_text(bias3.shape()) +
        ": 8 queries that are the last 8 of 15 keys (positions 7..14).");
    say("  Row 0 (position 7) is 0 at key 7 and falls off on both sides; the last");
    say("  row (position 14) is 0 at the last key. 15 keys are more than the 10");
    say("  stored, so this bias is computed, and stored in place of the smaller one:");
    say("  cached_shape() = " + shape_text(bias_module.cached_shape()) + ". Head 0:");
    show(head(bias3, 0));
    check(bias3.shape() == std::vector<std::int64_t>{8, 8, 15}, "shape [8, 8, 15]");
    check(bias3.at({0, 0, 7}) == 0.0f && bias3.at({0, 0, 0}) == -1.75f &&
              bias3.at({0, 0, 14}) == -1.75f && bias3.at({0, 7, 14}) == 0.0f,
          "example 3 positions 7..14");
    check(!bias3.shares_storage_with(bias1), "example 3 computed afresh");
    check(bias_module.cached_shape() == bias3.shape(), "example 3 stored");
    check(all_zero(bias3.slice(0, heads, total_heads)), "example 3 heads 4..7 zero");
    say("");

    // Example 4: a decode step after the prefill of example 3.
    say("Example 4 (a decode step): bias = bias_module(1, 15)");
    const Tensor bias4 = bias_module.forward(1, 15);
    say("  Shape " + shape_text(bias4.shape()) +
        ", the last row of the stored [8, 8, 15] bias (a view again):");
    say("  the one query sits at position 14, distance 0 to the newest key and 14");
    say("  to the oldest. The top-left block would have given row 0, the query at");
    say("  position 7: the bias of the wrong token.");
    say("  Head 0:");
    show(head(bias4, 0));
    check(bias4.shares_storage_with(bias3), "example 4 is a view of example 3");
    check(bias4.at({0, 0, 14}) == 0.0f && bias4.at({0, 0, 0}) == -3.5f, "example 4 distances");
    check(same_values(bias4, alibi_bias(slopes, total_heads, 1, 15)), "example 4 == a fresh build");
    say("");
  }

  void seed_example() {
    say("== The \"ALiBi\" seed's worked example ==");
    say("alibi = AlibiBias(n_heads=1, causal=false, slopes={-0.2})");
    say("  The seed's builder uses its own top-left positions (query r, key c) and");
    say("  the slope with its sign: bias = slope * |r - c|, or in the causal form");
    say("  slope * max(r - c, 0).");
    const Tensor scores = Tensor::from_vector({3, 3}, {1.0f, 2.0f, 3.0f,  //
                                                       2.0f, 1.5f, 2.5f,  //
                                                       3.0f, 2.5f, 1.2f});
    const AlibiBias alibi(1, /*causal=*/false, {-0.2f});
    const Tensor bias = alibi.build(3, 3);
    say("  Attention scores (Q K^T) of 3 tokens:");
    show(scores);
    say("  bias = alibi.build(3, 3), shape " + shape_text(bias.shape()) +
        " = [1, n_heads, q_len, k_len]:");
    show(bias);
    const std::vector<float> s = scores.to_float_vector();
    const std::vector<float> b = bias.to_float_vector();
    std::vector<float> sum(s.size());
    for (std::size_t k = 0; k < s.size(); ++k) sum[k] = s[k] + b[k];
    say("  scores + bias[0][0]:");
    show(Tensor::from_vector({3, 3}, sum));
    const std::vector<float> expected = {1.0f, 1.8f, 2.6f, 1.8f, 1.5f, 2.3f, 2.6f, 2.3f, 1.2f};
    bool matches = sum.size() == expected.size();
    for (std::size_t k = 0; matches && k < sum.size(); ++k) {
      matches = std::fabs(sum[k] - expected[k]) <= 1e-6f;
    }
    check(matches, "the seed's Step 3 table");
    const Tensor same = AlibiPositionalBias(1, 1, {0.2f}).forward(3, 3);
    check(same.to_float_vector() == b, "AlibiPositionalBias(slope 0.2) == the seed's bias");
    say("  This is the seed's Step 3 table: far tokens are not ignored, only less");
    say("  important. (AlibiPositionalBias gives the same numbers for i == j with");
    say("  slope 0.2, since it subtracts slope * distance.)");
    say("");
  }

  // The DynamicPositionBias documentation (seeds/003): its `module(0, 5)`
  // and what it was meant to show.
  void dpb_examples() {
    const std::uint64_t seed = 1;
    const DynamicPositionBias module(64, 8, seed);
    say("== DynamicPositionBias(dim=64, heads=8) ==");
    say("module = DynamicPositionBias(dim=64, heads=8)   (parameters drawn like PyTorch's");
    say("  nn.Linear from seed " + std::to_string(seed) +
        "). An MLP, Linear(1, 64) -> SiLU -> Linear(64, 64) -> SiLU ->");
    say("  Linear(64, 8), turns each distance |q - k| into 8 biases, one per head.");
    say("  module(i, j) returns [heads, i, j] for i queries that are the LAST i of j");
    say("  keys: the query of row r sits at position j - i + r.");
    check(module.parameter_names().size() == 6 &&
              module.parameter("mlp.0.weight").shape() == std::vector<std::int64_t>{64, 1} &&
              module.parameter("mlp.4.weight").shape() == std::vector<std::int64_t>{8, 64},
          "the MLP's shapes");
    say("");

    say("Example 1 (Basic Usage): bias = module(0, 5)   (\"positions 0 to 5\")");
    const Tensor empty = module.forward(0, 5);
    say("  Shape " + shape_text(empty.shape()) + ", " + std::to_string(empty.numel()) +
        " elements: an EMPTY tensor. i and j are LENGTHS, not");
    say("  positions: module(0, 5) asks for the biases of 0 queries against 5 keys.");
    say("  (zeta's module returns the same empty tensor, so the documentation's");
    say("  'Inspecting the Bias' example has nothing to plot.)");
    check(empty.shape() == std::vector<std::int64_t>{8, 0, 5} && empty.numel() == 0,
          "module(0, 5) is an empty [8, 0, 5]");
    say("  What was meant, the biases among positions 0..4 (range(0, 5)), is:");
    say("");

    say("Example 2: bias = module(5, 5)");
    const Tensor bias = module.forward(5, 5);
    const Tensor table = module.table(5);
    say("  Shape " + shape_text(bias.shape()) +
        ": 5 queries at positions 0..4 against keys 0..4. Head 0:");
    show(head(bias, 0));
    bool toeplitz = true;
    bool symmetric = true;
    for (std::int64_t h = 0; h < 8; ++h) {
      for (std::int64_t r = 0; r < 5; ++r) {
        for (std::int64_t c = 0; c < 5; ++c) {
          toeplitz = toeplitz && bias.at({h, r, c}) == table.at({h, std::abs(r - c)});
          symmetric = symmetric && bias.at({h, r, c}) == bias.at({h, c, r});
        }
      }
    }
    say("  Every bias depends only on the distance |q - k|: each diagonal holds one");
    say("  value (a Toeplitz matrix) and the matrix is symmetric, in every head. So");
    say("  the MLP runs on the 5 distances 0..4 only; that per-distance table,");
    say("  module.table(5) (shape " + shape_text(table.shape()) +
        "), is row 0 of each head (query 0). Head 0:");
    show(table.slice(0, 0, 1));
    check(bias.shape() == std::vector<std::int64_t>{8, 5, 5}, "shape [8, 5, 5]");
    check(toeplitz, "bias[h][r][c] == table[h][|r - c|] for every head");
    check(symmetric, "every head symmetric");
    check(same_values(bias.slice(1, 0, 1).slice(0, 0, 1),
                      Tensor::from_vector({1, 1, 5}, table.slice(0, 0, 1).to_float_vector())),
          "row 0 of head 0 == table head 0");
    say("  (Positions 0 to 5 inclusive, 6 of them, would be module(6, 6).)");
    say("");

    say("Example 3 (a decode step): bias = module(1, 5)");
    const Tensor decode = module.forward(1, 5);
    say("  Shape " + shape_text(decode.shape()) +
        ": one query, the newest token at position 4, against keys 0..4");
    say("  (distances 4, 3, 2, 1, 0): the last row of module(5, 5), not its first.");
    say("  Head 0:");
    show(head(decode, 0));
    check(same_values(decode, bias.slice(1, 4, 5)), "module(1, 5) == last row of module(5, 5)");
    bool refused = false;
    std::string message;
    try {
      module.forward(6, 5);
    } catch (const std::invalid_argument& e) {
      refused = true;
      message = e.what();
    }
    say("  More queries than keys (\"Ensure that j >= i\") is an error: module(6, 5)");
    say("  throws \"" + message + "\".");
    check(refused, "module(6, 5) is refused");
    say("");
  }

  std::ostream& out_;
  int failures_ = 0;
};

}  // namespace

int run_demo(std::ostream& out) { return Demo(out).run(); }

}  // namespace posbias::cli
