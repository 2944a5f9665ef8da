// Many threads on a RelativePositionBias module at once (issue 7): every result must equal a
// fresh single-threaded build bit for bit, results already handed out must
// stay valid while the cache is grown, hit, replaced, cleared and retyped,
// and ThreadSanitizer must report nothing (the *_concurrency_test.cc files
// also make posbias_concurrency_tests, which a -fsanitize=thread build runs:
// ctest -L sanitize, scripts/test.sh).
//
// The threads here are std::threads. Under TSan the OpenMP team inside the
// kernels is kept at one thread (OMP_NUM_THREADS=1 in scripts/test.sh):
// Debian's libgomp is not built with TSan, so its barriers look like races to
// it (docs/hardening.md).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::same_bits;

constexpr int kThreads = 8;

TEST(Concurrency, RelativePositionBiasConstCallsFromManyThreads) {
  const RelativePositionBias t5(0.5f, /*causal=*/false, 32, 128, 4, /*seed=*/9);
  std::vector<std::vector<float>> want;
  for (std::int64_t j = 1; j <= 30; ++j) want.push_back(t5.forward(j / 2, j).to_float_vector());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 80; ++it) {
        const std::int64_t j = 1 + (t * 11 + it) % 30;
        if (!same_bits(t5.forward(j / 2, j).to_float_vector(),
                       want[static_cast<std::size_t>(j - 1)])) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace posbias
