// The biases of `posbias alibi|dpb|t5` as heatmap inputs (plot.h), and the
// --plot option those commands share.
//
// All three biases are Toeplitz: bias[h][r][c] depends only on the relative
// position rel = c - q_r (q_r = j - i + r, bottom-right alignment), which
// runs from -(j - 1) to i - 1. The library computes that one row of i + j - 1
// values per head (alibi_bias_custom_pos, distance_table); every row of the
// picture is a window of it, so a figure of 8 heads of 4096 x 4096 never
// materialises the 512 MiB bias.
#ifndef POSBIAS_CLI_BIAS_PLOT_H_
#define POSBIAS_CLI_BIAS_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "plot.h"
#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli {

/// `heads` rows of i + j - 1 values each: entry rel + (j - 1) of head h is
/// the bias at relative position rel = c - q_r.
struct ToeplitzBias {
  std::int64_t heads = 0, i = 0, j = 0;
  std::vector<std::vector<float>> by_rel;
  /// Writes row r of head h (j values).
  void row(std::int64_t h, std::int64_t r, float* out) const;
};

/// AlibiPositionalBias(slopes, total_heads).forward(i, j) in `dtype`.
ToeplitzBias alibi_toeplitz(const AlibiPositionalBias& module, std::int64_t i, std::int64_t j,
                            DType dtype);
/// DynamicPositionBias::forward(i, j, dtype) (0 <= i <= j, j >= 1).
ToeplitzBias dpb_toeplitz(const DynamicPositionBias& module, std::int64_t i, std::int64_t j,
                          DType dtype);
/// RelativePositionBias::forward(i, j, dtype) (any i, j >= 1).
ToeplitzBias t5_toeplitz(const RelativePositionBias& module, std::int64_t i, std::int64_t j,
                         DType dtype);

/// A heatmap of `bias` with the given titles; the input refers to `bias`,
/// which must outlive it.
plot::HeatmapInput toeplitz_heatmap(const ToeplitzBias& bias, std::string title,
                                    std::vector<std::string> panel_titles);

/// A heatmap of a [heads, rows, cols] tensor (any dtype, strides); the input
/// holds a handle to it.
plot::HeatmapInput tensor_heatmap(const Tensor& bias, std::string title,
                                  std::vector<std::string> panel_titles);

/// Panel titles "head 0, slope 0.25", ..., "head 7, no bias" (zero heads).
std::vector<std::string> alibi_panel_titles(const std::vector<float>& slopes,
                                            std::int64_t total_heads);
/// Panel titles "head 0", ..., "head n-1".
std::vector<std::string> head_panel_titles(std::int64_t heads);

/// Throws std::invalid_argument unless `path` names a .png or .svg file
/// (checked before any work is done).
void check_plot_path(const std::string& path);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_BIAS_PLOT_H_
