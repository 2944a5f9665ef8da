// The backward's flushed blocks (src/kernels/attention_backward.cc): a
// (query block, key block) pair is skipped where a bound proves every P =
// exp(s - lse) exactly 0 and every value it would read finite. The
// gradients (dQ, dK, dV, the slopes') must keep every bit of the
// computation without the skip (POSBIAS_FLUSHED_TILES=0) on each vector
// width; the skip must happen where ALiBi's steep heads put whole blocks
// far below the diagonal (the kernel's counter), and never where it is not
// allowed (a distance table) or where a NaN would have reached a gradient
// through 0 * NaN (a NaN in a far value row, or in a row's dO).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "kernels/attention_backward.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::Shape;

// One backward's gradients as float vectors, and how many blocks it
// skipped.
struct Grads {
  std::vector<float> dq, dk, dv, dslopes;
  std::int64_t skipped = 0;
};

using Backward = std::function<AttentionGradients()>;

Grads RunOnce(const Backward& f) {
  const std::int64_t before = detail::backward_flushed_blocks();
  const AttentionGradients g = f();
  Grads out;
  out.skipped = detail::backward_flushed_blocks() - before;
  out.dq = g.grad_q.to_float_vector();
  out.dk = g.grad_k.to_float_vector();
  out.dv = g.grad_v.to_float_vector();
  out.dslopes = g.grad_slopes;
  return out;
}

using test::Skip;

// The call with and without the skip on each vector width: the same bits
// (test::expect_skip_keeps_bits).
void ExpectSameBits(const std::string& what, const Backward& f, Skip skip) {
  test::expect_skip_keeps_bits(
      what, skip, [&] { return RunOnce(f); },
      [&](const Grads& on, const Grads& off) {
        test::expect_bits_equal(on.dq, off.dq, what + " dq");
        test::expect_bits_equal(on.dk, off.dk, what + " dk");
        test::expect_bits_equal(on.dv, off.dv, what + " dv");
        test::expect_bits_equal(on.dslopes, off.dslopes, what + " dslopes");
      });
}

// Steep ALiBi heads (slopes 0.5 to 4) beside flat ones.
std::vector<float> MixedSlopes(std::int64_t h) {
  const float pick[] = {2.0f, 0.03f, 4.0f, 0.5f, 1.0f, 0.25f};
  std::vector<float> s;
  for (std::int64_t x = 0; x < h; ++x) s.push_back(pick[x % 6]);
  return s;
}

// A dense call's inputs, its forward's out and lse, and a gradient of the
// output.
struct DenseCall {
  Tensor q, k, v, out, lse, dout;
  AttentionBias bias = AttentionBias::none();
  AttentionOptions opt;
  Backward backward() const {
    const DenseCall c = *this;
    return [c] { return attention_backward(c.q, c.k, c.v, c.bias, c.opt, c.out, c.lse, c.dout); };
  }
  void forward() {
    const AttentionForwardResult r = attention_forward_lse(q, k, v, bias, opt);
    out = r.out;
    lse = r.lse;
  }
};

DenseCall Dense(std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j, std::int64_t d,
                DType dtype, std::uint32_t seed) {
  DenseCall c;
  c.q = test::random_tensor({1, h, i, d}, seed);
  c.k = test::random_tensor({1, hk, j, d}, seed + 1);
  c.v = test::random_tensor({1, hk, j, d}, seed + 2);
  c.dout = test::random_tensor({1, h, i, d}, seed + 3);
  if (dtype != DType::kFloat32) {
    c.q = c.q.to(dtype);
    c.k = c.k.to(dtype);
    c.v = c.v.to(dtype);
    c.dout = c.dout.to(dtype);
  }
  c.bias = AttentionBias::alibi(MixedSlopes(h));
  return c;
}

TEST(AttentionBackwardFlushed, DenseCallsKeepEveryBit) {
  struct Case {
    std::int64_t h, hk, i, j, d;
    bool causal;
    AttentionWindow window;
    std::int64_t q_offset;  // -1: the default (bottom-right)
    float softcap;
    DType dtype;
    bool mask;
  };
  const DType f32 = DType::kFloat32;
  const Case cases[] = {
      {2, 2, 300, 300, 64, true, {}, -1, 0.0f, f32, false},
      {3, 3, 260, 260, 40, false, {}, -1, 0.0f, f32, false},  // d not whole vectors
      {4, 2, 280, 280, 32, true, {}, -1, 0.0f, f32, false},   // grouped-query heads
      {2, 2, 200, 330, 64, true, {}, -1, 0.0f, f32, false},   // queries at the keys' end
      // Slope 0.5 (head 3): the first key block's P from every row is
      // between e^-65 and e^-33, not 0, and only far rows see it, so its dV
      // is tiny but not 0 (a threshold above -40 would skip it).
      {4, 4, 200, 330, 32, true, {}, -1, 0.0f, f32, false},
      {2, 2, 150, 400, 32, false, {120, 90}, -1, 0.0f, f32, false},
      {2, 2, 150, 400, 32, true, {}, 100, 0.0f, f32, false},  // q_offset
      {2, 2, 300, 300, 64, true, {}, -1, 5.0f, f32, false},   // soft-capped scores
      {2, 2, 250, 320, 32, false, {}, -1, 0.0f, f32, true},   // key mask
      {2, 2, 260, 260, 64, true, {}, -1, 0.0f, DType::kBFloat16, false},
      {2, 2, 260, 260, 48, true, {}, -1, 0.0f, DType::kFloat16, false},
  };
  std::uint32_t seed = 300;
  for (const Case& c : cases) {
    seed += 10;
    DenseCall call = Dense(c.h, c.hk, c.i, c.j, c.d, c.dtype, seed);
    call.opt.causal = c.causal;
    call.opt.window = c.window;
    if (c.q_offset >= 0) call.opt.q_offset = c.q_offset;
    call.opt.softcap = c.softcap;
    if (c.mask) {
      std::vector<float> m(static_cast<std::size_t>(c.j), 1.0f);
      for (std::int64_t x = 40; x < 77; ++x) m[static_cast<std::size_t>(x)] = 0.0f;
      call.opt.key_mask = Tensor::from_vector({1, c.j}, m).to(DType::kUInt8);
    }
    call.forward();
    const std::string what = "h " + std::to_string(c.h) + " hk " + std::to_string(c.hk) + " i " +
                             std::to_string(c.i) + " j " + std::to_string(c.j) + " d " +
                             std::to_string(c.d);
    ExpectSameBits(what, call.backward(), Skip::kMust);
    // No bias: these scores are within a few units of each other, so no P
    // is 0 and nothing is skipped (the test runs all the same).
    call.bias = AttentionBias::none();
    call.forward();
    ExpectSameBits(what + " no bias", call.backward(), Skip::kMustNot);
  }
}

TEST(AttentionBackwardFlushed, PackedSequencesKeepEveryBit) {
  const std::int64_t h = 4, hk = 2, d = 32;
  const std::vector<std::int32_t> cu = {0, 300, 340, 600};
  const std::int64_t total = cu.back();
  const Tensor cu_t =
      Tensor::from_vector({4}, std::vector<float>(cu.begin(), cu.end())).to(DType::kInt32);
  const Tensor q = test::random_tensor({total, h, d}, 41);
  const Tensor k = test::random_tensor({total, hk, d}, 42);
  const Tensor v = test::random_tensor({total, hk, d}, 43);
  const Tensor dout = test::random_tensor({total, h, d}, 44);
  const AttentionBias alibi = AttentionBias::alibi(MixedSlopes(h));
  AttentionOptions opt;
  opt.causal = true;
  const AttentionForwardResult fw = attention_varlen_forward_lse(q, k, v, cu_t, cu_t, alibi, opt);
  ExpectSameBits(
      "packed",
      [&] {
        return attention_varlen_backward(q, k, v, cu_t, cu_t, alibi, opt, fw.out, fw.lse, dout);
      },
      Skip::kMust);
}

TEST(AttentionBackwardFlushed, NonFiniteValuesAreNotSkipped) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A NaN in one far value row: the block holding it is computed (0 * NaN
  // is NaN in dP, which dS spreads to dQ and dK), for the heads of that kv
  // head; other blocks still skip.
  DenseCall call = Dense(2, 2, 300, 300, 32, DType::kFloat32, 500);
  call.opt.causal = true;
  call.forward();
  call.v.mutable_data<float>()[(0 * 300 + 5) * 32 + 3] = nan;  // kv head 0, key 5
  ExpectSameBits("NaN in a far value row", call.backward(), Skip::kMust);
  const Grads g = RunOnce(call.backward());
  // Query rows far below key 5 get NaN through their dS (head 0 only).
  EXPECT_TRUE(std::isnan(g.dq[static_cast<std::size_t>(299 * 32)]));
  EXPECT_FALSE(std::isnan(g.dq[static_cast<std::size_t>((300 + 299) * 32)]));
  // A NaN in one row's dO: that row's blocks are computed; its dV rows
  // (P^T dO) are NaN for the keys it sees with P > 0 or = 0 alike.
  DenseCall row = Dense(2, 2, 300, 300, 32, DType::kFloat32, 510);
  row.opt.causal = true;
  row.forward();
  row.dout.mutable_data<float>()[299 * 32 + 1] = nan;  // head 0, the last row
  ExpectSameBits("NaN in a row's dO", row.backward(), Skip::kMust);
  const Grads r = RunOnce(row.backward());
  EXPECT_TRUE(std::isnan(r.dv[1]));  // key 0's dV: 0 * NaN from the last row
}

TEST(AttentionBackwardFlushed, TablesDoNotSkip) {
  DenseCall call = Dense(2, 2, 300, 300, 32, DType::kFloat32, 520);
  call.opt.causal = true;
  std::vector<float> table(2 * 599);
  for (std::size_t x = 0; x < table.size(); ++x) {
    const auto dist = static_cast<float>(static_cast<std::int64_t>(x % 599) - 299);
    table[x] = -2.0f * std::abs(dist);  // ALiBi's steep head as a table
  }
  call.bias = AttentionBias::distance_table(Tensor::from_vector({2, 599}, table));
  call.forward();
  const Grads g = RunOnce(call.backward());
  EXPECT_EQ(g.skipped, 0);
}

}  // namespace
}  // namespace posbias
