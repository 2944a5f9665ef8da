// 16-bit outputs at long sequences, and attention at extreme logits (issue 7).
//
// The documented behaviour (include/posbias/dtype.h, docs/hardening.md):
// every value is computed in float32 and rounded once to the output dtype,
// to nearest even. For float16 that means a bias whose magnitude rounds past
// 65504 (|x| >= 65520) becomes -inf, exactly what PyTorch's
// `bias.to(torch.float16)` gives; 65504 <= |x| < 65520 gives -65504. These
// tests pin that down on every path that writes 16-bit output: the ALiBi
// kernel (vector and scalar tails), the module's cache (views), the
// custom-position path, the Toeplitz expansion of DPB and T5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
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

TEST(Precision, DpbAndT5SixteenBitOutputsAreTheFloat32ValuesRoundedOnce) {
  const DynamicPositionBias dpb(8, 3, /*seed=*/11);
  const std::int64_t i = 3, j = 3000;
  const std::vector<float> f32 = dpb.forward(i, j).to_float_vector();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> want(f32.size());
    for (std::size_t e = 0; e < f32.size(); ++e) want[e] = round_to(dt, f32[e]);
    expect_bits_equal(dpb.forward(i, j, dt).to_float_vector(), want, "dpb " + dtype_name(dt));
  }
  // T5 with a scale that carries some buckets past float16's range.
  RelativePositionBias t5(3e4f, /*causal=*/false, 32, 128, 2, /*seed=*/5);
  const std::vector<float> t32 = t5.forward(2, 2500).to_float_vector();
  bool saw_inf = false;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> want(t32.size());
    for (std::size_t e = 0; e < t32.size(); ++e) want[e] = round_to(dt, t32[e]);
    const std::vector<float> got = t5.forward(2, 2500, dt).to_float_vector();
    expect_bits_equal(got, want, "t5 " + dtype_name(dt));
    for (float x : got) saw_inf = saw_inf || std::isinf(x);
  }
  EXPECT_TRUE(saw_inf) << "the T5 case no longer reaches float16's limit";
}

Tensor random_tensor(const std::vector<std::int64_t>& shape, float magnitude, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.mutable_data<float>();
  for (std::int64_t k = 0; k < t.numel(); ++k) p[k] = u(rng) * magnitude;
  return t;
}

// Every output element finite and inside [min, max] of v over its kv head
// (an output is a convex combination of value rows).
void expect_finite_convex(const Tensor& out, const Tensor& v, std::int64_t group,
                          const std::string& what) {
  const std::int64_t b = out.size(0), h = out.size(1), i = out.size(2), d = out.size(3);
  const std::int64_t j = v.size(2);
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      for (std::int64_t x = 0; x < d; ++x) {
        float lo = INFINITY, hi = -INFINITY;
        for (std::int64_t c = 0; c < j; ++c) {
          const float e = v.at({bb, hh / group, c, x});
          lo = std::fmin(lo, e);
          hi = std::fmax(hi, e);
        }
        for (std::int64_t r = 0; r < i; ++r) {
          const float o = out.at({bb, hh, r, x});
          ASSERT_TRUE(std::isfinite(o)) << what << " at " << bb << "," << hh << "," << r;
          ASSERT_GE(o, lo - 1e-6f * std::fabs(lo)) << what;
          ASSERT_LE(o, hi + 1e-6f * std::fabs(hi)) << what;
        }
      }
    }
  }
}

TEST(Precision, AttentionStaysFiniteWithLargeLogits) {
  // Scores of about 1e4, 1e12, 1e20 and 1e30 in float32 (q and k entries of
  // about sqrt(score / d * sqrt(d))): the online softmax subtracts the row
  // max, so nothing overflows; the fused kernel and the plain path agree.
  for (float score : {1e4f, 1e12f, 1e20f, 1e30f}) {
    const std::int64_t d = 16;
    const float mag = std::sqrt(score / 4.f);  // scale 1/4 = 1/sqrt(16)
    const Tensor q = random_tensor({1, 4, 9, d}, mag, 1);
    const Tensor k = random_tensor({1, 2, 37, d}, mag, 2);
    const Tensor v = random_tensor({1, 2, 37, d}, 1.f, 3);
    for (const AttentionBias& bias : {AttentionBias::none(), AttentionBias::alibi(alibi_slopes(4)),
                                      AttentionBias::alibi({1e30f, 1.f, 0.5f, 1e-30f})}) {
      for (bool causal : {false, true}) {
        AttentionOptions opt;
        opt.causal = causal;
        const Tensor out = attention_forward(q, k, v, bias, opt);
        const Tensor ref = attention_reference(q, k, v, bias, opt);
        const std::string what = "score " + std::to_string(score) + (causal ? " causal" : "");
        expect_finite_convex(out, v, 2, what);
        expect_finite_convex(ref, v, 2, what + " (reference)");
        if (score <= 1e4f) continue;  // rounding of 1e4 scores moves outputs by ~1e-3
        // Far past 1e4 the softmax is one-hot on the largest score in both.
        const std::vector<float> o = out.to_float_vector(), rr = ref.to_float_vector();
        for (std::size_t e = 0; e < o.size(); ++e) {
          ASSERT_NEAR(o[e], rr[e], 1e-5f) << what << " element " << e;
        }
      }
    }
  }
}

TEST(Precision, AttentionLargeLogitsInSixteenBitInputs) {
  // float16 inputs at their largest (|x| up to 65504): scores ~1e9 * d.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const Tensor q = random_tensor({1, 2, 5, 8}, 65000.f, 7).to(dt);
    const Tensor k = random_tensor({1, 2, 11, 8}, 65000.f, 8).to(dt);
    const Tensor v = random_tensor({1, 2, 11, 8}, 60000.f, 9).to(dt);
    for (bool causal : {false, true}) {
      AttentionOptions opt;
      opt.causal = causal;
      const Tensor out = attention_forward(q, k, v, AttentionBias::alibi(alibi_slopes(2)), opt);
      EXPECT_EQ(out.dtype(), dt);
      for (float x : out.to_float_vector()) ASSERT_TRUE(std::isfinite(x)) << dtype_name(dt);
    }
  }
}

TEST(Precision, FullyMaskedRowsAreZerosInBothPaths) {
  const Tensor q = random_tensor({2, 2, 6, 4}, 1.f, 11);
  const Tensor k = random_tensor({2, 2, 4, 4}, 1.f, 12);
  const Tensor v = random_tensor({2, 2, 4, 4}, 1.f, 13);
  // Causal with i > j: rows 0 and 1 (q_r = -2, -1) see no key.
  AttentionOptions causal;
  causal.causal = true;
  // A padding mask: row 3 of batch 1 masks every key (-inf), others are 0.
  Tensor mask = Tensor::full({2, 1, 6, 4}, 0.f);
  for (std::int64_t c = 0; c < 4; ++c) mask.mutable_data<float>()[(1 * 6 + 3) * 4 + c] = -INFINITY;
  for (const bool use_mask : {false, true}) {
    const AttentionBias bias =
        use_mask ? AttentionBias::dense_bias(mask) : AttentionBias::alibi(alibi_slopes(2));
    for (const Tensor& out :
         {attention_forward(q, k, v, bias, causal), attention_reference(q, k, v, bias, causal)}) {
      for (std::int64_t bb = 0; bb < 2; ++bb) {
        for (std::int64_t hh = 0; hh < 2; ++hh) {
          for (std::int64_t r = 0; r < 6; ++r) {
            const bool masked = r < 2 || (use_mask && bb == 1 && r == 3);
            for (std::int64_t x = 0; x < 4; ++x) {
              const float o = out.at({bb, hh, r, x});
              ASSERT_TRUE(std::isfinite(o));
              if (masked) {
                ASSERT_EQ(o, 0.f) << "row " << r << " batch " << bb;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace posbias
