// `posbias demo`: the usage examples of the AlibiPositionalBias documentation
// (heads 4 of 8: (10, 10), (5, 5) from the stored bias, (8, 15)), a decode
// step, and the worked example of the "ALiBi" seed, each printed with a few
// sentences on what it shows. Every claim the text makes is checked as it is
// printed.
#ifndef POSBIAS_CLI_DEMO_H_
#define POSBIAS_CLI_DEMO_H_

#include <ostream>

namespace posbias::cli {

/// Writes the demo to `out`. Returns 0, or 1 if a claim did not hold (each
/// is then reported on `out` with the word UNEXPECTED).
int run_demo(std::ostream& out);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_DEMO_H_
