// The heatmap's data and layout: the colour map, block means (make_grid),
// where panels, ticks and the colour bar go (make_layout), and writing the
// file; the PNG and SVG drawing is plot_png.cc and plot_svg.cc.
#include "plot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "plot_draw.h"
#include "posbias/limits.h"

namespace posbias::cli::plot {
namespace detail {

std::string format_value(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", v);
  return text;
}

// The value range the colours span: the finite range, widened when it is a
// single value so that it lands in the middle of the map.
std::pair<double, double> display_range(const Grid& g) {
  if (!g.any_finite) return {-1, 1};
  if (g.vmax > g.vmin) return {g.vmin, g.vmax};
  const double half = g.vmin == 0 ? 1.0 : std::fabs(g.vmin) / 2;
  return {g.vmin - half, g.vmin + half};
}

// Pixel offset of the centre of source position p along an axis.
int tick_offset(std::int64_t p, std::int64_t block, int cell) {
  return static_cast<int>((p / block) * cell + cell / 2);
}

int row_tick_width(const Layout& l) {
  int w = 0;
  for (std::int64_t p : l.row_ticks) w = std::max(w, text_width(std::to_string(p), kScale));
  return w;
}

// The y-axis label, or its first word, or nothing: what fits along
// `length` at `char_width` pixels per character (the bitmap font's 12; about
// 8 for the SVG's 13-pixel sans-serif).
std::string fitting_label(const std::string& label, int length, int char_width) {
  const auto width = [&](const std::string& s) { return static_cast<int>(s.size()) * char_width; };
  if (width(label) <= length) return label;
  const std::string first = label.substr(0, label.find(' '));
  return width(first) <= length ? first : "";
}

double scale_position(const Grid& g, double v) {
  const auto [lo, hi] = display_range(g);
  return std::clamp((v - lo) / (hi - lo), 0.0, 1.0);
}

int colorbar_y(const Layout& l, double t) {
  return l.colorbar.y + static_cast<int>(std::lround((1 - t) * (l.colorbar.h - 1)));
}

}  // namespace detail

namespace {

using namespace detail;

// Control points of the colour map (t, r, g, b), chosen for this project:
// dark violet -> indigo -> steel teal -> green-teal -> green -> yellow, with
// the luminance 0.2126 r + 0.7152 g + 0.0722 b rising at every step.
struct ControlPoint {
  double t, r, g, b;
};
constexpr ControlPoint kControlPoints[] = {
    {0.0, 38, 16, 74},   {0.2, 62, 58, 140},  {0.4, 45, 110, 150},
    {0.6, 35, 160, 130}, {0.8, 120, 200, 80}, {1.0, 250, 230, 50},
};

std::uint8_t channel(double v) {
  return static_cast<std::uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string lower(std::string s) {
  for (char& ch : s) {
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  return s;
}

// A "nice" step (1, 2 or 5 times a power of ten) of at least `raw`.
double nice_step(double raw) {
  if (!(raw > 0)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

// Positions 0, step, 2 step, ... below n: at most 5 labels.
std::vector<std::int64_t> position_ticks(std::int64_t n) {
  std::vector<std::int64_t> ticks;
  if (n <= 1) return {0};
  const auto step =
      static_cast<std::int64_t>(std::max(1.0, nice_step(static_cast<double>(n - 1) / 4)));
  for (std::int64_t p = 0; p < n; p += step) ticks.push_back(p);
  return ticks;
}

std::vector<double> value_ticks(const Grid& g) {
  const auto [lo, hi] = display_range(g);
  const double step = nice_step((hi - lo) / 4);
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    const double v = k * step;
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

int panel_columns(std::int64_t heads) {
  if (heads <= 4) return static_cast<int>(heads);
  return static_cast<int>(std::ceil(std::sqrt(2.0 * static_cast<double>(heads))));
}

struct Geometry {
  int title_lines = 1;
  int left = 0;  // from block x to the panel: y label + y tick labels
  int panel_w = 0, panel_h = 0;
  int block_w = 0, block_h = 0;
  int columns = 1, rows = 1;
  int grid_x = kPad, grid_y = kPad;
};

Geometry geometry(const HeatmapInput& in, const Grid& g, const Layout& l) {
  Geometry geo;
  geo.title_lines = g.downsample_note().empty() ? 1 : 2;
  geo.panel_w = static_cast<int>(g.cols) * l.cell_w;
  geo.panel_h = static_cast<int>(g.rows) * l.cell_h;
  geo.left = kLine + row_tick_width(l) + 6 + kTickLength;
  int title_w = 0;
  for (const std::string& t : in.panel_titles) title_w = std::max(title_w, text_width(t, kScale));
  const int content_w = std::max({geo.panel_w, title_w, text_width(in.col_label, kScale)});
  geo.block_w = geo.left + content_w + kPanelGap;
  geo.block_h = kLine + geo.panel_h + kTickLength + 2 * kLine + kPanelGap / 2;
  geo.columns = panel_columns(g.heads);
  geo.rows = static_cast<int>(ceil_div(g.heads, geo.columns));
  geo.grid_y = kPad + geo.title_lines * kLine + 8;
  return geo;
}

Layout layout_of(const HeatmapInput& in, const Grid& g) {
  Layout l;
  const int side = static_cast<int>(std::max(g.rows, g.cols));
  const int cell = std::max(1, kPanelTarget / side);
  l.cell_w = cell;
  l.cell_h = cell;
  if (g.rows * cell < kPanelMinSide) l.cell_h = static_cast<int>(ceil_div(kPanelMinSide, g.rows));
  if (g.cols * cell < kPanelMinSide) l.cell_w = static_cast<int>(ceil_div(kPanelMinSide, g.cols));
  l.row_ticks = position_ticks(g.source_rows);
  l.col_ticks = position_ticks(g.source_cols);
  l.colorbar_ticks = value_ticks(g);

  const Geometry geo = geometry(in, g, l);
  for (std::int64_t h = 0; h < g.heads; ++h) {
    const int col = static_cast<int>(h % geo.columns);
    const int row = static_cast<int>(h / geo.columns);
    Rect r;
    r.x = geo.grid_x + col * geo.block_w + geo.left;
    r.y = geo.grid_y + row * geo.block_h + kLine;
    r.w = geo.panel_w;
    r.h = geo.panel_h;
    l.panels.push_back(r);
  }
  const int grid_right = geo.grid_x + geo.columns * geo.block_w;
  const int grid_bottom = geo.grid_y + geo.rows * geo.block_h;
  l.colorbar.x = grid_right;
  l.colorbar.y = geo.grid_y + 2 * kLine;
  l.colorbar.w = kColorbarWidth;
  l.colorbar.h = std::max(geo.panel_h, kColorbarMinHeight);
  int tick_w = text_width(in.value_label, kScale) - kColorbarWidth;
  for (double v : l.colorbar_ticks) tick_w = std::max(tick_w, text_width(format_value(v), kScale));
  l.width = std::max(grid_right + kColorbarWidth + kTickLength + 6 + tick_w + kPad,
                     2 * kPad + text_width(in.title, kScale));
  l.width = std::max(l.width, 2 * kPad + text_width(g.downsample_note(), kScale));
  l.height = std::max(grid_bottom, l.colorbar.y + l.colorbar.h + kLine) + kPad;
  return l;
}

}  // namespace

// --------------------------------------------------------------- public

// --------------------------------------------------------------- public

Rgb colormap(double t) {
  if (!(t >= 0)) t = 0;  // also NaN
  if (t > 1) t = 1;
  const std::size_t n = sizeof kControlPoints / sizeof kControlPoints[0];
  std::size_t k = 1;
  while (k + 1 < n && t > kControlPoints[k].t) ++k;
  const ControlPoint& a = kControlPoints[k - 1];
  const ControlPoint& b = kControlPoints[k];
  const double u = (t - a.t) / (b.t - a.t);
  return {channel(a.r + u * (b.r - a.r)), channel(a.g + u * (b.g - a.g)),
          channel(a.b + u * (b.b - a.b))};
}

std::string Grid::downsample_note() const {
  if (block_rows == 1 && block_cols == 1) return "";
  return "downsampled " + std::to_string(source_rows) + "x" + std::to_string(source_cols) + " -> " +
         std::to_string(rows) + "x" + std::to_string(cols) + " by block mean";
}

Format format_of_path(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::size_t dot = name.find_last_of('.');
  const std::string ext = dot == std::string::npos ? "" : lower(name.substr(dot));
  if (ext == ".png") return Format::kPng;
  if (ext == ".svg") return Format::kSvg;
  throw std::invalid_argument(
      "unknown image format " +
      (ext.empty() ? std::string("(no extension)") : posbias::quoted_name(ext)) + " of " +
      posbias::quoted_name(path) + ": the file name must end in .png or .svg");
}

void check_plot_size(const std::string& option, std::int64_t heads, std::int64_t rows,
                     std::int64_t cols) {
  HeatmapInput in;
  in.heads = heads;
  in.rows = rows;
  in.cols = cols;
  in.panel_titles.resize(heads >= 1 && heads <= kMaxPanels ? static_cast<std::size_t>(heads) : 0);
  in.row = [](std::int64_t, std::int64_t, float*) {};
  try {
    check_drawable(in);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(option + ": " + e.what());
  }
}

void check_drawable(const HeatmapInput& in) {
  const std::string sizes = std::to_string(in.heads) + " heads of " + std::to_string(in.rows) +
                            " x " + std::to_string(in.cols);
  if (in.heads < 1 || in.rows < 1 || in.cols < 1) {
    throw std::invalid_argument("nothing to draw: " + sizes +
                                " (a picture needs at least one head, one row and one column)");
  }
  if (in.heads > kMaxPanels) {
    throw std::invalid_argument("too many heads to draw: " + sizes + " (at most " +
                                std::to_string(kMaxPanels) + " panels)");
  }
  const std::int64_t limit = kMaxValues;
  if (in.rows > limit || in.cols > limit || in.rows * in.cols > limit / in.heads) {
    throw std::invalid_argument("too large to draw: " + sizes + " (at most " +
                                std::to_string(limit) +
                                " values in all are read to draw a figure)");
  }
  if (static_cast<std::int64_t>(in.panel_titles.size()) != in.heads || !in.row) {
    throw std::invalid_argument("heatmap: need one panel title per head and a row function");
  }
}

Grid make_grid(const HeatmapInput& in) {
  check_drawable(in);
  Grid g;
  g.heads = in.heads;
  g.source_rows = in.rows;
  g.source_cols = in.cols;
  g.block_rows = ceil_div(in.rows, kMaxCells);
  g.block_cols = ceil_div(in.cols, kMaxCells);
  g.rows = ceil_div(in.rows, g.block_rows);
  g.cols = ceil_div(in.cols, g.block_cols);
  g.values.assign(static_cast<std::size_t>(g.heads * g.rows * g.cols), 0.0f);
  std::vector<float> row(static_cast<std::size_t>(in.cols));
  std::vector<double> sums(static_cast<std::size_t>(g.cols));
  std::vector<char> bad(static_cast<std::size_t>(g.cols));
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (std::int64_t h = 0; h < g.heads; ++h) {
    for (std::int64_t gr = 0; gr < g.rows; ++gr) {
      std::fill(sums.begin(), sums.end(), 0.0);
      std::fill(bad.begin(), bad.end(), 0);
      const std::int64_t r0 = gr * g.block_rows;
      const std::int64_t r1 = std::min(in.rows, r0 + g.block_rows);
      for (std::int64_t r = r0; r < r1; ++r) {
        in.row(h, r, row.data());
        for (std::int64_t c = 0; c < in.cols; ++c) {
          const float v = row[static_cast<std::size_t>(c)];
          const auto gc = static_cast<std::size_t>(c / g.block_cols);
          if (std::isfinite(v)) {
            sums[gc] += v;
          } else {
            bad[gc] = 1;
          }
        }
      }
      for (std::int64_t gc = 0; gc < g.cols; ++gc) {
        const std::int64_t c0 = gc * g.block_cols;
        const std::int64_t count = (r1 - r0) * (std::min(in.cols, c0 + g.block_cols) - c0);
        const auto k = static_cast<std::size_t>(gc);
        float mean = std::numeric_limits<float>::quiet_NaN();
        if (!bad[k]) {
          mean = static_cast<float>(sums[k] / static_cast<double>(count));
          lo = std::min(lo, static_cast<double>(mean));
          hi = std::max(hi, static_cast<double>(mean));
          g.any_finite = true;
        }
        g.values[static_cast<std::size_t>((h * g.rows + gr) * g.cols + gc)] = mean;
      }
    }
  }
  if (g.any_finite) {
    g.vmin = lo;
    g.vmax = hi;
  }
  return g;
}

Layout make_layout(const HeatmapInput& input, const Grid& grid) { return layout_of(input, grid); }

Rgb colour_of(const Grid& grid, double v) {
  if (!std::isfinite(v)) return kNonFiniteColour;
  return colormap(scale_position(grid, v));
}

void write_file_atomically(const std::string& option, const std::string& path,
                           const std::string& bytes) {
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument(option + ": cannot write " + posbias::quoted_name(path) + ": " +
                                why);
  };
  if (path.empty() || path.back() == '/') fail("not a file name");
  const std::size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("it is a directory");
  std::string temp = dir + "/." + base + ".tmp-XXXXXX";
  std::vector<char> name(temp.begin(), temp.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) fail(std::strerror(errno));
  temp = name.data();
  const auto cleanup_fail = [&](int error) {
    close(fd);
    unlink(temp.c_str());
    fail(std::strerror(error));
  };
  // mkstemp creates the file 0600; give it the usual permissions.
  const mode_t mask = umask(0);
  umask(mask);
  if (fchmod(fd, static_cast<mode_t>(0666 & ~mask)) != 0) cleanup_fail(errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      cleanup_fail(errno);
    }
    done += static_cast<std::size_t>(n);
  }
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    fail(std::strerror(error));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    fail(std::strerror(error));
  }
}

std::string write_heatmap(const std::string& option, const std::string& path,
                          const HeatmapInput& input) {
  Format format;
  try {
    format = format_of_path(path);
    check_drawable(input);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(option + ": " + e.what());
  }
  const Grid grid = make_grid(input);
  const Layout layout = layout_of(input, grid);
  std::string bytes;
  if (format == Format::kPng) {
    const std::vector<std::uint8_t> png = render_png(input, grid);
    bytes.assign(png.begin(), png.end());
  } else {
    bytes = render_svg(input, grid);
  }
  write_file_atomically(option, path, bytes);
  std::string what = std::to_string(grid.heads) + (grid.heads == 1 ? " panel" : " panels") + ", " +
                     std::to_string(layout.width) + "x" + std::to_string(layout.height) +
                     (format == Format::kPng ? " PNG" : " SVG");
  const std::string note = grid.downsample_note();
  if (!note.empty()) what += ", " + note;
  return what;
}

}  // namespace posbias::cli::plot
