// The heatmap as SVG: text as SVG text, each panel's cells as an embedded
// PNG drawn pixelated, the colour bar as a gradient.
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "plot.h"
#include "plot_draw.h"

namespace posbias::cli::plot {
namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string base64(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t k = 0; k < bytes.size(); k += 3) {
    const std::uint32_t b0 = bytes[k];
    const std::uint32_t b1 = k + 1 < bytes.size() ? bytes[k + 1] : 0;
    const std::uint32_t b2 = k + 2 < bytes.size() ? bytes[k + 2] : 0;
    const std::uint32_t n = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += k + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += k + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

std::string hex(Rgb c) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", c.r, c.g, c.b);
  return text;
}

}  // namespace

using namespace detail;

std::string render_svg(const HeatmapInput& in, const Grid& g) {
  const Layout l = make_layout(in, g);
  std::ostringstream s;
  const char* font = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" xmlns:xlink=\"http://www.w3.org/1999/xlink\" "
    << "width=\"" << l.width << "\" height=\"" << l.height << "\" viewBox=\"0 0 " << l.width << " "
    << l.height << "\">\n";
  s << "<title>" << xml_escape(in.title) << "</title>\n";
  s << "<defs><linearGradient id=\"colormap\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (int k = 0; k <= 32; ++k) {
    const double t = k / 32.0;
    s << "  <stop offset=\"" << format_value(t) << "\" stop-color=\"" << hex(colormap(t))
      << "\"/>\n";
  }
  s << "</linearGradient></defs>\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  s << "<text class=\"figure-title\" x=\"" << kPad << "\" y=\"" << kPad + 14 << "\" " << font
    << " font-size=\"16\" font-weight=\"bold\">" << xml_escape(in.title) << "</text>\n";
  const std::string note = g.downsample_note();
  if (!note.empty()) {
    s << "<text class=\"downsample-note\" x=\"" << kPad << "\" y=\"" << kPad + kLine + 14 << "\" "
      << font << " font-size=\"14\">" << xml_escape(note) << "</text>\n";
  }
  for (std::int64_t h = 0; h < g.heads; ++h) {
    const Rect& p = l.panels[static_cast<std::size_t>(h)];
    // The panel's cells as a small PNG (one pixel per cell), scaled up
    // without smoothing.
    Image cells;
    cells.width = static_cast<int>(g.cols);
    cells.height = static_cast<int>(g.rows);
    cells.rgb.resize(static_cast<std::size_t>(g.rows * g.cols) * 3);
    for (std::int64_t r = 0; r < g.rows; ++r) {
      for (std::int64_t c = 0; c < g.cols; ++c) {
        cells.set(static_cast<int>(c), static_cast<int>(r), colour_of(g, g.at(h, r, c)));
      }
    }
    s << "<g class=\"panel\" data-head=\"" << h << "\">\n";
    s << "  <text class=\"panel-title\" x=\"" << p.x << "\" y=\"" << p.y - 6 << "\" " << font
      << " font-size=\"14\">" << xml_escape(in.panel_titles[static_cast<std::size_t>(h)])
      << "</text>\n";
    s << "  <image class=\"heatmap\" x=\"" << p.x << "\" y=\"" << p.y << "\" width=\"" << p.w
      << "\" height=\"" << p.h << "\" preserveAspectRatio=\"none\" "
      << "style=\"image-rendering:pixelated;image-rendering:crisp-edges\" "
      << "xlink:href=\"data:image/png;base64," << base64(encode_png(cells)) << "\"/>\n";
    s << "  <rect class=\"frame\" x=\"" << p.x - 0.5 << "\" y=\"" << p.y - 0.5 << "\" width=\""
      << p.w + 1 << "\" height=\"" << p.h + 1 << "\" fill=\"none\" stroke=\"" << hex(kFrame)
      << "\"/>\n";
    for (std::int64_t pos : l.col_ticks) {
      const int x = p.x + tick_offset(pos, g.block_cols, l.cell_w);
      s << "  <line x1=\"" << x + 0.5 << "\" y1=\"" << p.y + p.h + 1 << "\" x2=\"" << x + 0.5
        << "\" y2=\"" << p.y + p.h + 1 + kTickLength << "\" stroke=\"" << hex(kFrame) << "\"/>\n";
      s << "  <text class=\"tick\" x=\"" << x << "\" y=\"" << p.y + p.h + kTickLength + 16 << "\" "
        << font << " font-size=\"12\" text-anchor=\"middle\">" << pos << "</text>\n";
    }
    for (std::int64_t pos : l.row_ticks) {
      const int y = p.y + tick_offset(pos, g.block_rows, l.cell_h);
      s << "  <line x1=\"" << p.x - 1 - kTickLength << "\" y1=\"" << y + 0.5 << "\" x2=\""
        << p.x - 1 << "\" y2=\"" << y + 0.5 << "\" stroke=\"" << hex(kFrame) << "\"/>\n";
      s << "  <text class=\"tick\" x=\"" << p.x - kTickLength - 4 << "\" y=\"" << y + 4 << "\" "
        << font << " font-size=\"12\" text-anchor=\"end\">" << pos << "</text>\n";
    }
    s << "  <text class=\"axis-label\" x=\"" << p.x + p.w / 2 << "\" y=\""
      << p.y + p.h + kTickLength + kLine + 16 << "\" " << font
      << " font-size=\"13\" text-anchor=\"middle\">" << xml_escape(in.col_label) << "</text>\n";
    const int ly = p.y + p.h / 2;
    const int label_x = p.x - kTickLength - 6 - row_tick_width(l) - 7 * kScale / 2 - 4;
    s << "  <text class=\"axis-label\" x=\"" << label_x << "\" y=\"" << ly << "\" " << font
      << " font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 " << label_x << " " << ly
      << ")\">" << xml_escape(fitting_label(in.row_label, p.h, 8)) << "</text>\n";
    s << "</g>\n";
  }
  const Rect& cb = l.colorbar;
  s << "<g class=\"colorbar\">\n";
  s << "  <text class=\"colorbar-label\" x=\"" << cb.x << "\" y=\"" << cb.y - 8 << "\" " << font
    << " font-size=\"13\">" << xml_escape(in.value_label) << "</text>\n";
  s << "  <rect x=\"" << cb.x << "\" y=\"" << cb.y << "\" width=\"" << cb.w << "\" height=\""
    << cb.h << "\" fill=\"url(#colormap)\" stroke=\"" << hex(kFrame) << "\"/>\n";
  for (double v : l.colorbar_ticks) {
    const int y = colorbar_y(l, scale_position(g, v));
    s << "  <line x1=\"" << cb.x + cb.w << "\" y1=\"" << y + 0.5 << "\" x2=\""
      << cb.x + cb.w + kTickLength << "\" y2=\"" << y + 0.5 << "\" stroke=\"" << hex(kFrame)
      << "\"/>\n";
    s << "  <text class=\"colorbar-tick\" x=\"" << cb.x + cb.w + kTickLength + 4 << "\" y=\""
      << y + 4 << "\" " << font << " font-size=\"12\">" << format_value(v) << "</text>\n";
  }
  s << "</g>\n</svg>\n";
  return s.str();
}

}  // namespace posbias::cli::plot
