// Requests whose output cannot fit in memory are refused before anything is
// allocated, with the size in the message (issue 7): ALiBi.
//
// "Before allocating" is checked by the sizes chosen: each request below
// would need terabytes or more, so an attempt to allocate would fail with
// std::bad_alloc (Release) or stop the process (AddressSanitizer refuses
// requests past its maximum), and a fill would never finish; the tests
// require std::length_error (or std::invalid_argument where the input is
// inconsistent) instead, naming the shape and the bytes.
// Requests that fit must not need much more memory than their output
// (peak resident growth, test::expect_little_more_memory_than_output).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;

constexpr std::int64_t kMillion = 1000000;

TEST(Limits, AlibiFreeFunctionsRefuseOutputsPastMemory) {
  const std::vector<float> slopes = alibi_slopes(64);
  // 64 x 1e6 x 1e6 float32: 2.56e14 bytes.
  expect_throw_with<std::length_error>(
      [&] { alibi_bias(slopes, 64, kMillion, kMillion); },
      "[64, 1000000, 1000000] (float32) needs 256000000000000 bytes");
  expect_throw_with<std::length_error>(
      [&] { alibi_bias(slopes, 64, kMillion, kMillion, DType::kFloat16); },
      "needs 128000000000000 bytes");
  // The element count itself overflows int64.
  expect_throw_with<std::length_error>(
      [&] { alibi_bias(slopes, std::int64_t{1} << 40, std::int64_t{1} << 40, 1 << 20); },
      "overflows int64");
  // Into caller memory: the size is checked before the (null) pointer.
  expect_throw_with<std::length_error>(
      [&] { alibi_bias_into(slopes, 64, kMillion, kMillion, DType::kFloat32, nullptr); },
      "256000000000000 bytes");
}

TEST(Limits, AlibiModuleRefusesAndKeepsItsCache) {
  AlibiPositionalBias m(64);
  const Tensor small = m.forward(4, 4);
  expect_throw_with<std::length_error>([&] { m.forward(kMillion, kMillion); },
                                       "256000000000000 bytes");
  expect_throw_with<std::length_error>([&] { m.get_bias(10 * kMillion, 10 * kMillion); },
                                       "[1, 10000000, 10000000]");
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{64, 4, 4}));
  AlibiBias seed(64);
  expect_throw_with<std::length_error>([&] { seed.build(kMillion, kMillion); },
                                       "256000000000000 bytes");
}

TEST(Limits, AlibiModuleCacheIsBoundedByCacheLimitBytes) {
  AlibiPositionalBias m(8);
  EXPECT_EQ(m.cache_limit_bytes(), std::size_t{1} << 30);  // documented default
  m.set_cache_limit_bytes(8 * 16 * 16 * 4);                // exactly [8, 16, 16] float32
  m.forward(16, 16);
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{8, 16, 16}));
  const Tensor bigger = m.forward(16, 17);  // one column more: returned, not stored
  EXPECT_EQ(bigger.shape(), (std::vector<std::int64_t>{8, 16, 17}));
  EXPECT_EQ(m.cached_shape(), (std::vector<std::int64_t>{8, 16, 16}));
  m.set_cache_limit_bytes(0);  // 0 disables storing
  m.clear_cache();
  m.forward(2, 2);
  EXPECT_TRUE(m.cached_shape().empty());
}

// Tall, narrow ALiBi outputs are written without a whole per-head table
// (see test::expect_little_more_memory_than_output).
TEST(Limits, AlibiNarrowOutputsNeedLittleMoreMemoryThanThemselves) {
  const std::int64_t n = 12 * kMillion;
  const std::vector<float> slope = {0.5f};
  test::expect_little_more_memory_than_output(
      n, {
             {"alibi_bias i=12e6 j=1", DType::kFloat32, [&] { return alibi_bias(slope, 1, n, 1); }},
             {"alibi_bias i=12e6 j=1 bf16", DType::kBFloat16,
              [&] { return alibi_bias(slope, 1, n, 1, DType::kBFloat16); }},
         });
}

}  // namespace
}  // namespace posbias
