// `posbias demo`: the usage examples of the three seed documents, run and
// explained, every claim checked as it is printed:
//  - the AlibiPositionalBias documentation (heads 4 of 8: (10, 10), (5, 5)
//    from the stored bias, (8, 15)) and a decode step;
//  - the "ALiBi" seed: its worked example on a 3x3 score table and its
//    generic AlibiBias builder, causal and not;
//  - the DynamicPositionBias documentation: (dim 64, heads 8), what
//    module(0, 5) really returns, and "Inspecting the bias";
//  - heatmaps of all of these, written to a folder named at the end;
//  - why the fused attention matters: attention at a long sequence with the
//    bias materialised and with the bias fused, time and peak memory, each
//    measured in a child process.
#ifndef POSBIAS_CLI_DEMO_H_
#define POSBIAS_CLI_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>

namespace posbias::cli {

/// What `posbias demo` can be asked to change.
struct DemoOptions {
  /// Folder for the pictures (created if missing).
  std::string plot_dir = "posbias-demo";
  /// Sequence length of the attention comparison (>= 64).
  std::int64_t attention_length = 4096;
  /// Timed runs per attention variant (>= 1); the median is reported.
  int repetitions = 3;
  /// Draw a progress bar on stderr (default: when stderr is a terminal).
  bool progress = false;
};

/// Writes the demo to `out`. Returns 0, or 1 if a claim did not hold (each
/// is then reported on `out` with the word UNEXPECTED). A folder that
/// cannot be created or written throws std::invalid_argument.
int run_demo(std::ostream& out, const DemoOptions& options = {});

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_DEMO_H_
