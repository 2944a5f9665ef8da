// The script of `posbias demo` (demo.h), internal to cli/demo*.cc: the
// Demo class, whose sections print the seed documents' examples and check
// every claim as they print it. demo.cc holds the examples and pictures,
// demo_attention.cc the timed attention comparison in child processes.
#ifndef POSBIAS_CLI_DEMO_SCRIPT_H_
#define POSBIAS_CLI_DEMO_SCRIPT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "demo.h"
#include "plot.h"
#include "posbias/tensor.h"

namespace posbias::cli::demo {

/// "[8, 10, 10]".
std::string shape_text(const std::vector<std::int64_t>& shape);
/// "[0.25, 0.0625]", each value round-trip exact.
std::string list_text(const std::vector<float>& values);
/// Head h of a [heads, i, j] bias as a 2-D [i, j] tensor, for printing.
Tensor head(const Tensor& bias, std::int64_t h);
/// Same shape and the same values.
bool same_values(const Tensor& a, const Tensor& b);
/// Every value 0.
bool all_zero(const Tensor& t);
/// A [1, n, q, k] tensor (AlibiBias::build) as [n, q, k], for plotting.
Tensor drop_batch(const Tensor& t);
/// `v` with `digits` digits after the point.
std::string fixed(double v, int digits);
/// Bytes as "12.5 MiB".
std::string mib(double bytes);

class Demo {
 public:
  Demo(std::ostream& out, const DemoOptions& options) : out_(out), options_(options) {}

  /// Prints every section; 0, or 1 if a statement did not hold.
  int run();

 private:
  void say(const std::string& text) { out_ << text << "\n"; }
  void show(const Tensor& t) { out_ << format_tensor(t) << "\n"; }
  // A statement the text makes: printed when it holds, flagged if not.
  void check(bool holds, const std::string& what);

  // demo.cc
  void documentation_examples();
  void seed_example();
  void dpb_examples();
  void generic_builder();
  void inspecting_the_bias();
  void make_plot_dir();
  // Writes a heatmap into the folder and remembers it for the list at the end.
  void picture(const std::string& name, const plot::HeatmapInput& input, const std::string& what);

  // demo_attention.cc
  void fused_attention();

  std::ostream& out_;
  DemoOptions options_;
  std::vector<std::string> pictures_;
  int failures_ = 0;
};

}  // namespace posbias::cli::demo

#endif  // POSBIAS_CLI_DEMO_SCRIPT_H_
