// The public backward calls with the options of real batches:
// attention_backward (q_offset, window, softcap, key_mask, per-sequence
// slopes, a centred table longer or shorter than 2j - 1) and
// attention_varlen_backward (packed sequences), from the out and lse of the
// naive float64 forward (attention_backward_naive.h), against its float64
// gradients in the public layouts: grad_table [h, n] of the user's table,
// grad_slopes h or b * h. Then their bad input.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_backward_naive.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using namespace bwd_naive;  // NOLINT(google-build-using-namespace): the tests' vocabulary
using test::expect_throw_with;

Tensor int32_tensor(const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::kInt32);
  for (std::size_t e = 0; e < v.size(); ++e) {
    t.mutable_data<std::int32_t>()[e] = static_cast<std::int32_t>(v[e]);
  }
  return t;
}

std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> cu = {0};
  for (std::int64_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

struct PublicCall {
  Tensor q, k, v, dout, out, lse, cu_q, cu_k;
  AttentionBias bias;
  AttentionOptions opt;
};

// The public arguments of a problem, out and lse from the naive forward.
PublicCall public_call(const Problem& pb, const Data& in, const Naive& fw, DType mask_dtype) {
  PublicCall c;
  const std::int64_t b = pb.b(), h = pb.h, hk = pb.hk, d = pb.d, tq = pb.total_q();
  const Shape qs = pb.varlen ? Shape{tq, h, d} : Shape{b, h, pb.iq[0], d};
  const Shape ks = pb.varlen ? Shape{pb.total_k(), hk, d} : Shape{b, hk, pb.jk[0], d};
  c.q = Tensor::from_vector(qs, to_f(in.q));
  c.k = Tensor::from_vector(ks, to_f(in.k));
  c.v = Tensor::from_vector(ks, to_f(in.v));
  c.dout = Tensor::from_vector(qs, to_f(in.dout));
  c.out = Tensor::from_vector(qs, to_f(fw.out));
  // Naive lse is [token, h]: varlen wants [h, total_q], dense [b, h, i].
  std::vector<float> lse(fw.lse.size());
  for (std::int64_t t = 0; t < tq; ++t) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t i = pb.iq[0];
      const std::int64_t at = pb.varlen ? hh * tq + t : ((t / i) * h + hh) * i + t % i;
      lse[static_cast<std::size_t>(at)] =
          static_cast<float>(fw.lse[static_cast<std::size_t>(t * h + hh)]);
    }
  }
  c.lse = Tensor::from_vector(pb.varlen ? Shape{h, tq} : Shape{b, h, pb.iq[0]}, lse);
  if (pb.varlen) {
    c.cu_q = int32_tensor(offsets(pb.iq));
    c.cu_k = int32_tensor(offsets(pb.jk));
  } else {
    c.opt.q_offset = pb.q_offset;
  }
  c.opt.scale = pb.scale;
  c.opt.causal = pb.causal;
  c.opt.window = {pb.left, pb.right};
  c.opt.softcap = pb.softcap;
  if (pb.key_mask) {
    c.opt.key_mask = Tensor::empty({b, pb.jk[0]}, mask_dtype);
    std::copy(in.mask.begin(), in.mask.end(), c.opt.key_mask.mutable_data<std::uint8_t>());
  }
  if (pb.kind == AttentionBiasKind::kAlibi) c.bias = AttentionBias::alibi(to_f(in.slopes));
  if (pb.kind == AttentionBiasKind::kDistanceTable) {
    c.bias =
        AttentionBias::distance_table(Tensor::from_vector({h, 2 * pb.centre + 1}, to_f(in.table)));
  }
  return c;
}

AttentionGradients backward(const Problem& pb, const PublicCall& c) {
  if (pb.varlen) {
    return attention_varlen_backward(c.q, c.k, c.v, c.cu_q, c.cu_k, c.bias, c.opt, c.out, c.lse,
                                     c.dout);
  }
  return attention_backward(c.q, c.k, c.v, c.bias, c.opt, c.out, c.lse, c.dout);
}

void check_public(const Problem& pb, std::uint32_t seed, DType mask_dtype = DType::kUInt8) {
  SCOPED_TRACE(pb.name());
  const Data in = make_data(pb, seed);
  const Naive want = naive(pb, in);
  const PublicCall c = public_call(pb, in, want, mask_dtype);
  const AttentionGradients g = backward(pb, c);
  ASSERT_EQ(g.grad_q.shape(), c.q.shape());
  ASSERT_EQ(g.grad_k.shape(), c.k.shape());
  expect_near_all(g.grad_q.to_float_vector(), want.dq, "grad_q", 3e-5);
  expect_near_all(g.grad_k.to_float_vector(), want.dk, "grad_k", 3e-5);
  expect_near_all(g.grad_v.to_float_vector(), want.dv, "grad_v", 3e-5);
  if (pb.kind == AttentionBiasKind::kAlibi) {
    ASSERT_EQ(g.grad_slopes.size(), static_cast<std::size_t>(pb.slope_count()));
    expect_near_all(g.grad_slopes, want.dslopes, "grad_slopes", 3e-4);
  }
  if (pb.kind == AttentionBiasKind::kDistanceTable) {
    ASSERT_EQ(g.grad_table.shape(), (Shape{pb.h, 2 * pb.centre + 1}));
    expect_near_all(g.grad_table.to_float_vector(), want.dtable, "grad_table", 3e-5);
  }
}

TEST(AttentionBackwardPublic, DenseOptions) {
  Problem pb = dense_problem(2, 4, 2, 9, 14, 8);
  pb.q_offset = 3;
  pb.causal = true;
  pb.left = 6;
  pb.softcap = 2.5f;
  pb.kind = AttentionBiasKind::kAlibi;
  pb.per_seq_slopes = true;
  check_public(pb, 1);
  pb.per_seq_slopes = false;
  pb.key_mask = true;
  check_public(pb, 2, DType::kBool);
  // A table longer than 2j - 1, then one just covering the window.
  pb.kind = AttentionBiasKind::kDistanceTable;
  pb.centre = widest_distance(pb) + 4;
  check_public(pb, 3);
  pb.centre = pb.left;
  check_public(pb, 4);
  // Non-causal, a two-sided window, a wider shard offset.
  pb.causal = false;
  pb.right = 2;
  pb.q_offset = 20;
  pb.centre = 6;
  check_public(pb, 5);
}

TEST(AttentionBackwardPublic, VarlenOptions) {
  Problem pb = varlen_problem({7, 0, 30, 4}, {7, 3, 41, 2}, 4, 2, 8);
  for (bool causal : {false, true}) {
    pb.causal = causal;
    pb.softcap = causal ? 0.0f : 3.0f;
    pb.left = causal ? 5 : -1;
    pb.kind = AttentionBiasKind::kAlibi;
    for (bool per_seq : {false, true}) {
      pb.per_seq_slopes = per_seq;
      check_public(pb, 10 + causal * 2 + per_seq);
    }
    pb.kind = AttentionBiasKind::kDistanceTable;
    pb.centre = widest_distance(pb) + 1;
    check_public(pb, 20 + causal);
    pb.kind = AttentionBiasKind::kNone;
    check_public(pb, 30 + causal);
  }
}

TEST(AttentionBackwardPublic, SixteenBitKeysAndValuesWithFloat32Queries) {
  // llama.cpp's arrangement: k, v bfloat16 or float16, q float32; grad_k and
  // grad_v come back in k's dtype, rounded once.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (bool packed : {false, true}) {
      Problem pb =
          packed ? varlen_problem({6, 11}, {9, 11}, 4, 2, 8) : dense_problem(2, 4, 2, 7, 10, 8);
      pb.causal = true;
      pb.softcap = 3.0f;
      pb.kind = AttentionBiasKind::kAlibi;
      Data in = make_data(pb, 50 + packed);
      for (std::vector<double>* x : {&in.k, &in.v}) {
        for (double& e : *x) e = test::round_to(dt, static_cast<float>(e));
      }
      const Naive want = naive(pb, in);
      PublicCall c = public_call(pb, in, want, DType::kUInt8);
      c.k = c.k.to(dt);
      c.v = c.v.to(dt);
      const AttentionGradients g = backward(pb, c);
      ASSERT_EQ(g.grad_q.dtype(), DType::kFloat32);
      ASSERT_EQ(g.grad_k.dtype(), dt);
      ASSERT_EQ(g.grad_v.dtype(), dt);
      const double tol = dt == DType::kBFloat16 ? 1e-2 : 2e-3;
      expect_near_all(g.grad_q.to_float_vector(), want.dq, "grad_q", 3e-5);
      expect_near_all(g.grad_k.to_float_vector(), want.dk, "grad_k", tol);
      expect_near_all(g.grad_v.to_float_vector(), want.dv, "grad_v", tol);
      expect_near_all(g.grad_slopes, want.dslopes, "grad_slopes", 3e-4);
    }
  }
}

TEST(AttentionBackwardPublic, BadInputNamesTheValues) {
  Problem pb = varlen_problem({3, 4}, {3, 4}, 2, 1, 4);
  pb.causal = true;
  pb.kind = AttentionBiasKind::kAlibi;
  const Data in = make_data(pb, 40);
  const Naive fw = naive(pb, in);
  const PublicCall c = public_call(pb, in, fw, DType::kUInt8);
  auto varlen = [&](const PublicCall& x) {
    attention_varlen_backward(x.q, x.k, x.v, x.cu_q, x.cu_k, x.bias, x.opt, x.out, x.lse, x.dout);
  };
  PublicCall bad = c;
  bad.lse = Tensor::full({7, 2}, 0.0f);  // [total_q, h] rather than [h, total_q]
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "lse must be float32 [2, 7]");
  bad = c;
  bad.out = Tensor::full({7, 2, 5}, 0.0f);
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "out must be float32 [7, 2, 4]");
  bad = c;
  bad.dout = c.dout.to(DType::kBFloat16);
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "grad_out must be float32");
  bad = c;
  bad.cu_k = int32_tensor({0, 5, 4});
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "must not decrease");
  bad = c;
  bad.cu_q = int32_tensor({0, 3, 6});
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "must end at the token count 7");
  bad = c;
  bad.bias = AttentionBias::alibi(std::vector<float>(3, 0.5f));
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "got 3");
  bad = c;
  bad.opt.window = {-2, 0};
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "window entries must be >= -1");
  bad = c;
  bad.opt.softcap = -1.0f;
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "softcap must be finite");
  bad = c;
  bad.opt.q_offset = 0;
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "q_offset is for dense calls");
  bad = c;
  bad.bias = AttentionBias::distance_table(Tensor::full({2, 6}, 0.0f));
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "n odd");
  bad.bias = AttentionBias::distance_table(Tensor::full({2, 5}, 0.0f));  // reaches 2 of 3
  expect_throw_with<std::invalid_argument>([&] { varlen(bad); }, "longest visible distance 3");

  // Dense: a key mask of the wrong shape or dtype.
  Problem pd = dense_problem(1, 2, 1, 3, 5, 4);
  const Data din = make_data(pd, 41);
  const PublicCall dc = public_call(pd, din, naive(pd, din), DType::kUInt8);
  AttentionOptions opt = dc.opt;
  opt.key_mask = Tensor::empty({1, 4}, DType::kUInt8);
  expect_throw_with<std::invalid_argument>(
      [&] { attention_backward(dc.q, dc.k, dc.v, {}, opt, dc.out, dc.lse, dc.dout); },
      "key_mask must be bool or uint8 [b, j] = [1, 5]");
  opt.key_mask = Tensor::full({1, 5}, 1.0f);
  expect_throw_with<std::invalid_argument>(
      [&] { attention_backward(dc.q, dc.k, dc.v, {}, opt, dc.out, dc.lse, dc.dout); },
      "key_mask must be bool or uint8");
}

}  // namespace
}  // namespace posbias
