// What the heatmap renderers share (internal to posbias_plot): the figure's
// spacing and ink, and where ticks and labels go. plot.cc lays the figure
// out (make_layout); plot_png.cc and plot_svg.cc draw that layout.
#ifndef POSBIAS_CLI_PLOT_PLOT_DRAW_H_
#define POSBIAS_CLI_PLOT_PLOT_DRAW_H_

#include <cstdint>
#include <string>
#include <utility>

#include "plot.h"

namespace posbias::cli::plot::detail {

inline constexpr int kScale = 2;              // bitmap font scale (glyphs 10x14)
inline constexpr int kLine = 7 * kScale + 8;  // one line of text
inline constexpr int kPad = 16;               // figure margin
inline constexpr int kPanelTarget = 256;      // panel side for square matrices
inline constexpr int kPanelMinSide = 64;      // thin matrices are stretched to this
inline constexpr int kPanelGap = 28;          // between panel blocks
inline constexpr int kTickLength = 4;
inline constexpr int kColorbarWidth = 20;
inline constexpr int kColorbarMinHeight = 128;
inline constexpr Rgb kInk{30, 30, 30};
inline constexpr Rgb kFrame{90, 90, 90};

/// A tick or colour-bar value, to 4 significant digits.
std::string format_value(double v);
/// The value range the colours span: the finite range, widened when it is a
/// single value so that it lands in the middle of the map.
std::pair<double, double> display_range(const Grid& g);
/// Pixel offset of the centre of source position p along an axis.
int tick_offset(std::int64_t p, std::int64_t block, int cell);
/// Width of the widest row tick label, in pixels of the bitmap font.
int row_tick_width(const Layout& l);
/// The y-axis label, or its first word, or nothing: what fits along
/// `length` at `char_width` pixels per character (the bitmap font's 12;
/// about 8 for the SVG's 13-pixel sans-serif).
std::string fitting_label(const std::string& label, int length, int char_width = 6 * kScale);
/// v's place on the colour scale, in [0, 1].
double scale_position(const Grid& g, double v);
/// The colour bar's pixel row for scale position t (top = 1).
int colorbar_y(const Layout& l, double t);

}  // namespace posbias::cli::plot::detail

#endif  // POSBIAS_CLI_PLOT_PLOT_DRAW_H_
