// Heatmaps of biases, for `posbias alibi|dpb|t5 --plot FILE` and the demo:
// one panel per head in a grid, one shared colour scale with a colour bar,
// axis labels and tick labels, a title per panel and for the figure. PNG
// (libpng; text from a 5x7 bitmap font of our own, cli/plot/plot_font.cc) or SVG
// (text as SVG text, the heatmaps as embedded PNG images drawn pixelated).
//
// Large matrices are reduced by block mean to at most kMaxCells x kMaxCells
// per panel, and the figure title says so ("downsampled 4096x4096 ->
// 256x256 by block mean"). Non-finite values are drawn grey and left out of
// the colour scale (and out of the block means: a block holding one is grey).
//
// Internal to the tool: not part of the library.
#ifndef POSBIAS_CLI_PLOT_H_
#define POSBIAS_CLI_PLOT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace posbias::cli::plot {

/// Largest panel, in cells per side, before block-mean downsampling.
constexpr std::int64_t kMaxCells = 256;
/// At most this many panels (heads) are drawn.
constexpr std::int64_t kMaxPanels = 64;
/// At most this many values (heads * rows * cols) are read to draw one figure.
constexpr std::int64_t kMaxValues = std::int64_t{1} << 28;

/// An 8-bit sRGB colour.
struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};

/// The colour map: t in [0, 1] (clamped) from dark blue-violet through teal and
/// green to yellow, with lightness rising monotonically. Piecewise linear
/// between control points chosen for this project (not another library's).
Rgb colormap(double t);

/// The colour of non-finite values.
constexpr Rgb kNonFiniteColour{160, 160, 160};

/// What to draw: `heads` matrices of rows x cols, read one row at a time.
struct HeatmapInput {
  std::string title;                      ///< figure title (one line)
  std::vector<std::string> panel_titles;  ///< one per head
  std::string value_label = "bias";       ///< colour bar label
  std::string row_label = "query position";
  std::string col_label = "key position";
  std::int64_t heads = 0, rows = 0, cols = 0;
  /// Writes row `r` of head `h` (cols floats) to `out`.
  std::function<void(std::int64_t h, std::int64_t r, float* out)> row;
};

/// The figure's data after downsampling: heads x grid_rows x grid_cols block
/// means, the block sizes, and the shared value range of the finite values.
struct Grid {
  std::int64_t heads = 0, rows = 0, cols = 0;  ///< downsampled extents
  std::int64_t block_rows = 1, block_cols = 1;
  std::int64_t source_rows = 0, source_cols = 0;
  std::vector<float> values;  ///< [heads, rows, cols]
  double vmin = 0, vmax = 0;  ///< finite range (0, 0 when nothing is finite)
  bool any_finite = false;
  /// "" or "downsampled RxC -> rxc by block mean".
  std::string downsample_note() const;
  float at(std::int64_t h, std::int64_t r, std::int64_t c) const {
    return values[static_cast<std::size_t>((h * rows + r) * cols + c)];
  }
};

/// The image format of a path, from its extension (case-insensitive).
enum class Format { kPng, kSvg };
/// Throws std::invalid_argument naming the path unless it ends in .png or .svg.
Format format_of_path(const std::string& path);

/// Throws std::invalid_argument (with the sizes and the limits) unless the
/// input can be drawn: 1..kMaxPanels heads, rows and cols >= 1,
/// heads * rows * cols <= kMaxValues, one panel title per head.
void check_drawable(const HeatmapInput& input);

/// The size part of check_drawable(), for callers that must check before
/// they build anything: std::invalid_argument naming `option` unless 1..64
/// heads of rows x cols >= 1 with heads * rows * cols <= kMaxValues.
void check_plot_size(const std::string& option, std::int64_t heads, std::int64_t rows,
                     std::int64_t cols);

/// Reads every value of `input` and reduces it to a Grid (block means).
Grid make_grid(const HeatmapInput& input);

/// Where things are, in pixels of the PNG (the SVG uses the same numbers).
struct Rect {
  int x = 0, y = 0, w = 0, h = 0;
};
struct Layout {
  int width = 0, height = 0;
  int cell_w = 1, cell_h = 1;                      ///< pixels per grid cell
  std::vector<Rect> panels;                        ///< the heatmap area of each head
  Rect colorbar;                                   ///< the colour bar (top = vmax)
  std::vector<double> colorbar_ticks;              ///< values labelled on the colour bar
  std::vector<std::int64_t> row_ticks, col_ticks;  ///< source positions labelled
};
Layout make_layout(const HeatmapInput& input, const Grid& grid);

/// The colour of value v on the grid's scale (kNonFiniteColour if not finite).
Rgb colour_of(const Grid& grid, double v);

/// The figure as PNG bytes / SVG text.
std::vector<std::uint8_t> render_png(const HeatmapInput& input, const Grid& grid);
std::string render_svg(const HeatmapInput& input, const Grid& grid);

/// Checks the format and the sizes, draws the figure and writes it to
/// `path` (through a temporary file in the same directory, renamed into
/// place: no half-written file is ever left). Errors are
/// std::invalid_argument naming `option` and the path (exit code 2 in the
/// tool). Returns a one-line description ("8 panels, 1060x598 PNG").
std::string write_heatmap(const std::string& option, const std::string& path,
                          const HeatmapInput& input);

/// Writes `bytes` to `path` atomically (temporary file + rename); throws
/// std::invalid_argument with the path and the system's reason on failure,
/// after removing the temporary file.
void write_file_atomically(const std::string& option, const std::string& path,
                           const std::string& bytes);

/// RGB raster and its PNG encoding (8-bit RGB, no alpha).
struct Image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  ///< width * height * 3
  void fill_rect(int x, int y, int w, int h, Rgb c);
  void set(int x, int y, Rgb c);
};
std::vector<std::uint8_t> encode_png(const Image& image);

/// Draws `text` with the 5x7 bitmap font at (x, y) (top-left), each font
/// pixel `scale` x `scale`; letters are drawn as capitals. Rotated: reads
/// bottom to top (for a y-axis label), (x, y) then the bottom-left corner.
void draw_text(Image& image, int x, int y, const std::string& text, int scale, Rgb colour,
               bool rotated = false);
/// Width in pixels of `text` drawn at `scale`.
int text_width(const std::string& text, int scale);

}  // namespace posbias::cli::plot

#endif  // POSBIAS_CLI_PLOT_H_
