// float64 attention (issue 18): q, k, v float64 take the core's reference
// path in double. Every public call (forward, forward_lse, varlen, KV cache
// dense and paged, the dense and varlen backwards) against the tests' naive
// double formulas (attention_backward_naive.h) to 1e-12, over every option
// and bias kind with grouped-query heads; against the float32 path to float32
// rounding; the backward's independence of the thread count; and the
// refusals of mixed dtypes and of float64 bias pieces in other calls.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_backward_naive.h"
#include "posbias/attention.h"

namespace posbias {
namespace {

using namespace bwd_naive;  // NOLINT(google-build-using-namespace): the tests' vocabulary

constexpr double kTol = 1e-12;

Tensor f64_tensor(const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  if (!values.empty()) std::memcpy(t.mutable_data<double>(), values.data(), values.size() * 8);
  return t;
}

std::vector<double> values64(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat64);
  const Tensor c = t.contiguous_copy();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// |got - want| <= tol (1 + max |want|) elementwise.
void expect_near64(const std::vector<double>& got, const std::vector<double>& want,
                   const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0.0;
  for (double w : want) mx = std::max(mx, std::fabs(w));
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (!(std::fabs(got[e] - want[e]) <= tol * (1.0 + mx))) {
      FAIL() << what << ": element " << e << " is " << got[e] << ", expected " << want[e];
    }
  }
}

// Data with values that float32 cannot hold (a double perturbation), so a
// float32 step anywhere shows at 1e-12.
Data make_data64(const Problem& pb, std::uint32_t seed) {
  Data in = make_data(pb, seed);
  std::mt19937 gen(seed + 100);
  std::uniform_real_distribution<double> tiny(-1e-6, 1e-6);
  for (std::vector<double>* x : {&in.q, &in.k, &in.v, &in.dout, &in.slopes, &in.table, &in.dense}) {
    for (double& e : *x) e += tiny(gen);
  }
  return in;
}

AttentionBias bias_of(const Problem& pb, const Data& in, bool table_f32 = false) {
  switch (pb.kind) {
    case AttentionBiasKind::kAlibi:
      return AttentionBias::alibi_f64(in.slopes);
    case AttentionBiasKind::kDistanceTable: {
      const Shape ts{pb.h, 2 * pb.centre + 1};
      if (table_f32) {
        return AttentionBias::distance_table(
            Tensor::from_vector(ts, std::vector<float>(in.table.begin(), in.table.end())));
      }
      return AttentionBias::distance_table(f64_tensor(ts, in.table));
    }
    case AttentionBiasKind::kDense:
      return AttentionBias::dense_bias(f64_tensor({pb.b(), pb.h, pb.iq[0], pb.jk[0]}, in.dense));
    case AttentionBiasKind::kNone:
      break;
  }
  return AttentionBias::none();
}

AttentionOptions options_of(const Problem& pb, const Data& in) {
  AttentionOptions o;
  o.scale = pb.scale;
  o.causal = pb.causal;
  o.window = AttentionWindow{pb.left, pb.right};
  o.softcap = pb.softcap;
  if (!pb.varlen) o.q_offset = pb.q_offset;
  if (pb.key_mask) {
    Tensor m = Tensor::empty({pb.b(), pb.jk[0]}, DType::kUInt8);
    std::memcpy(m.mutable_data<std::uint8_t>(), in.mask.data(), in.mask.size());
    o.key_mask = m;
  }
  return o;
}

Shape q_shape(const Problem& pb) {
  return pb.varlen ? Shape{pb.total_q(), pb.h, pb.d} : Shape{pb.b(), pb.h, pb.iq[0], pb.d};
}
Shape k_shape(const Problem& pb) {
  return pb.varlen ? Shape{pb.total_k(), pb.hk, pb.d} : Shape{pb.b(), pb.hk, pb.jk[0], pb.d};
}

Tensor cu_tensor(const Problem& pb, bool keys) {
  Tensor t = Tensor::empty({pb.b() + 1}, DType::kInt32);
  for (std::int64_t s = 0; s <= pb.b(); ++s) {
    t.mutable_data<std::int32_t>()[s] = static_cast<std::int32_t>(keys ? pb.cu_k(s) : pb.cu_q(s));
  }
  return t;
}

// The naive lse [token, h] in the core's layout (dense [b, h, i], varlen [h, total_q]).
std::vector<double> lse_layout(const Problem& pb, const std::vector<double>& lse) {
  std::vector<double> out(lse.size());
  const std::int64_t tq = pb.total_q(), h = pb.h;
  for (std::int64_t t = 0; t < tq; ++t) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t at =
          pb.varlen ? hh * tq + t : ((t / pb.iq[0]) * h + hh) * pb.iq[0] + t % pb.iq[0];
      out[static_cast<std::size_t>(at)] = lse[static_cast<std::size_t>(t * h + hh)];
    }
  }
  return out;
}

struct CallResult {
  AttentionForwardResult fw;
  AttentionGradients g;
};

CallResult run_public(const Problem& pb, const Data& in, bool table_f32 = false) {
  const Tensor q = f64_tensor(q_shape(pb), in.q), k = f64_tensor(k_shape(pb), in.k),
               v = f64_tensor(k_shape(pb), in.v), go = f64_tensor(q_shape(pb), in.dout);
  const AttentionBias bias = bias_of(pb, in, table_f32);
  const AttentionOptions opt = options_of(pb, in);
  CallResult r;
  if (pb.varlen) {
    const Tensor cq = cu_tensor(pb, false), ck = cu_tensor(pb, true);
    r.fw = attention_varlen_forward_lse(q, k, v, cq, ck, bias, opt);
    r.g = attention_varlen_backward(q, k, v, cq, ck, bias, opt, r.fw.out, r.fw.lse, go);
  } else {
    r.fw = attention_forward_lse(q, k, v, bias, opt);
    r.g = attention_backward(q, k, v, bias, opt, r.fw.out, r.fw.lse, go);
  }
  return r;
}

void check_against_naive(const Problem& pb, std::uint32_t seed, bool table_f32 = false) {
  SCOPED_TRACE(pb.name() + (table_f32 ? " (float32 table)" : ""));
  Data in = make_data64(pb, seed);
  if (table_f32) {
    for (double& e : in.table) e = static_cast<float>(e);
  }
  const Naive want = naive(pb, in);
  const CallResult r = run_public(pb, in, table_f32);
  ASSERT_EQ(r.fw.out.dtype(), DType::kFloat64);
  ASSERT_EQ(r.fw.lse.dtype(), DType::kFloat64);
  expect_near64(values64(r.fw.out), want.out, "out");
  const std::vector<double> lse = values64(r.fw.lse), lse_want = lse_layout(pb, want.lse);
  for (std::size_t e = 0; e < lse.size(); ++e) {
    if (std::isinf(lse_want[e])) {
      EXPECT_EQ(lse[e], lse_want[e]) << "lse " << e;
    } else {
      EXPECT_NEAR(lse[e], lse_want[e], kTol * (1.0 + std::fabs(lse_want[e]))) << "lse " << e;
    }
  }
  expect_near64(values64(r.g.grad_q), want.dq, "grad_q");
  expect_near64(values64(r.g.grad_k), want.dk, "grad_k");
  expect_near64(values64(r.g.grad_v), want.dv, "grad_v");
  switch (pb.kind) {
    case AttentionBiasKind::kAlibi:
      expect_near64(r.g.grad_slopes_f64, want.dslopes, "grad_slopes_f64");
      ASSERT_EQ(r.g.grad_slopes.size(), want.dslopes.size());
      for (std::size_t e = 0; e < want.dslopes.size(); ++e) {
        EXPECT_EQ(r.g.grad_slopes[e], static_cast<float>(r.g.grad_slopes_f64[e]));
      }
      break;
    case AttentionBiasKind::kDistanceTable:
      expect_near64(values64(r.g.grad_table), want.dtable, "grad_table");
      break;
    case AttentionBiasKind::kDense:
      expect_near64(values64(r.g.grad_dense), want.ddense, "grad_dense");
      break;
    case AttentionBiasKind::kNone:
      break;
  }
}

std::vector<Problem> with_kinds(Problem base) {
  std::vector<Problem> out;
  for (auto kind : {AttentionBiasKind::kNone, AttentionBiasKind::kAlibi,
                    AttentionBiasKind::kDistanceTable, AttentionBiasKind::kDense}) {
    if (kind == AttentionBiasKind::kDense && base.varlen) continue;
    for (bool per_seq : {false, true}) {
      if (per_seq && kind != AttentionBiasKind::kAlibi) continue;
      Problem pb = base;
      pb.kind = kind;
      pb.per_seq_slopes = per_seq;
      pb.centre = widest_distance(pb) + 2;
      out.push_back(pb);
    }
  }
  return out;
}

TEST(AttentionFloat64, DenseMatchesNaiveOverOptionsAndBiasKinds) {
  std::uint32_t seed = 1;
  for (int variant = 0; variant < 6; ++variant) {
    Problem base = dense_problem(2, 4, 2, 5, 7, 6);
    if (variant == 1) base.causal = true;
    if (variant == 2) base.q_offset = -2, base.causal = true;  // rows before the first key
    if (variant == 3) base.left = 2, base.right = 1;
    if (variant == 4) base.softcap = 1.5f, base.key_mask = true;
    if (variant == 5) base.q_offset = 4, base.causal = true, base.left = 3, base.softcap = 2.0f;
    for (const Problem& pb : with_kinds(base)) check_against_naive(pb, seed++);
  }
  Problem mha = dense_problem(1, 3, 3, 4, 4, 5);  // no grouping
  mha.kind = AttentionBiasKind::kDistanceTable;
  mha.centre = 5;
  check_against_naive(mha, 99);
  check_against_naive(mha, 98, /*table_f32=*/true);
}

TEST(AttentionFloat64, VarlenMatchesNaiveOverOptionsAndBiasKinds) {
  std::uint32_t seed = 200;
  for (int variant = 0; variant < 4; ++variant) {
    Problem base = varlen_problem({3, 0, 5, 2}, {4, 3, 5, 1}, 4, 1, 5);
    if (variant == 1) base.causal = true;
    if (variant == 2) base.left = 1, base.right = 2;
    if (variant == 3) base.softcap = 1.0f, base.causal = true;
    for (const Problem& pb : with_kinds(base)) check_against_naive(pb, seed++);
  }
}

// attention_kvcache_forward in float64 (slabs and paged) and the reference
// entry points agree with the naive formula of the same sequences.
TEST(AttentionFloat64, KvcacheSlabsAndPagedMatchNaive) {
  const std::int64_t i = 2, h = 4, hk = 2, d = 3, bs = 3;
  Problem pb = varlen_problem({i, i, i}, {5, 2, 7}, h, hk, d);
  pb.causal = true;
  pb.kind = AttentionBiasKind::kAlibi;
  pb.per_seq_slopes = true;
  const Data in = make_data64(pb, 7);
  const Naive want = naive(pb, in);
  const std::int64_t b = pb.b(), max_len = 9, max_blocks = 3;
  const Tensor q = f64_tensor({b, i, h, d}, in.q);  // [b * i, h, d] packed is [b, i, h, d]
  std::vector<double> slab(static_cast<std::size_t>(b * max_len * hk * d), 1e300);
  std::vector<double> vslab = slab;
  const std::int64_t nblocks = b * max_blocks;
  std::vector<double> paged(static_cast<std::size_t>(nblocks * bs * hk * d), 1e300);
  std::vector<double> vpaged = paged;
  Tensor bt = Tensor::empty({b, max_blocks}, DType::kInt32);
  for (std::int64_t s = 0; s < b; ++s) {
    for (std::int64_t e = 0; e < max_blocks; ++e) {  // blocks in reverse order
      bt.mutable_data<std::int32_t>()[s * max_blocks + e] =
          static_cast<std::int32_t>(nblocks - 1 - (s * max_blocks + e));
    }
  }
  Tensor seqlens = Tensor::empty({b}, DType::kInt32);
  for (std::int64_t s = 0; s < b; ++s) {
    seqlens.mutable_data<std::int32_t>()[s] =
        static_cast<std::int32_t>(pb.jk[static_cast<std::size_t>(s)]);
    for (std::int64_t c = 0; c < pb.jk[static_cast<std::size_t>(s)]; ++c) {
      const std::int64_t blk = bt.data<std::int32_t>()[s * max_blocks + c / bs];
      for (std::int64_t x = 0; x < hk * d; ++x) {
        const auto src = static_cast<std::size_t>(pb.ki(s, 0, c) + x);
        const auto at_slab = static_cast<std::size_t>((s * max_len + c) * hk * d + x);
        const auto at_paged = static_cast<std::size_t>((blk * bs + c % bs) * hk * d + x);
        slab[at_slab] = in.k[src];
        vslab[at_slab] = in.v[src];
        paged[at_paged] = in.k[src];
        vpaged[at_paged] = in.v[src];
      }
    }
  }
  AttentionOptions opt;
  opt.scale = pb.scale;
  opt.causal = true;
  const AttentionBias bias = AttentionBias::alibi_f64(in.slopes);
  const Tensor ks = f64_tensor({b, max_len, hk, d}, slab),
               vs = f64_tensor({b, max_len, hk, d}, vslab);
  const Tensor kp = f64_tensor({nblocks, bs, hk, d}, paged),
               vp = f64_tensor({nblocks, bs, hk, d}, vpaged);
  expect_near64(values64(attention_kvcache_forward(q, ks, vs, seqlens, Tensor(), bias, opt)),
                want.out, "slabs");
  expect_near64(values64(attention_kvcache_forward(q, kp, vp, seqlens, bt, bias, opt)), want.out,
                "paged");
  expect_near64(values64(attention_kvcache_reference(q, kp, vp, seqlens, bt, bias, opt)), want.out,
                "paged reference");
}

// The float64 path and the float32 path of the same float32-exact inputs
// agree to float32 rounding.
TEST(AttentionFloat64, AgreesWithTheFloat32Path) {
  Problem pb = dense_problem(2, 4, 2, 6, 9, 8);
  pb.causal = true;
  pb.kind = AttentionBiasKind::kAlibi;
  const Data in = make_data(pb, 5);  // float32 values
  const Tensor q = f64_tensor(q_shape(pb), in.q), k = f64_tensor(k_shape(pb), in.k),
               v = f64_tensor(k_shape(pb), in.v), go = f64_tensor(q_shape(pb), in.dout);
  AttentionOptions opt;
  opt.causal = true;  // default scale: 1 / sqrt(d) in double vs in float
  const std::vector<float> s32(in.slopes.begin(), in.slopes.end());
  const AttentionForwardResult f64 = attention_forward_lse(q, k, v, AttentionBias::alibi(s32), opt);
  const Tensor q32 = q.to(DType::kFloat32), k32 = k.to(DType::kFloat32),
               v32 = v.to(DType::kFloat32);
  const AttentionForwardResult f32 =
      attention_forward_lse(q32, k32, v32, AttentionBias::alibi(s32), opt);
  expect_near_all(f32.out.to_float_vector(), values64(f64.out), "out", 2e-6);
  const AttentionGradients g64 =
      attention_backward(q, k, v, AttentionBias::alibi(s32), opt, f64.out, f64.lse, go);
  const AttentionGradients g32 = attention_backward(q32, k32, v32, AttentionBias::alibi(s32), opt,
                                                    f32.out, f32.lse, go.to(DType::kFloat32));
  expect_near_all(g32.grad_q.to_float_vector(), values64(g64.grad_q), "grad_q", 2e-5);
  expect_near_all(g32.grad_k.to_float_vector(), values64(g64.grad_k), "grad_k", 2e-5);
  expect_near_all(g32.grad_v.to_float_vector(), values64(g64.grad_v), "grad_v", 2e-5);
  expect_near_all(g32.grad_slopes, g64.grad_slopes_f64, "grad_slopes", 2e-5);
}

// The backward gives the same bits with one thread and with several.
TEST(AttentionFloat64, BackwardDoesNotDependOnTheThreadCount) {
  Problem pb = varlen_problem({4, 6, 3}, {6, 6, 5}, 4, 2, 4);
  pb.causal = true;
  pb.kind = AttentionBiasKind::kDistanceTable;
  pb.centre = widest_distance(pb);
  const Data in = make_data64(pb, 11);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const CallResult one = run_public(pb, in);
  omp_set_num_threads(std::max(2, saved));
  const CallResult many = run_public(pb, in);
  omp_set_num_threads(saved);
  for (const auto& [a, b] : {std::pair{&one.g.grad_q, &many.g.grad_q},
                             {&one.g.grad_k, &many.g.grad_k},
                             {&one.g.grad_v, &many.g.grad_v},
                             {&one.g.grad_table, &many.g.grad_table}}) {
    const std::vector<double> x = values64(*a), y = values64(*b);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(double)));
  }
}

void expect_invalid(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one naming: " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(AttentionFloat64, RefusesMixedDtypesAndFloat64BiasInOtherCalls) {
  const Tensor q64 = Tensor::full({1, 2, 3, 4}, 0.5f, DType::kFloat64);
  const Tensor k64 = Tensor::full({1, 2, 3, 4}, 0.5f, DType::kFloat64);
  const Tensor k32 = Tensor::full({1, 2, 3, 4}, 0.5f);
  expect_invalid([&] { attention_forward(q64, k32, k32); }, "got float64, float32, float32");
  expect_invalid([&] { attention_forward(q64, k64, k32); }, "got float64, float64, float32");
  expect_invalid([&] { attention_forward(k32, k64, k64); }, "got float32, float64, float64");
  const Tensor bf = Tensor::full({1, 2, 3, 4}, 0.5f, DType::kBFloat16);
  expect_invalid([&] { attention_forward(q64, bf, bf); }, "got float64, bfloat16, bfloat16");
  expect_invalid(
      [&] {
        attention_forward(k32, k32, k32, AttentionBias::alibi_f64({0.5, 0.25}));
      },
      "slopes_f64");
  expect_invalid(
      [&] {
        AttentionBias both = AttentionBias::alibi_f64({0.5, 0.25});
        both.slopes = {0.5f, 0.25f};
        attention_forward(q64, k64, k64, both);
      },
      "give the ALiBi slopes once");
  expect_invalid(
      [&] {
        attention_forward(
            k32, k32, k32,
            AttentionBias::distance_table(Tensor::full({2, 5}, 0.0f, DType::kFloat64)));
      },
      "float64 table");
  expect_invalid(
      [&] {
        attention_forward(q64, k64, k64, AttentionBias::dense_bias(Tensor::full({3, 3}, 0.0f)));
      },
      "must be float64");
  expect_invalid(
      [&] {
        attention_forward(q64, k64, k64, AttentionBias::alibi_f64({0.5, NAN}));
      },
      "ALiBi slope 1 is not finite");
  // The backward's lse is float64 in a float64 call.
  const AttentionForwardResult r = attention_forward_lse(q64, k64, k64);
  expect_invalid(
      [&] { attention_backward(q64, k64, k64, {}, {}, r.out, r.lse.to(DType::kFloat32), r.out); },
      "lse must be float64");
}

// kvcache_append with all four tensors float64: exact copies (values that
// float32 cannot hold) into slabs and pages, at each sequence's length; a
// float64 tensor mixed with another dtype is refused by name.
TEST(AttentionFloat64, KvcacheAppendCopiesExactly) {
  const std::int64_t b = 2, n = 2, hk = 2, d = 3, max_len = 5, bs = 2, max_blocks = 3;
  std::vector<double> knew(static_cast<std::size_t>(b * n * hk * d)), vnew = knew;
  for (std::size_t x = 0; x < knew.size(); ++x) {
    knew[x] = 1.0 / static_cast<double>(3 + x);
    vnew[x] = -1.0 / static_cast<double>(7 + x);
  }
  const Tensor kn = f64_tensor({b, n, hk, d}, knew), vn = f64_tensor({b, n, hk, d}, vnew);
  Tensor seqlens = Tensor::empty({b}, DType::kInt32);
  seqlens.mutable_data<std::int32_t>()[0] = 1;
  seqlens.mutable_data<std::int32_t>()[1] = 3;
  Tensor bt = Tensor::empty({b, max_blocks}, DType::kInt32);
  for (std::int64_t e = 0; e < b * max_blocks; ++e) {
    bt.mutable_data<std::int32_t>()[e] = static_cast<std::int32_t>(b * max_blocks - 1 - e);
  }
  Tensor ks = f64_tensor({b, max_len, hk, d}, std::vector<double>(b * max_len * hk * d, 0.0));
  Tensor vs = f64_tensor({b, max_len, hk, d}, std::vector<double>(b * max_len * hk * d, 0.0));
  Tensor kp = f64_tensor({b * max_blocks, bs, hk, d}, std::vector<double>(b * max_blocks * bs * hk * d, 0.0));
  Tensor vp = f64_tensor({b * max_blocks, bs, hk, d}, std::vector<double>(b * max_blocks * bs * hk * d, 0.0));
  kvcache_append(ks, vs, seqlens, Tensor(), kn, vn);
  kvcache_append(kp, vp, seqlens, bt, kn, vn);
  for (std::int64_t s = 0; s < b; ++s) {
    const std::int64_t len = seqlens.data<std::int32_t>()[s];
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t c = len + t;
      const std::int64_t blk = bt.data<std::int32_t>()[s * max_blocks + c / bs];
      for (std::int64_t x = 0; x < hk * d; ++x) {
        const auto src = static_cast<std::size_t>((s * n + t) * hk * d + x);
        const std::int64_t at_slab = (s * max_len + c) * hk * d + x;
        const std::int64_t at_paged = (blk * bs + c % bs) * hk * d + x;
        EXPECT_EQ(ks.data<double>()[at_slab], knew[src]);
        EXPECT_EQ(vs.data<double>()[at_slab], vnew[src]);
        EXPECT_EQ(kp.data<double>()[at_paged], knew[src]);
        EXPECT_EQ(vp.data<double>()[at_paged], vnew[src]);
      }
    }
  }
  Tensor k32 = Tensor::full({b, max_len, hk, d}, 0.0f), v32 = k32;
  expect_invalid([&] { kvcache_append(k32, v32, seqlens, Tensor(), kn, vn); },
                 "all float64, got float64, float64, float32, float32");
  const Tensor kn32 = Tensor::full({b, n, hk, d}, 0.5f);
  expect_invalid([&] { kvcache_append(ks, vs, seqlens, Tensor(), kn32, vn); },
                 "all float64, got float32, float64, float64, float64");
}

}  // namespace
}  // namespace posbias
