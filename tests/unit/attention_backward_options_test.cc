// The backward kernel with the options of real batches (issue 16): q_offset,
// windows, softcap, key masks, per-sequence slopes, the centred distance
// table and packed (varlen) calls, with grouped-query heads and 16-bit
// inputs. The kernel is called through AttentionParams directly, from the
// out and lse of a naive float64 forward written here; its gradients of q,
// k, v, the table and the slopes are compared with the naive float64
// gradients (an explicit formula, itself checked against central
// differences of the naive forward).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_backward_naive.h"
#include "kernels/attention_backward.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using namespace bwd_naive;  // NOLINT(google-build-using-namespace): the tests' vocabulary
struct KernelGrads {
  std::vector<float> dq, dk, dv, dslopes, dtable, ddense;
};

// The kernel on the problem, inputs rounded to dt, out and lse from the
// naive forward.
KernelGrads run_kernel(const Problem& pb, const Data& in, const Naive& fw, DType dt,
                       std::int64_t bq, std::int64_t bk) {
  const std::int64_t b = pb.b(), h = pb.h, hk = pb.hk, d = pb.d;
  const Shape qs = pb.varlen ? Shape{pb.total_q(), h, d} : Shape{b, h, pb.iq[0], d};
  const Shape ks = pb.varlen ? Shape{pb.total_k(), hk, d} : Shape{b, hk, pb.jk[0], d};
  const Tensor q = Tensor::from_vector(qs, to_f(in.q)).to(dt);
  const Tensor k = Tensor::from_vector(ks, to_f(in.k)).to(dt);
  const Tensor v = Tensor::from_vector(ks, to_f(in.v)).to(dt);
  const Tensor go = Tensor::from_vector(qs, to_f(in.dout)).to(dt);
  const Tensor out = Tensor::from_vector(qs, to_f(fw.out)).to(dt);
  std::vector<float> lse(fw.lse.size());  // kernel layout: dense [b, h, i], varlen [h, total]
  const std::int64_t tq = pb.total_q();
  for (std::int64_t t = 0; t < tq; ++t) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const float x = static_cast<float>(fw.lse[static_cast<std::size_t>(t * h + hh)]);
      const std::int64_t at =
          pb.varlen ? hh * tq + t : ((t / pb.iq[0]) * h + hh) * pb.iq[0] + t % pb.iq[0];
      lse[static_cast<std::size_t>(at)] = x;
    }
  }
  Tensor dq = Tensor::empty(qs, dt), dk = Tensor::empty(ks, dt), dv = Tensor::empty(ks, dt);
  KernelGrads g;
  g.dslopes.assign(in.slopes.size(), -1.0f);
  g.dtable.assign(in.table.size(), -1.0f);
  g.ddense.assign(in.dense.size(), -1.0f);
  std::vector<std::int32_t> cu_q, cu_k;
  for (std::int64_t s = 0; s <= b; ++s) {
    cu_q.push_back(static_cast<std::int32_t>(pb.cu_q(s)));
    cu_k.push_back(static_cast<std::int32_t>(pb.cu_k(s)));
  }
  // The reversed table, padded (as src/attention.cc prepares it).
  const std::int64_t tn = 2 * pb.centre + 1;
  std::vector<float> rtable(static_cast<std::size_t>(h * (tn + 64)), 0.0f);
  for (std::int64_t hh = 0; hh < h; ++hh) {
    for (std::int64_t e = 0; e < tn; ++e) {
      rtable[static_cast<std::size_t>(hh * (tn + 64) + e)] =
          static_cast<float>(in.table[static_cast<std::size_t>(hh * tn + tn - 1 - e)]);
    }
  }
  const std::vector<float> slopes = to_f(in.slopes), dense = to_f(in.dense);

  detail::AttentionParams p;
  p.dtype = p.kv_dtype = dt;
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.saved_out = out.raw_data();
  p.dout = go.raw_data();
  auto strides4 = [&](const Tensor& t, std::int64_t* st) {
    if (pb.varlen) {  // [token, head, element] -> {0, head, token, element}
      st[0] = 0;
      st[1] = t.strides()[1];
      st[2] = t.strides()[0];
      st[3] = t.strides()[2];
    } else {
      std::copy_n(t.strides().data(), 4, st);
    }
  };
  strides4(q, p.q_stride);
  strides4(k, p.k_stride);
  strides4(v, p.v_stride);
  strides4(out, p.saved_out_stride);
  strides4(go, p.dout_stride);
  p.saved_lse = lse.data();
  if (pb.varlen) {
    p.saved_lse_stride[0] = 0;
    p.saved_lse_stride[1] = tq;
    p.saved_lse_stride[2] = 1;
    p.cu_q = cu_q.data();
    p.cu_k = cu_k.data();
    for (std::int64_t s = 0; s < b; ++s) {
      p.i = std::max(p.i, pb.iq[static_cast<std::size_t>(s)]);
      p.j = std::max(p.j, pb.jk[static_cast<std::size_t>(s)]);
    }
  } else {
    p.saved_lse_stride[0] = h * pb.iq[0];
    p.saved_lse_stride[1] = pb.iq[0];
    p.saved_lse_stride[2] = 1;
    p.i = pb.iq[0];
    p.j = pb.jk[0];
    p.q_offset = pb.q_offset;
  }
  p.b = b;
  p.h = h;
  p.hk = hk;
  p.d = d;
  p.scale = static_cast<float>(pb.scale);
  p.causal = pb.causal;
  p.window_left = pb.left;
  p.window_right = pb.right;
  p.softcap = static_cast<float>(pb.softcap);
  if (pb.key_mask) {
    p.key_mask = in.mask.data();
    p.key_mask_stride[0] = pb.jk[0];
    p.key_mask_stride[1] = 1;
  }
  p.dq = dq.raw_mutable_data();
  p.dk = dk.raw_mutable_data();
  p.dv = dv.raw_mutable_data();
  switch (pb.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      p.bias = detail::FusedBias::kAlibi;
      p.slopes = slopes.data();
      p.slopes_seq_stride = pb.per_seq_slopes ? h : 0;
      p.dslopes = g.dslopes.data();
      break;
    case AttentionBiasKind::kDistanceTable:
      p.bias = detail::FusedBias::kTable;
      p.rtable = rtable.data();
      p.rtable_stride = tn + 64;
      p.table_centre = pb.centre;
      p.dtable = g.dtable.data();
      break;
    case AttentionBiasKind::kDense:
      p.bias = detail::FusedBias::kDense;
      p.dense = dense.data();
      p.dense_stride[3] = 1;
      p.dense_stride[2] = pb.jk[0];
      p.dense_stride[1] = pb.jk[0] * pb.iq[0];
      p.dense_stride[0] = p.dense_stride[1] * h;
      p.ddense = g.ddense.data();
      break;
  }
  detail::attention_backward_blocked(p, bq, bk);
  g.dq = dq.to_float_vector();
  g.dk = dk.to_float_vector();
  g.dv = dv.to_float_vector();
  return g;
}

void check(const Problem& pb, std::uint32_t seed, DType dt = DType::kFloat32) {
  SCOPED_TRACE(pb.name() + " " + dtype_name(dt));
  const Data in = rounded(make_data(pb, seed), dt);
  const Naive want = naive(pb, in);
  // 16-bit: out itself is rounded to dt, which perturbs D = rowsum(dO * out).
  const double tol = dt == DType::kFloat32 ? 3e-5 : dt == DType::kBFloat16 ? 2e-2 : 3e-3;
  const std::vector<std::pair<std::int64_t, std::int64_t>> block_sizes = {
      {64, 64}, {5, 7}, {16, 1}};
  for (const auto& blocks : block_sizes) {
    const std::string what =
        "blocks " + std::to_string(blocks.first) + "x" + std::to_string(blocks.second);
    const KernelGrads g = run_kernel(pb, in, want, dt, blocks.first, blocks.second);
    expect_near_all(g.dq, want.dq, what + " dq", tol);
    expect_near_all(g.dk, want.dk, what + " dk", tol);
    expect_near_all(g.dv, want.dv, what + " dv", tol);
    if (pb.kind == AttentionBiasKind::kAlibi) {
      expect_near_all(g.dslopes, want.dslopes, what + " dslopes", 10 * tol);
    }
    if (pb.kind == AttentionBiasKind::kDistanceTable) {
      expect_near_all(g.dtable, want.dtable, what + " dtable", tol);
    }
    if (pb.kind == AttentionBiasKind::kDense) {
      expect_near_all(g.ddense, want.ddense, what + " ddense", tol);
    }
    if (::testing::Test::HasFailure() || dt != DType::kFloat32) return;
  }
}

// Every option combination on one problem, for each bias kind.
void check_options(Problem base, std::uint32_t seed, bool dense_kind) {
  struct Opt {
    bool causal;
    std::int64_t left, right;
    float cap;
    bool mask;
  };
  const std::vector<Opt> opts = {
      {false, -1, -1, 0.0f, false}, {true, -1, -1, 0.0f, false}, {true, 5, -1, 0.0f, false},
      {false, 3, 2, 0.0f, false},   {false, -1, 4, 2.0f, false}, {true, 9, 0, 1.5f, false},
      {true, -1, -1, 0.0f, true},   {false, 6, 6, 3.0f, true},
  };
  std::vector<AttentionBiasKind> kinds = {AttentionBiasKind::kNone, AttentionBiasKind::kAlibi,
                                          AttentionBiasKind::kDistanceTable};
  if (dense_kind) kinds.push_back(AttentionBiasKind::kDense);
  for (const Opt& o : opts) {
    if (o.mask && base.varlen) continue;  // packed calls have no key mask
    for (AttentionBiasKind kind : kinds) {
      Problem pb = base;
      pb.causal = o.causal;
      pb.left = o.left;
      pb.right = o.right;
      pb.softcap = o.cap;
      pb.key_mask = o.mask;
      pb.kind = kind;
      // A table wider than needed (its centre is not j - 1), or, with a
      // bounded window, just as wide as the window (shorter than the keys).
      pb.centre = widest_distance(pb) + 3;
      if (o.left >= 0 && (o.right >= 0 || o.causal)) {
        pb.centre = std::max(o.left, o.causal ? std::int64_t{0} : o.right);
      }
      for (bool per_seq : {false, true}) {
        if (per_seq && kind != AttentionBiasKind::kAlibi) continue;
        pb.per_seq_slopes = per_seq;
        check(pb, seed++);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(AttentionBackwardOptions, NaiveGradientsMatchCentralDifferences) {
  // L = sum(out * dout) of the naive forward; its analytic gradients against
  // (L(x + e) - L(x - e)) / 2e, with every option that changes the formula.
  Problem pb = varlen_problem({3, 2}, {4, 5}, 2, 1, 3);
  pb.causal = true;
  pb.left = 3;
  pb.softcap = 1.5f;
  pb.kind = AttentionBiasKind::kAlibi;
  pb.per_seq_slopes = true;
  pb.centre = widest_distance(pb) + 1;
  for (AttentionBiasKind kind : {AttentionBiasKind::kAlibi, AttentionBiasKind::kDistanceTable}) {
    pb.kind = kind;
    SCOPED_TRACE(pb.name());
    const Data in = make_data(pb, 11);
    const Naive base = naive(pb, in);
    auto loss = [&](const Data& x) {
      const Naive r = naive(pb, x);
      double l = 0.0;
      for (std::size_t e = 0; e < r.out.size(); ++e) l += r.out[e] * in.dout[e];
      return l;
    };
    const double eps = 1e-6;
    std::vector<double> Data::*fields[] = {&Data::q, &Data::k, &Data::v, &Data::slopes,
                                           &Data::table};
    const std::vector<double>* grads[] = {&base.dq, &base.dk, &base.dv, &base.dslopes,
                                          &base.dtable};
    for (int f = 0; f < 5; ++f) {
      for (std::size_t e = 0; e < (in.*fields[f]).size(); ++e) {
        Data up = in, down = in;
        (up.*fields[f])[e] += eps;
        (down.*fields[f])[e] -= eps;
        EXPECT_NEAR((*grads[f])[e], (loss(up) - loss(down)) / (2 * eps), 1e-6)
            << "field " << f << " element " << e;
      }
    }
  }
}

TEST(AttentionBackwardOptions, DenseEveryOptionAndBias) {
  check_options(dense_problem(2, 4, 2, 13, 21, 8), 100, true);
}

TEST(AttentionBackwardOptions, DenseMoreQueriesThanKeysNoGroups) {
  check_options(dense_problem(1, 3, 3, 20, 9, 5), 200, true);
}

TEST(AttentionBackwardOptions, DenseExplicitOffsets) {
  // Context-parallel shards (offset past j - i), a chunk at 0, and negative
  // offsets (rows before the first key).
  for (std::int64_t off : {0, 7, 40, -5}) {
    Problem pb = dense_problem(2, 2, 1, 11, 17, 6);
    pb.q_offset = off;
    check_options(pb, 300 + static_cast<std::uint32_t>(off + 10) * 50, true);
    if (HasFailure()) return;
  }
}

TEST(AttentionBackwardOptions, VarlenEveryOptionAndBias) {
  // Empty sequences, i > j, i < j, one longer than a block.
  check_options(varlen_problem({5, 0, 9, 3, 70, 1}, {5, 4, 4, 0, 75, 12}, 4, 2, 8), 400, false);
}

TEST(AttentionBackwardOptions, VarlenNoGroupsWideHead) {
  check_options(varlen_problem({33, 17, 2}, {33, 40, 2}, 2, 2, 40), 500, false);
}

TEST(AttentionBackwardOptions, SixteenBitInputs) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    Problem pb = varlen_problem({20, 6}, {24, 6}, 4, 2, 16);
    pb.causal = true;
    pb.left = 7;
    pb.softcap = 2.0f;
    pb.kind = AttentionBiasKind::kAlibi;
    pb.per_seq_slopes = true;
    check(pb, 600, dt);
    Problem pd = dense_problem(2, 2, 1, 15, 19, 8);
    pd.key_mask = true;
    pd.right = 3;
    pd.kind = AttentionBiasKind::kDistanceTable;
    pd.centre = widest_distance(pd);
    check(pd, 610, dt);
  }
}

TEST(AttentionBackwardOptions, MaskedKeysAreNeverRead) {
  // NaN in the K and V rows of masked keys must not reach any gradient, and
  // those keys' own gradients are zero.
  Problem pb = dense_problem(2, 2, 1, 9, 12, 4);
  pb.key_mask = true;
  pb.softcap = 2.0f;
  pb.kind = AttentionBiasKind::kAlibi;
  Data in = make_data(pb, 700);
  const Naive want = naive(pb, in);
  const std::int64_t j = pb.jk[0];
  for (std::int64_t s = 0; s < pb.b(); ++s) {
    for (std::int64_t c = 0; c < j; ++c) {
      if (in.mask[static_cast<std::size_t>(s * j + c)] != 0) continue;
      for (std::int64_t x = 0; x < pb.d; ++x) {
        in.k[static_cast<std::size_t>(pb.ki(s, 0, c) + x)] = std::nan("");
        in.v[static_cast<std::size_t>(pb.ki(s, 0, c) + x)] = std::nan("");
      }
    }
  }
  const KernelGrads g = run_kernel(pb, in, want, DType::kFloat32, 4, 4);
  expect_near_all(g.dq, want.dq, "dq", 3e-5);
  expect_near_all(g.dk, want.dk, "dk", 3e-5);
  expect_near_all(g.dv, want.dv, "dv", 3e-5);
  expect_near_all(g.dslopes, want.dslopes, "dslopes", 3e-4);
}

TEST(AttentionBackwardOptions, VarlenDoesNotDependOnTheThreadCount) {
  Problem pb = varlen_problem({90, 3, 40, 0, 65}, {100, 3, 40, 7, 60}, 4, 2, 16);
  pb.causal = true;
  pb.softcap = 5.0f;
  pb.kind = AttentionBiasKind::kDistanceTable;
  pb.centre = widest_distance(pb);
  const Data in = make_data(pb, 800);
  const Naive want = naive(pb, in);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> runs;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    const KernelGrads g = run_kernel(pb, in, want, DType::kFloat32, 64, 64);
    std::vector<float> all = g.dq;
    for (const std::vector<float>* x : {&g.dk, &g.dv, &g.dtable}) {
      all.insert(all.end(), x->begin(), x->end());
    }
    runs.push_back(all);
  }
  omp_set_num_threads(saved);
  expect_bits_equal(runs[1], runs[0], "2 threads vs 1");
  expect_bits_equal(runs[2], runs[0], "3 threads vs 1");
}

TEST(AttentionBackwardOptions, VarlenEqualsOneCallPerSequence) {
  // The packed call and one call per sequence (bottom-right offsets) give
  // the same gradients bit for bit (the per-sequence slopes of the
  // packed call are the dense calls' per-head ones).
  Problem pb = varlen_problem({30, 12, 1}, {30, 20, 9}, 4, 4, 8);
  pb.causal = true;
  pb.kind = AttentionBiasKind::kAlibi;
  pb.per_seq_slopes = true;
  const Data in = make_data(pb, 900);
  const KernelGrads packed = run_kernel(pb, in, naive(pb, in), DType::kFloat32, 64, 64);
  for (std::int64_t s = 0; s < pb.b(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const std::int64_t i = pb.iq[static_cast<std::size_t>(s)],
                       j = pb.jk[static_cast<std::size_t>(s)];
    Problem one = varlen_problem({i}, {j}, pb.h, pb.hk, pb.d);
    one.causal = true;
    one.kind = AttentionBiasKind::kAlibi;
    Data d1 = in;
    auto slice = [&](const std::vector<double>& x, std::int64_t from, std::int64_t count) {
      return std::vector<double>(x.begin() + from, x.begin() + from + count);
    };
    const std::int64_t qn = pb.h * pb.d, kn = pb.hk * pb.d;
    d1.q = slice(in.q, pb.cu_q(s) * qn, i * qn);
    d1.dout = slice(in.dout, pb.cu_q(s) * qn, i * qn);
    d1.k = slice(in.k, pb.cu_k(s) * kn, j * kn);
    d1.v = slice(in.v, pb.cu_k(s) * kn, j * kn);
    d1.slopes = slice(in.slopes, s * pb.h, pb.h);
    // The packed call's saved out and lse, so both read the same inputs.
    const Naive full = naive(pb, in);
    Naive f1 = naive(one, d1);
    f1.out = slice(full.out, pb.cu_q(s) * qn, i * qn);
    f1.lse = slice(full.lse, pb.cu_q(s) * pb.h, i * pb.h);
    const KernelGrads g = run_kernel(one, d1, f1, DType::kFloat32, 64, 64);
    auto fslice = [&](const std::vector<float>& x, std::int64_t from, std::int64_t count) {
      return std::vector<float>(x.begin() + from, x.begin() + from + count);
    };
    expect_bits_equal(fslice(packed.dq, pb.cu_q(s) * qn, i * qn), g.dq, "dq");
    expect_bits_equal(fslice(packed.dk, pb.cu_k(s) * kn, j * kn), g.dk, "dk");
    expect_bits_equal(fslice(packed.dv, pb.cu_k(s) * kn, j * kn), g.dv, "dv");
    expect_bits_equal(fslice(packed.dslopes, s * pb.h, pb.h), g.dslopes, "dslopes");
  }
}

}  // namespace
}  // namespace posbias
