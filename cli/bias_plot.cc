#include "bias_plot.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

// float32 values rounded to `dtype` and back (what a 16-bit output holds).
std::vector<float> rounded(const std::vector<float>& values, DType dtype) {
  if (dtype == DType::kFloat32) return values;
  return Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values)
      .to(dtype)
      .to_float_vector();
}

// A slope for a title: 6 significant digits ("0.00390625", "-0.2" for
// linspace's -0.19999999); the exact values are in the printed output.
std::string short_number(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", static_cast<double>(v));
  return text;
}

void check_lengths(std::int64_t i, std::int64_t j) {
  if (i < 0 || j < 0) {
    throw std::invalid_argument("i and j must be >= 0, got i = " + std::to_string(i) +
                                ", j = " + std::to_string(j));
  }
}

}  // namespace

void ToeplitzBias::row(std::int64_t h, std::int64_t r, float* out) const {
  // rel = c - q_r = c - (j - i + r), stored at rel + (j - 1) = c + (i - 1 - r).
  const std::vector<float>& t = by_rel[static_cast<std::size_t>(h)];
  std::copy(t.begin() + (i - 1 - r), t.begin() + (i - 1 - r) + j, out);
}

ToeplitzBias alibi_toeplitz(const AlibiPositionalBias& module, std::int64_t i, std::int64_t j,
                            DType dtype) {
  check_lengths(i, j);
  ToeplitzBias b{module.total_heads(), i, j, {}};
  if (i == 0 || j == 0) return b;
  // One query at position 0 against keys at every relative position.
  std::vector<std::int64_t> rel;
  for (std::int64_t k = -(j - 1); k <= i - 1; ++k) rel.push_back(k);
  const Tensor row = alibi_bias_custom_pos(module.slopes(), module.total_heads(), {0}, rel, dtype);
  for (std::int64_t h = 0; h < b.heads; ++h) {
    b.by_rel.push_back(row.slice(0, h, h + 1).to_float_vector());
  }
  return b;
}

ToeplitzBias dpb_toeplitz(const DynamicPositionBias& module, std::int64_t i, std::int64_t j,
                          DType dtype) {
  check_lengths(i, j);
  if (i > j) {
    // The library's own check and message.
    module.forward(i, j);
  }
  ToeplitzBias b{module.options().heads, i, j, {}};
  if (i == 0 || j == 0) return b;
  // distance_table(j)[h][k] holds q_r - c = (j - 1) - k; we index by
  // rel = c - q_r = k' - (j - 1): reverse it, keep rel <= i - 1.
  const Tensor table = module.distance_table(j);
  for (std::int64_t h = 0; h < b.heads; ++h) {
    std::vector<float> t = table.slice(0, h, h + 1).to_float_vector();
    std::reverse(t.begin(), t.end());
    t.resize(static_cast<std::size_t>(i + j - 1));
    b.by_rel.push_back(rounded(t, dtype));
  }
  return b;
}

ToeplitzBias t5_toeplitz(const RelativePositionBias& module, std::int64_t i, std::int64_t j,
                         DType dtype) {
  check_lengths(i, j);
  ToeplitzBias b{module.heads(), i, j, {}};
  if (i == 0 || j == 0) return b;
  // distance_table(n)[h][k] is the bias at rel = (n - 1) - k for |rel| < n;
  // n = max(i, j) covers rel in [-(j - 1), i - 1].
  const std::int64_t n = std::max(i, j);
  const Tensor table = module.distance_table(n);
  for (std::int64_t h = 0; h < b.heads; ++h) {
    const std::vector<float> t = table.slice(0, h, h + 1).to_float_vector();
    std::vector<float> by_rel;
    for (std::int64_t rel = -(j - 1); rel <= i - 1; ++rel) {
      by_rel.push_back(t[static_cast<std::size_t>((n - 1) - rel)]);
    }
    b.by_rel.push_back(rounded(by_rel, dtype));
  }
  return b;
}

plot::HeatmapInput toeplitz_heatmap(const ToeplitzBias& bias, std::string title,
                                    std::vector<std::string> panel_titles) {
  plot::HeatmapInput in;
  in.title = std::move(title);
  in.panel_titles = std::move(panel_titles);
  in.heads = bias.heads;
  in.rows = bias.i;
  in.cols = bias.j;
  const ToeplitzBias* b = &bias;
  in.row = [b](std::int64_t h, std::int64_t r, float* out) { b->row(h, r, out); };
  return in;
}

plot::HeatmapInput tensor_heatmap(const Tensor& bias, std::string title,
                                  std::vector<std::string> panel_titles) {
  if (bias.dim() != 3) {
    throw std::invalid_argument("tensor_heatmap: need a [heads, rows, cols] tensor");
  }
  plot::HeatmapInput in;
  in.title = std::move(title);
  in.panel_titles = std::move(panel_titles);
  in.heads = bias.size(0);
  in.rows = bias.size(1);
  in.cols = bias.size(2);
  in.row = [bias](std::int64_t h, std::int64_t r, float* out) {
    const std::vector<float> v = bias.slice(0, h, h + 1).slice(1, r, r + 1).to_float_vector();
    std::copy(v.begin(), v.end(), out);
  };
  return in;
}

std::vector<std::string> alibi_panel_titles(const std::vector<float>& slopes,
                                            std::int64_t total_heads) {
  std::vector<std::string> titles;
  for (std::int64_t h = 0; h < total_heads; ++h) {
    titles.push_back("head " + std::to_string(h) +
                     (h < static_cast<std::int64_t>(slopes.size())
                          ? ", slope " + short_number(slopes[static_cast<std::size_t>(h)])
                          : ", no bias"));
  }
  return titles;
}

std::vector<std::string> head_panel_titles(std::int64_t heads) {
  std::vector<std::string> titles;
  for (std::int64_t h = 0; h < heads; ++h) titles.push_back("head " + std::to_string(h));
  return titles;
}

void check_plot_path(const std::string& path) {
  try {
    plot::format_of_path(path);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--plot: ") + e.what());
  }
}

}  // namespace posbias::cli
