#include "bench_suite.h"

#include <stdexcept>

namespace posbias::bench {

std::vector<std::string> suite_names() { return {"alibi"}; }

std::vector<CaseResult> run_suite(const std::string& suite,
                                  const BenchOptions& /*options*/,
                                  std::ostream& /*out*/) {
  throw std::invalid_argument("unknown benchmark suite '" + suite + "' (not written yet)");
}

}  // namespace posbias::bench
