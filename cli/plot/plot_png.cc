// The heatmap as a PNG: the layout of make_layout drawn into an RGB raster
// (text in the bitmap font of plot_font.cc), encoded with libpng.
#include <png.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "plot.h"
#include "plot_draw.h"

namespace posbias::cli::plot {

using namespace detail;

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const auto k = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                  static_cast<std::size_t>(x)) *
                 3;
  rgb[k] = c.r;
  rgb[k + 1] = c.g;
  rgb[k + 2] = c.b;
}

void Image::fill_rect(int x, int y, int w, int h, Rgb c) {
  for (int yy = std::max(0, y); yy < std::min(height, y + h); ++yy) {
    for (int xx = std::max(0, x); xx < std::min(width, x + w); ++xx) set(xx, yy, c);
  }
}

std::vector<std::uint8_t> encode_png(const Image& image) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.rgb.data(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    throw std::runtime_error("PNG encoding failed: " + message);
  }
  std::vector<std::uint8_t> bytes(size);
  if (!png_image_write_to_memory(&png, bytes.data(), &size, 0, image.rgb.data(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    throw std::runtime_error("PNG encoding failed: " + message);
  }
  bytes.resize(size);
  return bytes;
}

std::vector<std::uint8_t> render_png(const HeatmapInput& in, const Grid& g) {
  const Layout l = make_layout(in, g);
  Image img;
  img.width = l.width;
  img.height = l.height;
  img.rgb.assign(static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3,
                 255);
  draw_text(img, kPad, kPad, in.title, kScale, kInk);
  const std::string note = g.downsample_note();
  if (!note.empty()) draw_text(img, kPad, kPad + kLine, note, kScale, kInk);

  for (std::int64_t h = 0; h < g.heads; ++h) {
    const Rect& p = l.panels[static_cast<std::size_t>(h)];
    draw_text(img, p.x, p.y - kLine + 2, in.panel_titles[static_cast<std::size_t>(h)], kScale,
              kInk);
    for (std::int64_t r = 0; r < g.rows; ++r) {
      for (std::int64_t c = 0; c < g.cols; ++c) {
        img.fill_rect(p.x + static_cast<int>(c) * l.cell_w, p.y + static_cast<int>(r) * l.cell_h,
                      l.cell_w, l.cell_h, colour_of(g, g.at(h, r, c)));
      }
    }
    // Frame just outside the panel.
    img.fill_rect(p.x - 1, p.y - 1, p.w + 2, 1, kFrame);
    img.fill_rect(p.x - 1, p.y + p.h, p.w + 2, 1, kFrame);
    img.fill_rect(p.x - 1, p.y - 1, 1, p.h + 2, kFrame);
    img.fill_rect(p.x + p.w, p.y - 1, 1, p.h + 2, kFrame);
    // Column ticks below, row ticks on the left.
    for (std::int64_t pos : l.col_ticks) {
      const int x = p.x + tick_offset(pos, g.block_cols, l.cell_w);
      img.fill_rect(x, p.y + p.h + 1, 1, kTickLength, kFrame);
      const std::string label = std::to_string(pos);
      draw_text(img, x - text_width(label, kScale) / 2, p.y + p.h + kTickLength + 4, label, kScale,
                kInk);
    }
    for (std::int64_t pos : l.row_ticks) {
      const int y = p.y + tick_offset(pos, g.block_rows, l.cell_h);
      img.fill_rect(p.x - 1 - kTickLength, y, kTickLength, 1, kFrame);
      const std::string label = std::to_string(pos);
      draw_text(img, p.x - kTickLength - 4 - text_width(label, kScale), y - 7 * kScale / 2, label,
                kScale, kInk);
    }
    draw_text(img, p.x + (p.w - text_width(in.col_label, kScale)) / 2,
              p.y + p.h + kTickLength + kLine + 4, in.col_label, kScale, kInk);
    const int label_x = p.x - kTickLength - 6 - row_tick_width(l) - 7 * kScale - 4;
    const std::string row_label = fitting_label(in.row_label, p.h);
    const int label_len = text_width(row_label, kScale);
    draw_text(img, label_x, p.y + (p.h + label_len) / 2, row_label, kScale, kInk,
              /*rotated=*/true);
  }

  // Colour bar: top = the largest value.
  const Rect& cb = l.colorbar;
  draw_text(img, cb.x, cb.y - kLine - 4, in.value_label, kScale, kInk);
  for (int y = 0; y < cb.h; ++y) {
    const double t = 1 - (static_cast<double>(y) + 0.5) / cb.h;
    img.fill_rect(cb.x, cb.y + y, cb.w, 1, colormap(t));
  }
  img.fill_rect(cb.x - 1, cb.y - 1, cb.w + 2, 1, kFrame);
  img.fill_rect(cb.x - 1, cb.y + cb.h, cb.w + 2, 1, kFrame);
  img.fill_rect(cb.x - 1, cb.y - 1, 1, cb.h + 2, kFrame);
  img.fill_rect(cb.x + cb.w, cb.y - 1, 1, cb.h + 2, kFrame);
  for (double v : l.colorbar_ticks) {
    const int y = colorbar_y(l, scale_position(g, v));
    img.fill_rect(cb.x + cb.w + 1, y, kTickLength, 1, kFrame);
    draw_text(img, cb.x + cb.w + kTickLength + 4, y - 7 * kScale / 2, format_value(v), kScale,
              kInk);
  }
  return encode_png(img);
}

}  // namespace posbias::cli::plot
