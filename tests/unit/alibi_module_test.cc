// AlibiPositionalBias (cache, views, zero heads, dtypes, threads) and the
// seed's AlibiBias builder.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "posbias/alibi.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;
using test::golden_dir;
using test::round_to;

std::vector<float> fresh(const AlibiPositionalBias& m, std::int64_t i, std::int64_t j) {
  return alibi_bias(m.slopes(), m.total_heads(), i, j, m.dtype()).to_float_vector();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (float_bits(a[k]) != float_bits(b[k])) return false;
  }
  return true;
}

TEST(AlibiPositionalBias, SeedExamplesHeads4Of8) {
  AlibiPositionalBias m(4, 8);
  EXPECT_EQ(m.heads(), 4);
  EXPECT_EQ(m.total_heads(), 8);
  EXPECT_EQ(m.slopes(), alibi_slopes(4));

  const Tensor a = m.forward(10, 10);
  ASSERT_EQ(a.shape(), (std::vector<std::int64_t>{8, 10, 10}));
  // Head 0 has slope 1/4: bias[0][r][c] = -|c - r| / 4.
  EXPECT_EQ(a.at({0, 0, 9}), -2.25f);
  EXPECT_EQ(a.at({0, 3, 1}), -0.5f);
  EXPECT_EQ(a.at({3, 9, 0}), -9.0f / 256.0f);
  // Heads 4..7 are the appended zero heads.
  for (std::int64_t h = 4; h < 8; ++h) EXPECT_EQ(a.at({h, 2, 7}), 0.0f);
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{8, 10, 10}));

  // (5, 5) is served from the stored bias: a view, no copy, exact.
  const Tensor b = m.forward(5, 5);
  EXPECT_TRUE(b.shares_storage_with(a));
  EXPECT_FALSE(b.is_contiguous());
  EXPECT_TRUE(same_bits(b.to_float_vector(), fresh(m, 5, 5)));

  // (8, 15): 8 queries that are the last 8 of 15 keys; computed and stored.
  const Tensor c = m.forward(8, 15);
  ASSERT_EQ(c.shape(), (std::vector<std::int64_t>{8, 8, 15}));
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_TRUE(same_bits(c.to_float_vector(), fresh(m, 8, 15)));
  EXPECT_EQ(c.at({0, 0, 7}), 0.0f);    // row 0 sits at position 15 - 8 = 7
  EXPECT_EQ(c.at({0, 0, 0}), -1.75f);  // 7 * 1/4
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{8, 8, 15}));
}

TEST(AlibiPositionalBias, CacheHitsAreBottomRightBlocksAndExact) {
  // Every sub-request of a stored bias, including decode rows (i = 1) and
  // i > j, equals a fresh build bit for bit.
  AlibiPositionalBias m(6, 7);
  const Tensor big = m.forward(12, 20);
  for (std::int64_t i = 0; i <= 12; ++i) {
    for (std::int64_t j = 0; j <= 20; ++j) {
      const Tensor t = m.forward(i, j);
      ASSERT_TRUE(t.shares_storage_with(big)) << i << "x" << j;
      ASSERT_TRUE(same_bits(t.to_float_vector(), fresh(m, i, j))) << i << "x" << j;
    }
  }
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{7, 12, 20}));
}

TEST(AlibiPositionalBias, DecodeAfterPrefillSeesFullKeyLength) {
  // zeta's top-left cache would return the wrong distances here.
  AlibiPositionalBias m(1, 1, {0.5f});
  m.forward(4, 4);
  const Tensor step = m.forward(1, 4);
  EXPECT_EQ(step.to_float_vector(), (std::vector<float>{-1.5f, -1.0f, -0.5f, 0.0f}));
  const Tensor two = m.forward(2, 3);
  EXPECT_EQ(two.to_float_vector(),
            (std::vector<float>{-0.5f, 0.0f, -0.5f, -1.0f, -0.5f, 0.0f}));
}

TEST(AlibiPositionalBias, ReplacementKeepsTheLargestAndOldResultsStayValid) {
  AlibiPositionalBias m(2, 2);
  const Tensor first = m.forward(4, 4);
  const std::vector<float> first_values = first.to_float_vector();
  const Tensor wide = m.forward(2, 10);  // miss: 40 elements >= 32, replaces
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{2, 2, 10}));
  const Tensor narrow = m.forward(3, 3);  // miss (3 rows > 2): 18 < 40, kept
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{2, 2, 10}));
  EXPECT_FALSE(narrow.shares_storage_with(wide));
  m.clear_cache();
  EXPECT_TRUE(m.cached_shape().empty());
  // A result handed out before replacement and clearing is still intact.
  EXPECT_TRUE(same_bits(first.to_float_vector(), first_values));
  EXPECT_EQ(first.storage_use_count(), 1);
}

TEST(AlibiPositionalBias, CacheLimitBoundsTheStoredBias) {
  AlibiPositionalBias m(4);
  m.set_cache_limit_bytes(4 * 8 * 8 * sizeof(float));
  m.forward(8, 8);
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{4, 8, 8}));
  const Tensor over = m.forward(9, 9);  // returned, not stored
  EXPECT_EQ(over.shape(), (std::vector<std::int64_t>{4, 9, 9}));
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{4, 8, 8}));
  m.set_cache_limit_bytes(0);
  EXPECT_TRUE(m.cached_shape().empty());
  EXPECT_EQ(m.cache_limit_bytes(), 0u);
}

TEST(AlibiPositionalBias, DtypesRoundOnceAndSlopesStayFloat32) {
  AlibiPositionalBias m(12, 16, DType::kFloat16);
  const std::vector<float> before = m.slopes();
  const Tensor h = m.forward(5, 3000);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  const std::vector<float> f32 = alibi_bias(m.slopes(), 16, 5, 3000).to_float_vector();
  const std::vector<float> got = h.to_float_vector();
  for (std::size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(float_bits(got[k]), float_bits(to_float(to_float16(f32[k])))) << k;
  }
  m.set_dtype(DType::kBFloat16);
  EXPECT_TRUE(m.cached_shape().empty());  // a dtype change drops the cache
  const Tensor b = m.forward(5, 3000);
  EXPECT_EQ(b.dtype(), DType::kBFloat16);
  const std::vector<float> gotb = b.to_float_vector();
  for (std::size_t k = 0; k < gotb.size(); ++k) {
    ASSERT_EQ(float_bits(gotb[k]), float_bits(to_float(to_bfloat16(f32[k])))) << k;
  }
  EXPECT_EQ(m.slopes(), before);
}

TEST(AlibiPositionalBias, GetBiasAndCustomPositions) {
  AlibiPositionalBias m(3, 5);
  const Tensor g = m.get_bias(2, 4);
  ASSERT_EQ(g.shape(), (std::vector<std::int64_t>{1, 2, 4}));
  EXPECT_EQ(g.to_float_vector(),
            (std::vector<float>{-2, -1, 0, -1, -3, -2, -1, 0}));
  const Tensor p = m.forward_custom_pos({2, 3}, {0, 1, 2, 3});
  EXPECT_TRUE(same_bits(p.to_float_vector(), m.forward(2, 4).to_float_vector()));
}

TEST(AlibiPositionalBias, BadArguments) {
  expect_throw_with<std::invalid_argument>([] { AlibiPositionalBias m(0); }, "got 0");
  expect_throw_with<std::invalid_argument>([] { AlibiPositionalBias m(-2, 4); }, "got -2");
  expect_throw_with<std::invalid_argument>([] { AlibiPositionalBias m(8, 4); },
                                           "total_heads = 4, heads = 8");
  expect_throw_with<std::invalid_argument>(
      [] { AlibiPositionalBias m(3, 4, {0.5f, 0.25f}); }, "expected 3 slopes");
  expect_throw_with<std::invalid_argument>(
      [] { AlibiPositionalBias m(2, 2, {0.5f, NAN}); }, "slope 1 is not finite");
  AlibiPositionalBias m(2);
  expect_throw_with<std::invalid_argument>([&] { m.forward(-1, 3); }, "i = -1");
  expect_throw_with<std::invalid_argument>([&] { m.get_bias(2, -3); }, "j = -3");
  expect_throw_with<std::length_error>([&] { m.forward(1 << 30, 1 << 30); }, "too large");
  expect_throw_with<std::length_error>([&] { m.forward(1 << 20, 1 << 20); }, "bytes, more than");
  EXPECT_TRUE(m.cached_shape().empty());
}

TEST(AlibiPositionalBias, ConcurrentCallersGetExactResults) {
  // Threads ask for mixed sizes (growing, hitting, replacing the cache) while
  // re-reading results they already hold.
  AlibiPositionalBias m(12, 16);
  std::vector<std::vector<std::vector<float>>> expected(40, std::vector<std::vector<float>>(40));
  for (std::int64_t i = 1; i < 40; i += 3) {
    for (std::int64_t j = 1; j < 40; j += 2) expected[i][j] = fresh(m, i, j);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<Tensor, std::vector<float>*>> held;
      for (int it = 0; it < 300; ++it) {
        const std::int64_t i = 1 + 3 * static_cast<std::int64_t>(rng() % 13);
        const std::int64_t j = 1 + 2 * static_cast<std::int64_t>(rng() % 19);
        Tensor r = m.forward(i, j);
        if (!same_bits(r.to_float_vector(), expected[i][j])) ++failures;
        held.emplace_back(r, &expected[i][j]);
        if (it % 17 == 0) m.clear_cache();
        if (held.size() > 8) {
          for (auto& [tensor, want] : held) {
            if (!same_bits(tensor.to_float_vector(), *want)) ++failures;
          }
          held.clear();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// ------------------------------------------------------------- AlibiBias

TEST(AlibiBiasBuilder, SeedWorkedExample) {
  // The "ALiBi" seed: slope -0.2, non-causal, three tokens.
  AlibiBias alibi(1, /*causal=*/false, {-0.2f});
  const Tensor b = alibi.build(3, 3);
  ASSERT_EQ(b.shape(), (std::vector<std::int64_t>{1, 1, 3, 3}));
  const std::vector<float> scores = {1, 2, 3, 2, 1.5f, 2.5f, 3, 2.5f, 1.2f};
  const std::vector<float> want = {1, 1.8f, 2.6f, 1.8f, 1.5f, 2.3f, 2.6f, 2.3f, 1.2f};
  const std::vector<float> bias = b.to_float_vector();
  for (std::size_t k = 0; k < 9; ++k) EXPECT_NEAR(scores[k] + bias[k], want[k], 1e-6f) << k;
  EXPECT_FLOAT_EQ(bias[1], -0.2f);
  EXPECT_FLOAT_EQ(bias[2], -0.4f);
}

TEST(AlibiBiasBuilder, DefaultSlopesAreTorchLinspace) {
  EXPECT_EQ(AlibiBias::default_slopes(1), std::vector<float>{-0.05f});
  // Values printed by torch.linspace(-0.05, -0.5, 4) (float32).
  const std::vector<float> four = AlibiBias::default_slopes(4);
  EXPECT_EQ(float_bits(four[0]), float_bits(-0.0500000007f));
  EXPECT_EQ(float_bits(four[1]), float_bits(-0.199999988f));
  EXPECT_EQ(float_bits(four[2]), float_bits(-0.350000024f));
  EXPECT_EQ(float_bits(four[3]), float_bits(-0.5f));
  EXPECT_EQ(AlibiBias(3).slopes(), AlibiBias::default_slopes(3));
}

TEST(AlibiBiasBuilder, CausalAndNonCausalTopLeft) {
  const std::vector<float> s = {-0.5f, -1.0f};
  for (bool causal : {true, false}) {
    AlibiBias alibi(2, causal, s);
    for (std::int64_t q : {0, 1, 4, 9}) {
      for (std::int64_t k : {0, 2, 4, 13}) {
        const Tensor b = alibi.build(q, k);
        ASSERT_EQ(b.shape(), (std::vector<std::int64_t>{1, 2, q, k}));
        for (std::int64_t h = 0; h < 2; ++h) {
          for (std::int64_t r = 0; r < q; ++r) {
            for (std::int64_t c = 0; c < k; ++c) {
              const std::int64_t d = causal ? std::max<std::int64_t>(r - c, 0) : std::llabs(r - c);
              ASSERT_EQ(float_bits(b.at({0, h, r, c})),
                        float_bits(s[h] * static_cast<float>(d)));
            }
          }
        }
      }
    }
  }
}

TEST(AlibiBiasBuilder, CacheIsKeyedByLengthsAndDtype) {
  AlibiBias alibi(2);
  const Tensor a = alibi.build(3, 4);
  EXPECT_TRUE(alibi.build(3, 4).shares_storage_with(a));
  const Tensor h = alibi.build(3, 4, DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_FALSE(h.shares_storage_with(a));
  EXPECT_FALSE(alibi.build(4, 3).shares_storage_with(a));
}

TEST(AlibiBiasBuilder, BadArguments) {
  expect_throw_with<std::invalid_argument>([] { AlibiBias a(0); }, "got 0");
  expect_throw_with<std::invalid_argument>([] { AlibiBias a(3, true, {-0.1f, -0.2f}); },
                                           "n_heads = 3");
  expect_throw_with<std::invalid_argument>([] { AlibiBias a(1, true, {NAN}); },
                                           "not finite");
  // An explicit empty list is an error, not the default schedule.
  expect_throw_with<std::invalid_argument>(
      [] { AlibiBias a(2, true, std::vector<float>{}); }, "n_heads = 2 entries, got 0");
  AlibiBias a(2);
  expect_throw_with<std::invalid_argument>([&] { a.build(-1, 2); }, "i = -1");
  // A head count whose default slope list alone would exhaust memory.
  expect_throw_with<std::invalid_argument>([] { AlibiBias huge(std::int64_t{1} << 40); },
                                           "must be <= 16777216, got 1099511627776");
}

TEST(AlibiBiasBuilder, EmptyBuildsWithHugeExtents) {
  // Zero elements: nothing to write, and no product of the other extents
  // (n_heads * q_len overflows int64 here) may be formed.
  AlibiBias a(4, false);
  const Tensor t = a.build(std::int64_t{1} << 62, 0);
  EXPECT_EQ(t.shape(), (std::vector<std::int64_t>{1, 4, std::int64_t{1} << 62, 0}));
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(a.build(0, std::int64_t{1} << 62).numel(), 0);
}

TEST(AlibiPositionalBias, EmptyResultsWithHugeTotalHeads) {
  // 2^40 zero heads: an empty request must not build a per-head list of
  // 2^40 entries (it threw std::bad_alloc), and a non-empty one is refused
  // for its size, with the shape in the message.
  const std::int64_t total = std::int64_t{1} << 40;
  AlibiPositionalBias m(1, total);
  EXPECT_EQ(m.forward(0, 0).shape(), (std::vector<std::int64_t>{total, 0, 0}));
  EXPECT_EQ(m.forward(0, 5).shape(), (std::vector<std::int64_t>{total, 0, 5}));
  EXPECT_EQ(m.forward_custom_pos({}, {1, 2, 3}).shape(), (std::vector<std::int64_t>{total, 0, 3}));
  expect_throw_with<std::length_error>([&] { m.forward(1, 1); }, "[1099511627776, 1, 1]");
}

}  // namespace
}  // namespace posbias
