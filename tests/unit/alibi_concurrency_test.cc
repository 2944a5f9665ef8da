// Many threads on an ALiBi module at once (issue 7): every result must equal a
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
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::same_bits;

constexpr int kThreads = 8;
constexpr int kAlibiIterations = 150;

// Lengths the ALiBi tests draw from: i in {1, 4, .., 37}, j in {1, 3, .., 39}.
constexpr std::int64_t kRowSteps = 13, kColSteps = 20;
std::int64_t row_len(unsigned k) { return 1 + 3 * static_cast<std::int64_t>(k % kRowSteps); }
std::int64_t col_len(unsigned k) { return 1 + 2 * static_cast<std::int64_t>(k % kColSteps); }

// alibi_bias for every (i, j, dtype) the threads may ask for, built before
// they start.
struct AlibiExpected {
  std::vector<std::vector<float>> values;  // [dtype][i step][j step]
  AlibiExpected(const AlibiPositionalBias& m) {
    for (int d = 0; d < 3; ++d) {
      for (unsigned a = 0; a < kRowSteps; ++a) {
        for (unsigned b = 0; b < kColSteps; ++b) {
          values.push_back(
              alibi_bias(m.slopes(), m.total_heads(), row_len(a), col_len(b), static_cast<DType>(d))
                  .to_float_vector());
        }
      }
    }
  }
  const std::vector<float>& at(DType d, unsigned a, unsigned b) const {
    return values[(static_cast<std::size_t>(d) * kRowSteps + a % kRowSteps) * kColSteps +
                  b % kColSteps];
  }
};

TEST(Concurrency, AlibiModuleGrowHitReplaceWhileOthersReadHeldResults) {
  AlibiPositionalBias m(12, 16);
  const AlibiExpected expected(m);
  std::atomic<int> failures{0};
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(100 + t));
      std::vector<std::pair<Tensor, const std::vector<float>*>> held;
      for (int it = 0; it < kAlibiIterations; ++it) {
        // Threads 0-5 mostly grow from small sizes (hits and replacements);
        // thread 6 asks for the largest size (a stored bias all others hit);
        // thread 7 clears the cache and changes the cache limit.
        const auto a = static_cast<unsigned>(t == 6 ? kRowSteps - 1 : rng());
        const auto b = static_cast<unsigned>(t == 6 ? kColSteps - 1 : rng());
        if (t == 7 && it % 5 == 0) {
          if (it % 2 == 0) {
            m.clear_cache();
          } else {
            m.set_cache_limit_bytes(it % 3 == 0 ? 0 : std::size_t{1} << 30);
          }
        }
        Tensor r = m.forward(row_len(a), col_len(b));
        ++calls;
        const std::vector<float>& want = expected.at(DType::kFloat32, a, b);
        if (r.dtype() != DType::kFloat32 || !same_bits(r.to_float_vector(), want)) ++failures;
        held.emplace_back(std::move(r), &want);
        if (held.size() >= 6) {
          for (const auto& [tensor, w] : held) {
            if (!same_bits(tensor.to_float_vector(), *w)) ++failures;
          }
          held.clear();
        }
      }
      for (const auto& [tensor, w] : held) {
        if (!same_bits(tensor.to_float_vector(), *w)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(calls.load(), kThreads * kAlibiIterations);
}

TEST(Concurrency, AlibiModuleDtypeChangesNeverMixDtypes) {
  // set_dtype() drops the stored bias; a forward() racing with it returns
  // either dtype, but always a correct result of the dtype it reports.
  AlibiPositionalBias m(8);
  const AlibiExpected expected(m);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(200 + t));
      for (int it = 0; it < 200; ++it) {
        if (t == 0 && it % 4 == 0) m.set_dtype(static_cast<DType>((it / 4) % 3));
        const auto a = static_cast<unsigned>(rng()), b = static_cast<unsigned>(rng());
        const Tensor r = m.forward(row_len(a), col_len(b));
        if (!same_bits(r.to_float_vector(), expected.at(r.dtype(), a, b))) ++failures;
        if (t == 1 && it % 7 == 0) (void)m.cached_shape();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Concurrency, AlibiBiasBuilderAndFreeFunctions) {
  AlibiBias builder(6, /*causal=*/true);
  std::vector<std::vector<float>> want_build;
  for (std::int64_t n = 1; n <= 12; ++n) {
    want_build.push_back(AlibiBias(6, true).build(n, n + 3).to_float_vector());
  }
  const std::vector<float> slopes = alibi_slopes(6);
  const std::vector<float> want_custom =
      alibi_bias_custom_pos(slopes, 8, {5, 0, 9}, {1, 2, 3, 40}).to_float_vector();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 120; ++it) {
        const std::int64_t n = 1 + (t * 7 + it) % 12;
        if (!same_bits(builder.build(n, n + 3).to_float_vector(),
                       want_build[static_cast<std::size_t>(n - 1)])) {
          ++failures;
        }
        if (!same_bits(alibi_bias_custom_pos(slopes, 8, {5, 0, 9}, {1, 2, 3, 40}).to_float_vector(),
                       want_custom)) {
          ++failures;
        }
        std::vector<float> into(static_cast<std::size_t>(6 * n * (n + 3)));
        alibi_bias_into(slopes, 6, n, n + 3, DType::kFloat32, into.data());
        if (!same_bits(into, alibi_bias(slopes, 6, n, n + 3).to_float_vector())) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Concurrency, HeldViewsOutliveTheModule) {
  // A result handed out shares its storage: it stays valid after the module
  // itself is destroyed on another thread.
  auto m = std::make_unique<AlibiPositionalBias>(4);
  const Tensor big = m->forward(20, 30);
  const Tensor view = m->forward(5, 7);  // a view into the stored bias
  const std::vector<float> want = alibi_bias(alibi_slopes(4), 4, 5, 7).to_float_vector();
  std::thread killer([&] { m.reset(); });
  killer.join();
  EXPECT_TRUE(same_bits(view.to_float_vector(), want));
  EXPECT_EQ(big.shape(), (std::vector<std::int64_t>{4, 20, 30}));
}

}  // namespace
}  // namespace posbias
