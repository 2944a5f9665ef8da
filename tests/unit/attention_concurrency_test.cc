// Many threads on the fused attention kernel at once (issue 7): every result must equal a
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
#include <random>
#include <thread>
#include <vector>

#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::same_bits;

constexpr int kThreads = 8;

Tensor random_tensor(const std::vector<std::int64_t>& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.mutable_data<float>();
  for (std::int64_t k = 0; k < t.numel(); ++k) p[k] = u(rng);
  return t;
}

TEST(Concurrency, AttentionForwardFromSeveralThreads) {
  // Several threads run the fused kernel at once on shared inputs (read
  // only), each with its own bias kind; each result equals the result of
  // the same call made alone (same thread count, so bit for bit).
  const Tensor q = random_tensor({1, 4, 33, 16}, 1);
  const Tensor k = random_tensor({1, 2, 47, 16}, 2);
  const Tensor v = random_tensor({1, 2, 47, 16}, 3);
  const Tensor table = random_tensor({4, 2 * 47 - 1}, 4);
  const Tensor dense = random_tensor({1, 4, 33, 47}, 5);
  const std::vector<AttentionBias> biases = {
      AttentionBias::none(), AttentionBias::alibi(alibi_slopes(4)),
      AttentionBias::distance_table(table), AttentionBias::dense_bias(dense)};
  std::vector<std::vector<float>> want;
  for (const auto& bias : biases) {
    for (bool causal : {false, true}) {
      AttentionOptions opt;
      opt.causal = causal;
      want.push_back(attention_forward(q, k, v, bias, opt).to_float_vector());
    }
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 6; ++it) {
        const std::size_t c = static_cast<std::size_t>(t + it) % want.size();
        AttentionOptions opt;
        opt.causal = (c % 2) == 1;
        const Tensor out = attention_forward(q, k, v, biases[c / 2], opt);
        if (!same_bits(out.to_float_vector(), want[c])) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace posbias
