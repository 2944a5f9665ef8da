// ALiBi's 16-bit outputs at long sequences (issue 7).
//
// The documented behaviour (include/posbias/dtype.h, docs/hardening.md):
// every value is computed in float32 and rounded once to the output dtype,
// to nearest even. For float16 that means a bias whose magnitude rounds past
// 65504 (|x| >= 65520) becomes -inf, exactly what PyTorch's
// `bias.to(torch.float16)` gives; 65504 <= |x| < 65520 gives -65504. These
// tests pin that down on every path that writes 16-bit output: the ALiBi
// kernel (vector and scalar tails), the module's cache (views), the
// custom-position path (DPB and T5: dpb_forward_test.cc, t5_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::round_to;

// -slope * |c - (j - i + r)| in float32, rounded once to dtype.
std::vector<float> alibi_rounded(const std::vector<float>& slopes, std::int64_t total,
                                 std::int64_t i, std::int64_t j, DType dtype) {
  std::vector<float> v;
  v.reserve(static_cast<std::size_t>(total * i * j));
  for (std::int64_t h = 0; h < total; ++h) {
    const float s = h < static_cast<std::int64_t>(slopes.size()) ? slopes[h] : 0.f;
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        const std::int64_t d = c - (j - i + r);
        v.push_back(round_to(dtype, -s * static_cast<float>(d < 0 ? -d : d) + 0.0f));
      }
    }
  }
  return v;
}

TEST(Precision, Float16AlibiPastItsRangeIsRoundedOnceToMinusInfinity) {
  // Slope 16: distance 4094 gives -65504 (float16's largest finite), 4095
  // gives -65520, which rounds to -inf; 4096.. are -inf. Odd lengths exercise
  // the kernel's scalar tails as well as its vectors.
  const std::vector<float> slopes = {16.f, 0.5f, 1.f / 256};
  for (std::int64_t j : {4095, 4096, 4101, 4133}) {
    const std::int64_t i = 3;
    const Tensor b = alibi_bias(slopes, 4, i, j, DType::kFloat16);
    const std::vector<float> got = b.to_float_vector();
    expect_bits_equal(got, alibi_rounded(slopes, 4, i, j, DType::kFloat16),
                      "float16 alibi j=" + std::to_string(j));
    // Row 2 is the last position j - 1: key c is at distance j - 1 - c.
    const float* row = got.data() + 2 * j;
    EXPECT_EQ(row[j - 1 - 4094], -65504.f);
    if (j > 4095) {  // distance 4095 exists
      EXPECT_EQ(row[j - 1 - 4095], -std::numeric_limits<float>::infinity());
      EXPECT_EQ(row[0], -std::numeric_limits<float>::infinity());
    } else {
      EXPECT_EQ(row[0], -65504.f);  // the largest distance, 4094
    }
    EXPECT_EQ(row[j - 1], 0.f);
    EXPECT_FALSE(std::signbit(row[j - 1]));  // +0, not -0
  }
}

TEST(Precision, Float16IntegerDistancesPast2048AreRoundedNotTruncated) {
  // float16 holds integers exactly only up to 2048; above, spacing 2, 4, ...
  // Slope 1 (the slope-free distances of get_bias) shows the rounding.
  AlibiPositionalBias m(1, std::nullopt, std::vector<float>{1.f}, DType::kFloat16);
  const Tensor b = m.get_bias(1, 9001);
  const std::vector<float> got = b.to_float_vector();
  expect_bits_equal(got, alibi_rounded({1.f}, 1, 1, 9001, DType::kFloat16), "get_bias");
  EXPECT_EQ(got[9000 - 2049], -2048.f);  // 2049 is a tie: to even, 2048
  EXPECT_EQ(got[9000 - 2051], -2052.f);  // 2051 is a tie: to even, 2052
  EXPECT_EQ(got[9000 - 4097], -4096.f);
}

TEST(Precision, BFloat16AlibiAtLongDistancesIsRoundedOnce) {
  // bfloat16 holds integers exactly only up to 256; it never overflows.
  const std::vector<float> slopes = alibi_slopes(8);
  const std::int64_t i = 2, j = 70001;
  expect_bits_equal(alibi_bias(slopes, 8, i, j, DType::kBFloat16).to_float_vector(),
                    alibi_rounded(slopes, 8, i, j, DType::kBFloat16), "bfloat16 alibi");
}

TEST(Precision, ModuleCacheServesTheSameRoundedValues) {
  // A float16 module past the float16 range: the stored bias and every
  // bottom-right view of it (decode after prefill) hold exactly the fresh
  // values, -inf entries included.
  const std::vector<float> slopes = {32.f, 2.f};
  AlibiPositionalBias m(2, 3, slopes, DType::kFloat16);
  const Tensor prefill = m.forward(5, 2600);
  expect_bits_equal(prefill.to_float_vector(), alibi_rounded(slopes, 3, 5, 2600, DType::kFloat16),
                    "prefill");
  ASSERT_EQ(m.cached_shape(), (std::vector<std::int64_t>{3, 5, 2600}));
  for (std::int64_t j : {2600, 2599, 2100, 7}) {
    const Tensor decode = m.forward(1, j);
    EXPECT_TRUE(decode.shares_storage_with(prefill)) << j;
    expect_bits_equal(decode.to_float_vector(), alibi_rounded(slopes, 3, 1, j, DType::kFloat16),
                      "decode j=" + std::to_string(j));
  }
  // The same module in bfloat16: finite everywhere.
  m.set_dtype(DType::kBFloat16);
  const Tensor bf = m.forward(2, 2600);
  for (float x : bf.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
  expect_bits_equal(bf.to_float_vector(), alibi_rounded(slopes, 3, 2, 2600, DType::kBFloat16),
                    "bfloat16 module");
}

TEST(Precision, CustomPositionsRoundOnceToo) {
  const std::vector<float> slopes = {8.f};
  const std::vector<std::int64_t> q = {0, 100000, 8188};
  const std::vector<std::int64_t> k = {0, 8187, 8188, 8189, 8190, 16380, 1 << 20};
  const std::vector<float> got =
      alibi_bias_custom_pos(slopes, 1, q, k, DType::kFloat16).to_float_vector();
  std::vector<float> want;
  for (std::int64_t qp : q) {
    for (std::int64_t kp : k) {
      const std::int64_t d = kp > qp ? kp - qp : qp - kp;
      want.push_back(round_to(DType::kFloat16, -8.f * static_cast<float>(d) + 0.0f));
    }
  }
  expect_bits_equal(got, want, "custom positions");
  EXPECT_EQ(got[3], -65504.f);                                 // distance 8188: 65504
  EXPECT_EQ(got[6], -std::numeric_limits<float>::infinity());  // 2^23
}

}  // namespace
}  // namespace posbias
