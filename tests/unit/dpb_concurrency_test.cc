// Many threads on a DynamicPositionBias module at once (issue 7): every result must equal a
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

#include "posbias/dpb.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::same_bits;

constexpr int kThreads = 8;

TEST(Concurrency, DynamicPositionBiasConstCallsFromManyThreads) {
  DpbOptions xt;
  xt.variant = DpbVariant::kXTransformers;
  xt.dim = 16;
  xt.heads = 4;
  xt.depth = 2;
  xt.log_distance = true;
  xt.norm = true;
  const DynamicPositionBias zeta(16, 4, /*seed=*/3);
  const DynamicPositionBias xtr(xt, /*seed=*/4);
  struct Want {
    std::vector<float> zf, xf, zt, xt, zb;
  };
  std::vector<Want> want;
  for (std::int64_t j = 1; j <= 24; ++j) {
    const std::int64_t i = (j + 1) / 2;
    want.push_back({zeta.forward(i, j).to_float_vector(), xtr.forward(i, j).to_float_vector(),
                    zeta.distance_table(j).to_float_vector(),
                    xtr.distance_table(j).to_float_vector(),
                    zeta.forward(i, j, DType::kBFloat16).to_float_vector()});
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 60; ++it) {
        const std::int64_t j = 1 + (t * 5 + it * 3) % 24;
        const std::int64_t i = (j + 1) / 2;
        const Want& w = want[static_cast<std::size_t>(j - 1)];
        if (!same_bits(zeta.forward(i, j).to_float_vector(), w.zf)) ++failures;
        if (!same_bits(xtr.forward(i, j).to_float_vector(), w.xf)) ++failures;
        if (!same_bits(zeta.distance_table(j).to_float_vector(), w.zt)) ++failures;
        if (!same_bits(xtr.distance_table(j).to_float_vector(), w.xt)) ++failures;
        if (!same_bits(zeta.forward(i, j, DType::kBFloat16).to_float_vector(), w.zb)) {
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
