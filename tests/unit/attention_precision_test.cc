// Attention at extreme logits and in fully masked rows (issue 7): the online
// softmax subtracts the row max, so nothing overflows, outputs stay convex
// combinations of value rows, and rows that see no key are zeros, in the
// fused kernel and the plain path alike.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias {
namespace {

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

// float32 queries with a 16-bit cache: the rows are widened in registers
// (F16C on AVX2, lane by lane below), so float16 subnormals, values near
// its maximum and a NaN must come out as the scalar conversion gives them,
// on every instruction set, on the decode path (i = 1, grouped heads, d
// with a vector tail) and the blocked one (i = 9).
TEST(Precision, SixteenBitCacheWithFloat32QueriesOnEveryTarget) {
  // d = 43 packs the blocked path's value rows; d = 48 (whole vectors on
  // every target) has P V read them in place, in their dtype.
  for (DType kvt : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t i : {1, 9}) {
      for (std::int64_t d : {43, 48}) {
        const std::int64_t h = 4, hk = 2, j = 70;
        const Tensor q = random_tensor({1, h, i, d}, 1.0f, 71);
        Tensor kf = random_tensor({1, hk, j, d}, 1.0f, 72);
        Tensor vf = random_tensor({1, hk, j, d}, 1.0f, 73);
        float* kp = kf.mutable_data<float>();
        float* vp = vf.mutable_data<float>();
        kp[5 * d + 1] = 3.0e-6f;               // a float16 subnormal
        vp[6 * d + 40] = 60000.0f;             // near float16's maximum, in the tail lanes
        vp[(j + 11) * d + 2] = -5.0e-7f;       // kv head 1: another subnormal
        kp[(j + 20) * d + 7] = std::nanf("");  // kv head 1: its query heads' rows are NaN
        const Tensor k = kf.to(kvt), v = vf.to(kvt);
        AttentionOptions opt;
        const AttentionBias bias = AttentionBias::alibi(alibi_slopes(h));
        const std::vector<float> want = attention_reference(q, k, v, bias, opt).to_float_vector();
        for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
          hwy::SetSupportedTargetsForTest(target);
          const Tensor out = attention_forward(q, k, v, bias, opt);
          EXPECT_EQ(out.dtype(), DType::kFloat32);
          SCOPED_TRACE(hwy::TargetName(target) + std::string(" ") + dtype_name(kvt) + " i " +
                       std::to_string(i) + " d " + std::to_string(d));
          const std::vector<float> got = out.to_float_vector();
          ASSERT_EQ(got.size(), want.size());
          std::int64_t nans = 0;
          for (std::size_t x = 0; x < got.size(); ++x) {
            if (std::isnan(want[x])) {
              ++nans;
              EXPECT_TRUE(std::isnan(got[x])) << x;
            } else {
              EXPECT_NEAR(got[x], want[x], 1e-5 + 1e-4 * std::fabs(want[x])) << x;
            }
          }
          EXPECT_EQ(nans, 2 * i * d);  // query heads 2 and 3 see the NaN key
        }
        hwy::SetSupportedTargetsForTest(0);
      }
    }
  }
}

}  // namespace
}  // namespace posbias
