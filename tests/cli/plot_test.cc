// The heatmap renderer (cli/plot/plot.h, the posbias_plot library) on its
// own: the colour map, block means and their note. The PNG and SVG it writes
// for biases are tested in bias_plot_test.cc.
#include "plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace posbias::cli {
namespace {

// ------------------------------------------------------------ colour map

TEST(Plot, ColormapEndsAndLightnessRises) {
  const plot::Rgb lo = plot::colormap(0), hi = plot::colormap(1);
  EXPECT_EQ(lo, (plot::Rgb{38, 16, 74}));
  EXPECT_EQ(hi, (plot::Rgb{250, 230, 50}));
  EXPECT_EQ(plot::colormap(-3), lo);
  EXPECT_EQ(plot::colormap(7), hi);
  EXPECT_EQ(plot::colormap(std::nan("")), lo);
  double previous = -1;
  for (int k = 0; k <= 1000; ++k) {
    const plot::Rgb c = plot::colormap(k / 1000.0);
    const double luminance = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(luminance, previous - 0.75) << "t = " << k / 1000.0;  // rounding only
    previous = std::max(previous, luminance);
  }
  EXPECT_GT(0.2126 * hi.r + 0.7152 * hi.g + 0.0722 * hi.b,
            4 * (0.2126 * lo.r + 0.7152 * lo.g + 0.0722 * lo.b));
}

TEST(Plot, BlockMeansAndTheirNote) {
  plot::HeatmapInput in;
  in.heads = 2;
  in.rows = 600;
  in.cols = 300;
  in.panel_titles = {"a", "b"};
  // value = h * 1e6 + r * 1000 + c: a block's mean is its centre's value.
  in.row = [](std::int64_t h, std::int64_t r, float* out) {
    for (std::int64_t c = 0; c < 300; ++c) out[c] = static_cast<float>(h * 1000000 + r * 1000 + c);
  };
  const plot::Grid g = plot::make_grid(in);
  EXPECT_EQ(g.block_rows, 3);  // ceil(600 / 256)
  EXPECT_EQ(g.block_cols, 2);  // ceil(300 / 256)
  EXPECT_EQ(g.rows, 200);
  EXPECT_EQ(g.cols, 150);
  EXPECT_EQ(g.downsample_note(), "downsampled 600x300 -> 200x150 by block mean");
  // Block (5, 7) of head 1: rows 15..17, cols 14..15.
  EXPECT_FLOAT_EQ(g.at(1, 5, 7), 1000000.0f + 16 * 1000 + 14.5f);
  EXPECT_FLOAT_EQ(static_cast<float>(g.vmin), 1000.0f + 0.5f);
  EXPECT_FLOAT_EQ(static_cast<float>(g.vmax), 1000000.0f + 598 * 1000 + 298.5f);

  // A partial last block averages only what it holds; NaN makes it grey.
  in.rows = 257;
  in.cols = 3;
  in.heads = 1;
  in.panel_titles = {"a"};
  in.row = [](std::int64_t, std::int64_t r, float* out) {
    for (int c = 0; c < 3; ++c) out[c] = r == 256 ? 10.0f : (c == 1 && r == 0 ? NAN : 1.0f);
  };
  const plot::Grid p = plot::make_grid(in);
  EXPECT_EQ(p.rows, 129);
  EXPECT_EQ(p.cols, 3);
  EXPECT_FLOAT_EQ(p.at(0, 128, 0), 10.0f);
  EXPECT_TRUE(std::isnan(p.at(0, 0, 1)));
  EXPECT_EQ(plot::colour_of(p, p.at(0, 0, 1)), plot::kNonFiniteColour);
  EXPECT_EQ(p.vmin, 1.0);
  EXPECT_EQ(p.vmax, 10.0);
}


}  // namespace
}  // namespace posbias::cli
