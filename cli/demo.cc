// `posbias demo` (demo.h): the seed documents' examples and their pictures;
// the attention comparison is demo_attention.cc.
#include "demo.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bias_plot.h"
#include "posbias/limits.h"
#include "demo_script.h"
#include "plot.h"
#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

namespace posbias::cli {
namespace demo {

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

// A [1, n, q, k] tensor (AlibiBias::build) as [n, q, k], for plotting.
Tensor drop_batch(const Tensor& t) {
  return Tensor::from_vector({t.size(1), t.size(2), t.size(3)}, t.to_float_vector());
}

std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

std::string mib(double bytes) { return fixed(bytes / (1024.0 * 1024.0), 1) + " MiB"; }

int Demo::run() {
  make_plot_dir();
  out_ << "posbias " << version() << ": positional biases, the documentation's examples.\n\n";
  documentation_examples();
  seed_example();
  generic_builder();
  dpb_examples();
  inspecting_the_bias();
  fused_attention();
  say("== Pictures ==");
  say("The heatmaps of this demo are in " + options_.plot_dir + "/ :");
  for (const std::string& line : pictures_) say("  " + line);
  say("");
  if (failures_ == 0) {
    out_ << "Every statement above was checked while printing it.\n";
    return 0;
  }
  out_ << failures_ << " statement(s) above did not hold (UNEXPECTED).\n";
  return 1;
}

// A statement the text makes: printed when it holds, flagged if not.
void Demo::check(bool holds, const std::string& what) {
  if (!holds) {
    ++failures_;
    out_ << "UNEXPECTED: " << what << " does not hold\n";
  }
}

void Demo::documentation_examples() {
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

void Demo::seed_example() {
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
void Demo::dpb_examples() {
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

void Demo::make_plot_dir() {
  const std::string& dir = options_.plot_dir;
  if (dir.empty()) throw std::invalid_argument("--out: the folder name is empty");
  if (mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    throw std::invalid_argument("--out: cannot create the folder " + posbias::quoted_name(dir) +
                                ": " + std::strerror(errno));
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw std::invalid_argument("--out: " + posbias::quoted_name(dir) + " is not a folder");
  }
}

// Writes a heatmap into the folder and remembers it for the list at the end.
void Demo::picture(const std::string& name, const plot::HeatmapInput& input, const std::string& what) {
  const std::string path = options_.plot_dir + "/" + name;
  const std::string description = plot::write_heatmap("--out", path, input);
  pictures_.push_back(name + "  " + what + " (" + description + ")");
  say("  -> " + path);
}

// The "ALiBi" seed's AlibiBias, causal and not: its own top-left
// convention and default slopes.
void Demo::generic_builder() {
  say("== The \"ALiBi\" seed's generic builder, causal and not ==");
  say("AlibiBias(n_heads=4) with the seed's default slopes linspace(-0.05, -0.5, 4):");
  const AlibiBias causal(4, /*causal=*/true);
  const AlibiBias both(4, /*causal=*/false);
  say("  slopes = " + list_text(causal.slopes()) + " (negative: the bias is slope * distance).");
  const Tensor c = causal.build(5, 5);
  const Tensor n = both.build(5, 5);
  say("  causal.build(5, 5), shape " + shape_text(c.shape()) +
      ", head 3 (slope -0.5): slope * max(r - c, 0),");
  say("  so keys in the future get 0 here; masking them is the attention's job:");
  show(Tensor::from_vector({5, 5}, c.slice(1, 3, 4).to_float_vector()));
  say("  non-causal build(5, 5), head 3: slope * |r - c|, symmetric:");
  show(Tensor::from_vector({5, 5}, n.slice(1, 3, 4).to_float_vector()));
  bool causal_ok = true, symmetric = true;
  for (std::int64_t h = 0; h < 4; ++h) {
    const float m = causal.slopes()[static_cast<std::size_t>(h)];
    for (std::int64_t r = 0; r < 5; ++r) {
      for (std::int64_t k = 0; k < 5; ++k) {
        causal_ok = causal_ok && c.at({0, h, r, k}) ==
                                     m * static_cast<float>(std::max<std::int64_t>(r - k, 0));
        symmetric = symmetric && n.at({0, h, r, k}) == n.at({0, h, k, r}) &&
                    n.at({0, h, r, k}) == m * static_cast<float>(std::abs(r - k));
      }
    }
  }
  check(causal.slopes() == AlibiBias::default_slopes(4) && causal.slopes().front() == -0.05f &&
            causal.slopes().back() == -0.5f,
        "default slopes linspace(-0.05, -0.5, 4)");
  check(causal_ok, "causal bias = slope * max(r - c, 0)");
  check(symmetric, "non-causal bias = slope * |r - c|, symmetric");
  const Tensor again = causal.build(5, 5);
  say("  A second causal.build(5, 5) returns the cached tensor (same storage: " +
      std::string(again.shares_storage_with(c) ? "true" : "false") +
      "); the cache is keyed by lengths and dtype, not lengths alone.");
  check(again.shares_storage_with(c), "build() cache hit");
  check(!causal.build(5, 5, DType::kBFloat16).shares_storage_with(c), "dtype is part of the key");
  say("  Note the convention: top-left (query r at position r), unlike");
  say("  AlibiPositionalBias (bottom-right), and no causal mask: for a decode");
  say("  step build(1, j) gives the bias of query 0, not of the newest token.");
  picture("alibi_bias_causal.png",
          tensor_heatmap(drop_batch(c), "AlibiBias(n_heads=4, causal=True).build(5, 5)",
                         alibi_panel_titles(causal.slopes(), 4)),
          "the seed's builder, causal");
  picture("alibi_bias_noncausal.png",
          tensor_heatmap(drop_batch(n), "AlibiBias(n_heads=4, causal=False).build(5, 5)",
                         alibi_panel_titles(both.slopes(), 4)),
          "the seed's builder, non-causal");
  say("");
}

// The DynamicPositionBias documentation's third example, "Inspecting the
// bias", as pictures (it plots module(0, 5), which is empty).
void Demo::inspecting_the_bias() {
  say("== Inspecting the bias (the DynamicPositionBias documentation's example 3) ==");
  say("The documentation plots module(0, 5), which is empty: there is nothing to");
  say("draw. posbias draws module(5, 5), what was meant, and a larger window:");
  const DynamicPositionBias module(64, 8, 1);
  const ToeplitzBias small = dpb_toeplitz(module, 5, 5, DType::kFloat32);
  picture("dpb_5x5.png",
          toeplitz_heatmap(small, "DynamicPositionBias(dim=64, heads=8).forward(5, 5), seed 1",
                           head_panel_titles(8)),
          "module(5, 5)");
  const ToeplitzBias large = dpb_toeplitz(module, 64, 64, DType::kFloat32);
  picture("dpb_64x64.svg",
          toeplitz_heatmap(large, "DynamicPositionBias(dim=64, heads=8).forward(64, 64), seed 1",
                           head_panel_titles(8)),
          "module(64, 64), untrained: smooth in the distance");
  bool refused = false;
  try {
    plot::write_heatmap("heatmap", options_.plot_dir + "/empty.png",
                        toeplitz_heatmap(dpb_toeplitz(module, 0, 5, DType::kFloat32), "empty",
                                         head_panel_titles(8)));
  } catch (const std::invalid_argument& e) {
    refused = true;
    say("  (Asked to draw module(0, 5), posbias says: \"" + std::string(e.what()) + "\")");
  }
  check(refused, "an empty bias is not drawn");

  say("And the others, as `posbias alibi|dpb|t5 ... --plot FILE` draws them:");
  const AlibiPositionalBias bias_module(4, 8);
  const ToeplitzBias a = alibi_toeplitz(bias_module, 10, 10, DType::kFloat32);
  picture("alibi_10x10.png",
          toeplitz_heatmap(a, "AlibiPositionalBias(heads=4, total_heads=8).forward(10, 10)",
                           alibi_panel_titles(bias_module.slopes(), 8)),
          "the documentation's example 1");
  const ToeplitzBias a3 = alibi_toeplitz(bias_module, 8, 15, DType::kFloat32);
  picture("alibi_8x15.svg",
          toeplitz_heatmap(a3, "AlibiPositionalBias(heads=4, total_heads=8).forward(8, 15)",
                           alibi_panel_titles(bias_module.slopes(), 8)),
          "example 3: the last 8 of 15 positions");
  const RelativePositionBias t5(1.0f, /*causal=*/false, 32, 128, 4, 1);
  const ToeplitzBias t = t5_toeplitz(t5, 200, 200, DType::kFloat32);
  picture("t5_200x200.png",
          toeplitz_heatmap(t,
                           "RelativePositionBias(heads=4, two-sided, buckets=32, "
                           "max_distance=128).forward(200, 200), seed 1",
                           head_panel_titles(4)),
          "T5 buckets: exact near the diagonal, logarithmic beyond");
  const AlibiPositionalBias eight(8);
  const ToeplitzBias big = alibi_toeplitz(eight, 4096, 4096, DType::kFloat32);
  picture("alibi_8_heads_4096.png",
          toeplitz_heatmap(big, "AlibiPositionalBias(heads=8).forward(4096, 4096)",
                           alibi_panel_titles(eight.slopes(), 8)),
          "a long sequence, drawn by block means");
  say("");
}

}  // namespace demo

int run_demo(std::ostream& out, const DemoOptions& options) {
  return demo::Demo(out, options).run();
}

}  // namespace posbias::cli
