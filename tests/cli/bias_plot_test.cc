// Heatmaps of biases (cli/bias_plot.h over cli/plot/plot.h) and `posbias
// alibi|dpb|t5 --plot`: the values drawn (equal to the library's forward()),
// the PNG read back with libpng, the SVG's structure, and the bad inputs
// (exit code 2, one line, no file left behind).
#include "bias_plot.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"
#include "plot.h"
#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"

namespace posbias::cli {
namespace {

struct ToolRun {
  int code = 0;
  std::string out, err;
};

ToolRun run_tool(std::vector<std::string> args) {
  args.insert(args.begin(), "posbias");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  ToolRun r;
  r.code = run(static_cast<int>(argv.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A fresh empty directory per test.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/posbias-plot-test-XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempDir() {
    for (const std::string& f : files()) std::remove((path_ + "/" + f).c_str());
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    DIR* d = opendir(path_.c_str());
    while (dirent* e = d ? readdir(d) : nullptr) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    if (d) closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
  plot::Rgb at(int x, int y) const {
    const std::size_t k = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                           static_cast<std::size_t>(x)) *
                          3;
    return {rgb[k], rgb[k + 1], rgb[k + 2]};
  }
};

// Reads a PNG (file or memory) back with libpng's simplified API, as RGB.
Decoded decode_png(const std::string& bytes) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  Decoded d;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    ADD_FAILURE() << "not a PNG: " << image.message;
    return d;
  }
  image.format = PNG_FORMAT_RGB;
  d.width = static_cast<int>(image.width);
  d.height = static_cast<int>(image.height);
  d.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, d.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "PNG decoding failed: " << image.message;
  }
  return d;
}

std::size_t count_colour(const Decoded& d, plot::Rgb c) {
  std::size_t n = 0;
  for (int y = 0; y < d.height; ++y) {
    for (int x = 0; x < d.width; ++x) n += d.at(x, y) == c;
  }
  return n;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Every row of a Toeplitz source against the library's forward().
void expect_rows_equal(const ToeplitzBias& b, const Tensor& forward) {
  ASSERT_EQ(forward.shape(), (std::vector<std::int64_t>{b.heads, b.i, b.j}));
  std::vector<float> row(static_cast<std::size_t>(b.j));
  for (std::int64_t h = 0; h < b.heads; ++h) {
    for (std::int64_t r = 0; r < b.i; ++r) {
      b.row(h, r, row.data());
      const std::vector<float> want =
          forward.slice(0, h, h + 1).slice(1, r, r + 1).to_float_vector();
      ASSERT_EQ(row, want) << "head " << h << " row " << r;
    }
  }
}

// ----------------------------------------------------- values as drawn

TEST(Plot, ToeplitzRowsEqualForward) {
  for (auto [i, j] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {10, 10}, {5, 5}, {8, 15}, {1, 15}, {7, 3}, {1, 1}}) {
    const AlibiPositionalBias alibi(4, 8);
    expect_rows_equal(alibi_toeplitz(alibi, i, j, DType::kFloat32), alibi.forward(i, j));
    const AlibiPositionalBias alibi12(12, 12, DType::kBFloat16);
    expect_rows_equal(alibi_toeplitz(alibi12, i, j, DType::kBFloat16), alibi12.forward(i, j));
    const RelativePositionBias t5(0.5f, (i + j) % 2 == 0, 8, 16, 3, 7);
    expect_rows_equal(t5_toeplitz(t5, i, j, DType::kFloat32), t5.forward(i, j));
    expect_rows_equal(t5_toeplitz(t5, i, j, DType::kFloat16), t5.forward(i, j, DType::kFloat16));
    if (i <= j) {
      const DynamicPositionBias zeta(16, 3, 5);
      expect_rows_equal(dpb_toeplitz(zeta, i, j, DType::kFloat32), zeta.forward(i, j));
      DpbOptions o;
      o.dim = 8;
      o.heads = 2;
      o.variant = DpbVariant::kXTransformers;
      o.log_distance = true;
      const DynamicPositionBias xt(o, 9);
      expect_rows_equal(dpb_toeplitz(xt, i, j, DType::kBFloat16),
                        xt.forward(i, j, DType::kBFloat16));
    }
  }
  EXPECT_THROW(dpb_toeplitz(DynamicPositionBias(4, 2, 0), 6, 5, DType::kFloat32),
               std::invalid_argument);
}

TEST(Plot, PngCellsHaveTheColourOfTheirValues) {
  const AlibiPositionalBias module(2, 3);
  const ToeplitzBias b = alibi_toeplitz(module, 4, 6, DType::kFloat32);
  const plot::HeatmapInput in =
      toeplitz_heatmap(b, "t", alibi_panel_titles(module.slopes(), module.total_heads()));
  const plot::Grid g = plot::make_grid(in);
  const plot::Layout l = plot::make_layout(in, g);
  const std::vector<std::uint8_t> png = plot::render_png(in, g);
  const Decoded d = decode_png(std::string(png.begin(), png.end()));
  ASSERT_EQ(d.width, l.width);
  ASSERT_EQ(d.height, l.height);
  ASSERT_EQ(l.panels.size(), 3u);
  const Tensor forward = module.forward(4, 6);
  EXPECT_EQ(g.vmin, -static_cast<double>(module.slopes()[0]) * 5);  // farthest key 5 away
  EXPECT_EQ(g.vmax, 0.0);
  for (std::int64_t h = 0; h < 3; ++h) {
    const plot::Rect& p = l.panels[static_cast<std::size_t>(h)];
    EXPECT_EQ(p.w, 6 * l.cell_w);
    EXPECT_EQ(p.h, 4 * l.cell_h);
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 6; ++c) {
        const double v = forward.at({h, r, c});
        const plot::Rgb want = plot::colormap((v - g.vmin) / (g.vmax - g.vmin));
        EXPECT_EQ(d.at(p.x + c * l.cell_w + l.cell_w / 2, p.y + r * l.cell_h + l.cell_h / 2), want)
            << "head " << h << " cell " << r << "," << c;
      }
    }
  }
  // The colour bar runs from the top colour to the bottom colour.
  EXPECT_EQ(d.at(l.colorbar.x + 5, l.colorbar.y), plot::colormap(1 - 0.5 / l.colorbar.h));
  EXPECT_EQ(d.at(l.colorbar.x + 5, l.colorbar.y + l.colorbar.h - 1),
            plot::colormap(0.5 / l.colorbar.h));
  EXPECT_FALSE(l.colorbar_ticks.empty());
}

// ------------------------------------------------------- the tool

TEST(PlotTool, AlibiPngDecodesWithTheValuesColours) {
  TempDir dir;
  const std::string file = dir.file("alibi.png");
  // One head, slope 1, 3 x 3: values 0 (diagonal, 3 cells), -1 (4), -2 (2).
  const ToolRun r = run_tool({"alibi", "--slopes", "1", "-i", "3", "-j", "3", "--plot", file});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("wrote " + file + ": 1 panel, "), std::string::npos) << r.out;
  const Decoded d = decode_png(read_file(file));
  int w = 0, h = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + r.out.find("panel, ") + 7, "%dx%d", &w, &h), 2) << r.out;
  EXPECT_EQ(d.width, w);
  EXPECT_EQ(d.height, h);
  // 3 x 3 cells of 85 x 85 pixels (256 / 3).
  const std::size_t cell = 85 * 85;
  EXPECT_GE(count_colour(d, plot::colormap(1.0)), 3 * cell);
  EXPECT_LT(count_colour(d, plot::colormap(1.0)), 3 * cell + 100);  // + the colour bar
  EXPECT_GE(count_colour(d, plot::colormap(0.5)), 4 * cell);
  EXPECT_GE(count_colour(d, plot::colormap(0.0)), 2 * cell);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"alibi.png"});
}

TEST(PlotTool, SvgHasPanelsTitlesColourBarAndTheValues) {
  TempDir dir;
  const std::string file = dir.file("bias.SVG");  // the extension in any case
  const ToolRun r = run_tool(
      {"alibi", "--heads", "4", "--total-heads", "8", "-i", "8", "-j", "15", "--plot", file});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string svg = read_file(file);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<g class=\"panel\""), 8u);
  EXPECT_EQ(count(svg, "class=\"panel-title\""), 8u);
  EXPECT_NE(svg.find(">head 0, slope 0.25</text>"), std::string::npos);
  EXPECT_NE(svg.find(">head 3, slope 0.00390625</text>"), std::string::npos);
  EXPECT_NE(svg.find(">head 7, no bias</text>"), std::string::npos);
  EXPECT_NE(svg.find("AlibiPositionalBias(heads=4, total_heads=8).forward(8, 15)</text>"),
            std::string::npos);
  EXPECT_EQ(count(svg, ">query position</text>"), 8u);
  EXPECT_EQ(count(svg, ">key position</text>"), 8u);
  EXPECT_EQ(count(svg, "<g class=\"colorbar\">"), 1u);
  EXPECT_EQ(count(svg, "<stop "), 33u);
  EXPECT_GE(count(svg, "class=\"colorbar-tick\""), 3u);
  EXPECT_NE(svg.find(">-3</text>"), std::string::npos);  // range [-3.5, 0], step 1
  EXPECT_EQ(svg.find("downsampled"), std::string::npos);

  // Each panel's embedded image: 15 x 8 pixels, one per value, coloured on
  // the shared scale [-3.5, 0] (head 0's farthest key is 14 away, slope 0.25).
  const Tensor forward = AlibiPositionalBias(4, 8).forward(8, 15);
  const std::string marker = "data:image/png;base64,";
  std::size_t at = 0;
  for (std::int64_t h = 0; h < 8; ++h) {
    at = svg.find(marker, at);
    ASSERT_NE(at, std::string::npos);
    at += marker.size();
    const std::string b64 = svg.substr(at, svg.find('"', at) - at);
    std::string bytes;
    std::uint32_t buffer = 0;
    int bits = 0;
    for (char ch : b64) {
      const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      const char* p = std::strchr(alphabet, ch);
      if (ch == '=' || !p) break;
      buffer = (buffer << 6) | static_cast<std::uint32_t>(p - alphabet);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        bytes += static_cast<char>((buffer >> bits) & 0xff);
      }
    }
    const Decoded d = decode_png(bytes);
    ASSERT_EQ(d.width, 15);
    ASSERT_EQ(d.height, 8);
    for (int row = 0; row < 8; ++row) {
      for (int c = 0; c < 15; ++c) {
        const double v = forward.at({h, row, c});
        EXPECT_EQ(d.at(c, row), plot::colormap((v + 3.5) / 3.5)) << h << " " << row << " " << c;
      }
    }
  }
}

TEST(PlotTool, LargeMatricesAreDownsampledAndSaySo) {
  TempDir dir;
  const ToolRun r = run_tool(
      {"alibi", "--heads", "2", "-i", "1024", "-j", "2048", "--plot", dir.file("big.svg")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("downsampled 1024x2048 -> 256x256 by block mean"), std::string::npos)
      << r.out;
  EXPECT_NE(read_file(dir.file("big.svg"))
                .find(">downsampled 1024x2048 -&gt; 256x256 by block mean</text>"),
            std::string::npos);
}

TEST(PlotTool, DpbAndT5) {
  TempDir dir;
  ToolRun r = run_tool({"dpb", "--dim", "16", "--heads", "3", "-i", "5", "-j", "9", "--seed", "2",
                        "--plot", dir.file("dpb.svg")});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string svg = read_file(dir.file("dpb.svg"));
  EXPECT_EQ(count(svg, "<g class=\"panel\""), 3u);
  EXPECT_NE(svg.find(">head 2</text>"), std::string::npos);
  EXPECT_NE(svg.find("DynamicPositionBias(dim=16, heads=3).forward(5, 9)"), std::string::npos);
  r = run_tool(
      {"t5", "--heads", "2", "-i", "6", "-j", "4", "--causal", "--plot", dir.file("t5.png")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(decode_png(read_file(dir.file("t5.png"))).width, 0);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"dpb.svg", "t5.png"}));
}

struct BadPlot {
  std::vector<std::string> args;  // "@" is replaced by the temp directory
  std::string message;
};

TEST(PlotTool, BadInputExits2WithOneLineAndNoFile) {
  const std::vector<BadPlot> cases = {
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/x.jpg"},
       "--plot: unknown image format \".jpg\""},
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/x"},
       "unknown image format (no extension)"},
      {{"dpb", "--dim", "4", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/x.gif"},
       "must end in .png or .svg"},
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/no/such/dir/x.png"},
       "cannot write \"@/no/such/dir/x.png\": No such file or directory"},
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot",
        "@/" + std::string(3000, 'n') + "/x.png"},
       " bytes): "},  // a long path is shown shortened, with its length
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/x." + std::string(3000, 'g')},
       " bytes) of \""},
      {{"alibi", "--heads", "2", "-i", "3", "-j", "3", "--plot", "@/"},
       "--plot: unknown image format"},
      {{"alibi", "--heads", "8", "-i", "100000", "-j", "100000", "--plot", "@/x.png"},
       "too large to draw: 8 heads of 100000 x 100000"},
      {{"alibi", "--heads", "1", "-i", "1000000000000", "-j", "5", "--plot", "@/x.png"},
       "too large to draw: 1 heads of 1000000000000 x 5"},
      {{"t5", "--heads", "1", "-i", "3", "-j", "9000000000000000000", "--plot", "@/x.svg"},
       "too large to draw"},
      {{"dpb", "--dim", "4", "--heads", "1", "-i", "5", "-j", "4000000000", "--plot", "@/x.svg"},
       "too large to draw"},
      {{"alibi", "--heads", "65", "-i", "4", "-j", "4", "--plot", "@/x.png"},
       "too many heads to draw"},
      {{"alibi", "--heads", "2", "-i", "0", "-j", "5", "--plot", "@/x.svg"}, "nothing to draw"},
      {{"dpb", "--dim", "8", "--heads", "8", "-i", "0", "-j", "5", "--plot", "@/x.png"},
       "nothing to draw"},
      {{"dpb", "--dim", "8", "--heads", "2", "-i", "6", "-j", "5", "--plot", "@/x.png"}, "i"},
      {{"dpb", "--dim", "8", "--heads", "2", "--save", "@/w.st", "--plot", "@/x.png"},
       "-i is required with --plot"},
      {{"dpb", "--dim", "8", "--heads", "2", "-j", "5", "--table", "--plot", "@/x.png"},
       "--plot draws forward(i, j), not --table"},
      {{"t5", "--heads", "2", "-i", "3", "-j", "3", "--buckets", "--plot", "@/x.png"}, "excludes"},
  };
  for (const BadPlot& c : cases) {
    TempDir dir;
    std::vector<std::string> args = c.args;
    std::string message = c.message;
    for (std::string* s : {&args.back(), &message}) {
      const std::size_t at = s->find('@');
      if (at != std::string::npos) s->replace(at, 1, dir.path());
    }
    for (std::string& a : args) {
      if (a.rfind("@/", 0) == 0) a.replace(0, 1, dir.path());
    }
    const ToolRun r = run_tool(args);
    EXPECT_EQ(r.code, 2) << args.back();
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("posbias: error: ", 0), 0u) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    EXPECT_LT(r.err.size(), 600u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_TRUE(dir.files().empty()) << args.back() << ": left " << dir.files().front();
  }
}

TEST(PlotTool, AFailedPlotLeavesAnExistingFileAlone) {
  TempDir dir;
  const std::string file = dir.file("keep.png");
  { std::ofstream(file) << "old"; }
  const ToolRun r =
      run_tool({"alibi", "--heads", "8", "-i", "70000", "-j", "70000", "--plot", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(read_file(file), "old");
  EXPECT_EQ(dir.files(), std::vector<std::string>{"keep.png"});
  // A directory in the way.
  ASSERT_EQ(mkdir(dir.file("sub.svg").c_str(), 0755), 0);
  const ToolRun in_the_way =
      run_tool({"alibi", "--heads", "1", "-i", "2", "-j", "2", "--plot", dir.file("sub.svg")});
  EXPECT_EQ(in_the_way.code, 2);
  EXPECT_NE(in_the_way.err.find("it is a directory"), std::string::npos) << in_the_way.err;
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"keep.png", "sub.svg"}));
  rmdir(dir.file("sub.svg").c_str());
  // A successful one replaces it, with the usual permissions (not mkstemp's 0600).
  const ToolRun ok = run_tool({"alibi", "--heads", "1", "-i", "2", "-j", "2", "--plot", file});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(read_file(file).substr(1, 3), "PNG");
  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & S_IRGRP, 0u);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"keep.png"});
}

}  // namespace
}  // namespace posbias::cli
