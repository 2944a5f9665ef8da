// attention_forward_lse and attention_backward against a naive double
// transcription of the math (itself checked against central differences of
// the naive forward), over many shapes, every bias kind, causal and not,
// grouped-query heads, i < j and i > j, strided and 16-bit inputs, small
// kernel blocks, and thread-count independence.
#include "kernels/attention_backward.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;
using test::random_tensor;
using Shape = std::vector<std::int64_t>;

struct Case {
  std::int64_t b, h, hk, i, j, d;
  bool causal;
  AttentionBiasKind kind;
};

std::string name_of(const Case& c) {
  static const char* kinds[] = {"none", "alibi", "table", "dense"};
  return "b" + std::to_string(c.b) + " h" + std::to_string(c.h) + " hk" + std::to_string(c.hk) +
         " i" + std::to_string(c.i) + " j" + std::to_string(c.j) + " d" + std::to_string(c.d) +
         (c.causal ? " causal " : " ") + kinds[static_cast<int>(c.kind)];
}

struct Inputs {
  Tensor q, k, v, dout;
  AttentionBias bias;
  AttentionOptions opt;
};

Inputs make_inputs(const Case& c, std::uint32_t seed) {
  Inputs in;
  in.q = random_tensor({c.b, c.h, c.i, c.d}, seed, -2.0f, 2.0f);
  in.k = random_tensor({c.b, c.hk, c.j, c.d}, seed + 1, -2.0f, 2.0f);
  in.v = random_tensor({c.b, c.hk, c.j, c.d}, seed + 2);
  in.dout = random_tensor({c.b, c.h, c.i, c.d}, seed + 3);
  in.opt.causal = c.causal;
  switch (c.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      in.bias = AttentionBias::alibi(alibi_slopes(c.h));
      break;
    case AttentionBiasKind::kDistanceTable:
      in.bias = AttentionBias::distance_table(
          // Longer than 2j - 1 and odd: read at its centre (n - 1) / 2 = j + 1.
          random_tensor({c.h, std::max<std::int64_t>(1, 2 * c.j - 1) + 4}, seed + 4, -2.0f, 2.0f));
      break;
    case AttentionBiasKind::kDense:
      // Broadcast over the batch: [h, i, j].
      in.bias = AttentionBias::dense_bias(random_tensor({c.h, c.i, c.j}, seed + 5, -2.0f, 2.0f));
      break;
  }
  return in;
}

// The naive math in double.
struct NaiveResult {
  std::vector<double> out, lse, dq, dk, dv, dtable, ddense, dslopes;
};

NaiveResult naive(const Inputs& in, const std::vector<double>* q_override = nullptr,
                  const std::vector<double>* k_override = nullptr,
                  const std::vector<double>* v_override = nullptr,
                  const std::vector<double>* bias_override = nullptr) {
  const Tensor& qt = in.q;
  const std::int64_t b = qt.size(0), h = qt.size(1), i = qt.size(2), d = qt.size(3);
  const std::int64_t hk = in.k.size(1), j = in.k.size(2), group = h / hk;
  auto as_double = [](const Tensor& t) {
    const std::vector<float> f = t.to_float_vector();
    return std::vector<double>(f.begin(), f.end());
  };
  const std::vector<double> q = q_override ? *q_override : as_double(in.q);
  const std::vector<double> k = k_override ? *k_override : as_double(in.k);
  const std::vector<double> v = v_override ? *v_override : as_double(in.v);
  const std::vector<double> go = as_double(in.dout);
  const AttentionBias& bias = in.bias;
  std::vector<double> slopes(bias.slopes.begin(), bias.slopes.end());
  std::vector<double> table, dense;
  std::int64_t tn = 0, centre = 0;
  if (bias.kind == AttentionBiasKind::kDistanceTable) {
    table = bias_override ? *bias_override : as_double(bias.table);
    tn = bias.table.size(1);
    centre = (tn - 1) / 2;
  }
  if (bias.kind == AttentionBiasKind::kDense) {
    dense = bias_override ? *bias_override : as_double(bias.dense);
  }
  const double scale = in.opt.scale ? *in.opt.scale : 1.0 / std::sqrt(static_cast<double>(d));
  NaiveResult res;
  res.out.assign(static_cast<std::size_t>(b * h * i * d), 0.0);
  res.lse.assign(static_cast<std::size_t>(b * h * i), -std::numeric_limits<double>::infinity());
  res.dq.assign(res.out.size(), 0.0);
  res.dk.assign(k.size(), 0.0);
  res.dv.assign(v.size(), 0.0);
  res.dtable.assign(table.size(), 0.0);
  res.ddense.assign(dense.size(), 0.0);
  res.dslopes.assign(slopes.size(), 0.0);
  std::vector<double> s(static_cast<std::size_t>(j)), p(static_cast<std::size_t>(j));
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t kv = hh / group;
      for (std::int64_t r = 0; r < i; ++r) {
        const std::int64_t qpos = j - i + r;
        const std::int64_t vis = in.opt.causal ? std::clamp<std::int64_t>(qpos + 1, 0, j) : j;
        const double* qr = &q[static_cast<std::size_t>(((bb * h + hh) * i + r) * d)];
        const double* gr = &go[static_cast<std::size_t>(((bb * h + hh) * i + r) * d)];
        if (vis == 0) continue;
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t c = 0; c < vis; ++c) {
          const double* kc = &k[static_cast<std::size_t>(((bb * hk + kv) * j + c) * d)];
          double dot = 0.0;
          for (std::int64_t x = 0; x < d; ++x) dot += qr[x] * kc[x];
          double sc = scale * dot;
          if (bias.kind == AttentionBiasKind::kAlibi) {
            sc -= slopes[static_cast<std::size_t>(hh)] * std::fabs(static_cast<double>(c - qpos));
          } else if (bias.kind == AttentionBiasKind::kDistanceTable) {
            sc += table[static_cast<std::size_t>(hh * tn + (qpos - c + centre))];
          } else if (bias.kind == AttentionBiasKind::kDense) {
            sc += dense[static_cast<std::size_t>((hh * i + r) * j + c)];
          }
          s[static_cast<std::size_t>(c)] = sc;
          mx = std::max(mx, sc);
        }
        double sum = 0.0;
        for (std::int64_t c = 0; c < vis; ++c) sum += std::exp(s[static_cast<std::size_t>(c)] - mx);
        const double lse = mx + std::log(sum);
        res.lse[static_cast<std::size_t>((bb * h + hh) * i + r)] = lse;
        double* orow = &res.out[static_cast<std::size_t>(((bb * h + hh) * i + r) * d)];
        for (std::int64_t c = 0; c < vis; ++c) {
          p[static_cast<std::size_t>(c)] = std::exp(s[static_cast<std::size_t>(c)] - lse);
          const double* vc = &v[static_cast<std::size_t>(((bb * hk + kv) * j + c) * d)];
          for (std::int64_t x = 0; x < d; ++x) orow[x] += p[static_cast<std::size_t>(c)] * vc[x];
        }
        double delta = 0.0;
        for (std::int64_t x = 0; x < d; ++x) delta += gr[x] * orow[x];
        double* dqr = &res.dq[static_cast<std::size_t>(((bb * h + hh) * i + r) * d)];
        for (std::int64_t c = 0; c < vis; ++c) {
          const std::size_t kvrow = static_cast<std::size_t>(((bb * hk + kv) * j + c) * d);
          const double pc = p[static_cast<std::size_t>(c)];
          double dp = 0.0;
          for (std::int64_t x = 0; x < d; ++x) dp += gr[x] * v[kvrow + static_cast<std::size_t>(x)];
          const double ds = pc * (dp - delta);
          for (std::int64_t x = 0; x < d; ++x) {
            const std::size_t e = kvrow + static_cast<std::size_t>(x);
            dqr[x] += scale * ds * k[e];
            res.dk[e] += scale * ds * qr[x];
            res.dv[e] += pc * gr[x];
          }
          if (bias.kind == AttentionBiasKind::kAlibi) {
            res.dslopes[static_cast<std::size_t>(hh)] -=
                ds * std::fabs(static_cast<double>(c - qpos));
          } else if (bias.kind == AttentionBiasKind::kDistanceTable) {
            res.dtable[static_cast<std::size_t>(hh * tn + (qpos - c + centre))] += ds;
          } else if (bias.kind == AttentionBiasKind::kDense) {
            res.ddense[static_cast<std::size_t>((hh * i + r) * j + c)] += ds;
          }
        }
      }
    }
  }
  return res;
}

// |got - want| <= tol * (1 + max |want|) elementwise: gradients are sums of
// many terms of both signs, so the error scales with the tensor's magnitude.
void expect_near_all(const std::vector<float>& got, const std::vector<double>& want,
                     const std::string& what, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0.0;
  for (double w : want) mx = std::max(mx, std::fabs(w));
  const double lim = tol * (1.0 + mx);
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (!(std::fabs(got[e] - want[e]) <= lim)) {
      FAIL() << what << ": element " << e << " is " << got[e] << ", expected " << want[e]
             << " (max |want| " << mx << ")";
    }
  }
}

void check_case(const Case& c, std::uint32_t seed) {
  const std::string what = name_of(c);
  SCOPED_TRACE(what);
  const Inputs in = make_inputs(c, seed);
  const NaiveResult want = naive(in);
  const AttentionForwardResult fw = attention_forward_lse(in.q, in.k, in.v, in.bias, in.opt);
  const std::vector<float> lse = fw.lse.to_float_vector();
  ASSERT_EQ(lse.size(), want.lse.size());
  for (std::size_t e = 0; e < lse.size(); ++e) {
    if (std::isinf(want.lse[e])) {
      ASSERT_TRUE(std::isinf(lse[e]) && lse[e] < 0) << what << " lse " << e << " = " << lse[e];
    } else {
      ASSERT_NEAR(lse[e], want.lse[e], 2e-5 * (1.0 + std::fabs(want.lse[e])))
          << what << " lse " << e;
    }
  }
  expect_near_all(fw.out.to_float_vector(), want.out, what + " out", 1e-5);
  const AttentionGradients g =
      attention_backward(in.q, in.k, in.v, in.bias, in.opt, fw.out, fw.lse, in.dout);
  const double tol = 2e-5;
  expect_near_all(g.grad_q.to_float_vector(), want.dq, what + " dq", tol);
  expect_near_all(g.grad_k.to_float_vector(), want.dk, what + " dk", tol);
  expect_near_all(g.grad_v.to_float_vector(), want.dv, what + " dv", tol);
  switch (c.kind) {
    case AttentionBiasKind::kAlibi: {
      const std::vector<double> ws(want.dslopes.begin(), want.dslopes.end());
      expect_near_all(g.grad_slopes, ws, what + " dslopes", tol * 10);
      break;
    }
    case AttentionBiasKind::kDistanceTable:
      expect_near_all(g.grad_table.to_float_vector(), want.dtable, what + " dtable", tol);
      break;
    case AttentionBiasKind::kDense:
      expect_near_all(g.grad_dense.to_float_vector(), want.ddense, what + " ddense", tol);
      break;
    case AttentionBiasKind::kNone:
      EXPECT_EQ(g.grad_table.numel(), 0);
      break;
  }
}

constexpr AttentionBiasKind kKinds[] = {AttentionBiasKind::kNone, AttentionBiasKind::kAlibi,
                                        AttentionBiasKind::kDistanceTable,
                                        AttentionBiasKind::kDense};

TEST(AttentionBackward, NaiveReferenceMatchesCentralDifferences) {
  // L = sum(out * dout); the naive analytic gradients against (L(x + e) -
  // L(x - e)) / 2e of the naive forward, for every input, every kind.
  for (AttentionBiasKind kind : kKinds) {
    for (bool causal : {false, true}) {
      const Case c{1, 2, 1, 3, 4, 3, causal, kind};
      SCOPED_TRACE(name_of(c));
      const Inputs in = make_inputs(c, 7);
      const NaiveResult base = naive(in);
      const std::vector<float> gof = in.dout.to_float_vector();
      auto loss = [&](const NaiveResult& r) {
        double l = 0.0;
        for (std::size_t e = 0; e < r.out.size(); ++e) l += r.out[e] * gof[e];
        return l;
      };
      const double eps = 1e-6;
      auto fd = [&](std::vector<double> x, std::size_t e, int which) {
        x[e] += eps;
        const double up = loss(which == 0   ? naive(in, &x)
                               : which == 1 ? naive(in, nullptr, &x)
                               : which == 2 ? naive(in, nullptr, nullptr, &x)
                                            : naive(in, nullptr, nullptr, nullptr, &x));
        x[e] -= 2 * eps;
        const double down = loss(which == 0   ? naive(in, &x)
                                 : which == 1 ? naive(in, nullptr, &x)
                                 : which == 2 ? naive(in, nullptr, nullptr, &x)
                                              : naive(in, nullptr, nullptr, nullptr, &x));
        return (up - down) / (2 * eps);
      };
      auto dbl = [](const Tensor& t) {
        const std::vector<float> f = t.to_float_vector();
        return std::vector<double>(f.begin(), f.end());
      };
      const std::vector<double> xs[3] = {dbl(in.q), dbl(in.k), dbl(in.v)};
      const std::vector<double>* grads[3] = {&base.dq, &base.dk, &base.dv};
      for (int which = 0; which < 3; ++which) {
        for (std::size_t e = 0; e < xs[which].size(); ++e) {
          EXPECT_NEAR((*grads[which])[e], fd(xs[which], e, which), 1e-6) << which << " " << e;
        }
      }
      if (kind == AttentionBiasKind::kDistanceTable || kind == AttentionBiasKind::kDense) {
        const std::vector<double> bx =
            dbl(kind == AttentionBiasKind::kDense ? in.bias.dense : in.bias.table);
        const std::vector<double>& bg =
            kind == AttentionBiasKind::kDense ? base.ddense : base.dtable;
        for (std::size_t e = 0; e < bx.size(); ++e) {
          EXPECT_NEAR(bg[e], fd(bx, e, 3), 1e-6) << "bias " << e;
        }
      }
    }
  }
}

// Lengths 1, 2, 63, 64, 65, ~300; d 1, 8, 64, 80; GQA; i < j and i > j;
// causal and not. One test per bias kind (each a few seconds under ASan).
void check_many_shapes(AttentionBiasKind kind, std::uint32_t seed) {
  const std::vector<Case> shapes = {
      {1, 1, 1, 1, 1, 1, false, {}},    {2, 2, 1, 2, 2, 8, false, {}},
      {1, 4, 2, 63, 64, 8, false, {}},  {1, 2, 2, 64, 65, 64, false, {}},
      {1, 3, 1, 65, 63, 80, false, {}}, {1, 2, 1, 300, 300, 8, false, {}},
      {1, 2, 2, 1, 300, 16, false, {}}, {1, 1, 1, 300, 65, 8, false, {}},
      {2, 4, 4, 17, 130, 1, false, {}},
  };
  for (const Case& base : shapes) {
    for (bool causal : {false, true}) {
      Case c = base;
      c.kind = kind;
      c.causal = causal;
      // A distance table covers i <= j only without a mask.
      if (kind == AttentionBiasKind::kDistanceTable && !causal && c.i > c.j) continue;
      check_case(c, seed++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(AttentionBackward, ManyShapesNoBias) { check_many_shapes(AttentionBiasKind::kNone, 100); }
TEST(AttentionBackward, ManyShapesAlibi) { check_many_shapes(AttentionBiasKind::kAlibi, 200); }
TEST(AttentionBackward, ManyShapesDistanceTable) {
  check_many_shapes(AttentionBiasKind::kDistanceTable, 300);
}
TEST(AttentionBackward, ManyShapesDenseBias) { check_many_shapes(AttentionBiasKind::kDense, 400); }

// The kernel with small, odd blocks (every block boundary on small shapes).
TEST(AttentionBackward, SmallBlocksEqualDefaultBlocks) {
  for (AttentionBiasKind kind : kKinds) {
    for (bool causal : {false, true}) {
      const Case c{1, 2, 1, 37, 41, 5, causal, kind};
      SCOPED_TRACE(name_of(c));
      const Inputs in = make_inputs(c, 55);
      const NaiveResult want = naive(in);
      const AttentionForwardResult fw = attention_forward_lse(in.q, in.k, in.v, in.bias, in.opt);
      for (std::int64_t bq : {1, 3, 16}) {
        for (std::int64_t bk : {1, 7, 16}) {
          detail::AttentionParams p;
          Tensor dq = Tensor::empty(in.q.shape(), DType::kFloat32);
          Tensor dk = Tensor::empty(in.k.shape(), DType::kFloat32);
          Tensor dv = Tensor::empty(in.v.shape(), DType::kFloat32);
          std::vector<float> dtable(static_cast<std::size_t>(c.h * (2 * c.j - 1)));
          std::vector<float> dslopes(static_cast<std::size_t>(c.h));
          std::vector<float> ddense(static_cast<std::size_t>(c.b * c.h * c.i * c.j));
          std::vector<float> rtable;
          p.q = in.q.raw_data();
          p.k = in.k.raw_data();
          p.v = in.v.raw_data();
          p.saved_out = fw.out.raw_data();
          p.dout = in.dout.raw_data();
          std::copy_n(in.q.strides().data(), 4, p.q_stride);
          std::copy_n(in.k.strides().data(), 4, p.k_stride);
          std::copy_n(in.v.strides().data(), 4, p.v_stride);
          std::copy_n(fw.out.strides().data(), 4, p.saved_out_stride);
          std::copy_n(in.dout.strides().data(), 4, p.dout_stride);
          p.saved_lse = fw.lse.data<float>();
          std::copy_n(fw.lse.strides().data(), 3, p.saved_lse_stride);
          p.b = c.b;
          p.h = c.h;
          p.hk = c.hk;
          p.i = c.i;
          p.j = c.j;
          p.d = c.d;
          p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
          p.causal = causal;
          p.q_offset = c.j - c.i;
          p.dq = dq.raw_mutable_data();
          p.dk = dk.raw_mutable_data();
          p.dv = dv.raw_mutable_data();
          if (kind == AttentionBiasKind::kAlibi) {
            p.bias = detail::FusedBias::kAlibi;
            p.slopes = in.bias.slopes.data();
            p.dslopes = dslopes.data();
          } else if (kind == AttentionBiasKind::kDistanceTable) {
            p.bias = detail::FusedBias::kTable;
            const std::int64_t len = 2 * c.j - 1;
            p.rtable_stride = len + 64;
            rtable.assign(static_cast<std::size_t>(c.h * p.rtable_stride), 0.0f);
            for (std::int64_t hh = 0; hh < c.h; ++hh) {
              for (std::int64_t e = 0; e < len; ++e) {
                // Entry e: key - query position e - (j - 1), the user's
                // entry (j - 1 - e) + its centre.
                rtable[static_cast<std::size_t>(hh * p.rtable_stride + e)] =
                    in.bias.table.at({hh, c.j - 1 - e + (in.bias.table.size(1) - 1) / 2});
              }
            }
            p.rtable = rtable.data();
            p.table_centre = c.j - 1;
            p.dtable = dtable.data();
          } else if (kind == AttentionBiasKind::kDense) {
            p.bias = detail::FusedBias::kDense;
            p.dense = in.bias.dense.data<float>();
            p.dense_stride[0] = 0;
            std::copy_n(in.bias.dense.strides().data(), 3, p.dense_stride + 1);
            p.ddense = ddense.data();
          }
          detail::attention_backward_blocked(p, bq, bk);
          const std::string what = "bq " + std::to_string(bq) + " bk " + std::to_string(bk);
          expect_near_all(dq.to_float_vector(), want.dq, what + " dq", 2e-5);
          expect_near_all(dk.to_float_vector(), want.dk, what + " dk", 2e-5);
          expect_near_all(dv.to_float_vector(), want.dv, what + " dv", 2e-5);
          if (kind == AttentionBiasKind::kDistanceTable) {
            std::vector<double> wt;
            const std::int64_t tn = in.bias.table.size(1), centre = (tn - 1) / 2;
            for (std::int64_t hh = 0; hh < c.h; ++hh) {
              for (std::int64_t e = 0; e < 2 * c.j - 1; ++e) {
                wt.push_back(
                    want.dtable[static_cast<std::size_t>(hh * tn + e - (c.j - 1) + centre)]);
              }
            }
            expect_near_all(dtable, wt, what + " dtable", 2e-5);
          }
          if (kind == AttentionBiasKind::kDense) {
            expect_near_all(ddense, want.ddense, what + " ddense", 2e-5);
          }
          if (kind == AttentionBiasKind::kAlibi) {
            expect_near_all(dslopes, want.dslopes, what + " dslopes", 2e-4);
          }
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionBackward, StridedAnd16BitInputs) {
  const Case c{1, 4, 2, 40, 50, 24, true, AttentionBiasKind::kAlibi};
  const Inputs in = make_inputs(c, 9);
  // The same values through [b, len, h, d] buffers viewed as [b, h, len, d].
  auto strided = [](const Tensor& t) {
    Tensor buf = Tensor::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.dtype());
    Tensor view = buf.transpose(1, 2);
    float* dst = view.mutable_data<float>();
    for (std::int64_t a = 0; a < t.size(0); ++a) {
      for (std::int64_t b = 0; b < t.size(1); ++b) {
        for (std::int64_t r = 0; r < t.size(2); ++r) {
          for (std::int64_t x = 0; x < t.size(3); ++x) {
            dst[a * view.strides()[0] + b * view.strides()[1] + r * view.strides()[2] + x] =
                t.at({a, b, r, x});
          }
        }
      }
    }
    return view;
  };
  const Tensor qs = strided(in.q), ks = strided(in.k), vs = strided(in.v), gs = strided(in.dout);
  ASSERT_FALSE(qs.is_contiguous());
  const AttentionForwardResult f1 = attention_forward_lse(in.q, in.k, in.v, in.bias, in.opt);
  const AttentionForwardResult f2 = attention_forward_lse(qs, ks, vs, in.bias, in.opt);
  const AttentionGradients g1 =
      attention_backward(in.q, in.k, in.v, in.bias, in.opt, f1.out, f1.lse, in.dout);
  const AttentionGradients g2 =
      attention_backward(qs, ks, vs, in.bias, in.opt, strided(f2.out), f2.lse, gs);
  expect_bits_equal(g2.grad_q.to_float_vector(), g1.grad_q.to_float_vector(), "strided dq");
  expect_bits_equal(g2.grad_k.to_float_vector(), g1.grad_k.to_float_vector(), "strided dk");
  expect_bits_equal(g2.grad_v.to_float_vector(), g1.grad_v.to_float_vector(), "strided dv");

  // bfloat16 and float16 inputs: the gradients of the rounded inputs,
  // rounded once; compare with the float32 path on the same rounded values.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Inputs r = in;
    r.q = in.q.to(dt).to(DType::kFloat32);
    r.k = in.k.to(dt).to(DType::kFloat32);
    r.v = in.v.to(dt).to(DType::kFloat32);
    r.dout = in.dout.to(dt).to(DType::kFloat32);
    const NaiveResult want = naive(r);
    const AttentionForwardResult f =
        attention_forward_lse(in.q.to(dt), in.k.to(dt), in.v.to(dt), in.bias, in.opt);
    ASSERT_EQ(f.lse.dtype(), DType::kFloat32);
    const AttentionGradients g = attention_backward(in.q.to(dt), in.k.to(dt), in.v.to(dt), in.bias,
                                                    in.opt, f.out, f.lse, in.dout.to(dt));
    ASSERT_EQ(g.grad_q.dtype(), dt);
    ASSERT_EQ(g.grad_k.dtype(), dt);
    // out itself was rounded to dt, which perturbs D = rowsum(dO * out).
    const double tol = dt == DType::kBFloat16 ? 2e-2 : 3e-3;
    expect_near_all(g.grad_q.to_float_vector(), want.dq, "dq", tol);
    expect_near_all(g.grad_k.to_float_vector(), want.dk, "dk", tol);
    expect_near_all(g.grad_v.to_float_vector(), want.dv, "dv", tol);
  }
}

TEST(AttentionBackward, ResultsDoNotDependOnTheThreadCount) {
  // Grouped-query dK and dV are summed over the group's heads in head order
  // as they end (GroupSlots); with 8 threads on a small machine the heads
  // end in every order.
  for (const Case& c : {Case{2, 4, 2, 70, 90, 16, true, AttentionBiasKind::kDistanceTable},
                        Case{3, 8, 2, 40, 130, 32, true, AttentionBiasKind::kAlibi}}) {
    SCOPED_TRACE("h " + std::to_string(c.h) + " on " + std::to_string(c.hk));
    const Inputs in = make_inputs(c, 21);
    // One forward for every run: the forward itself may differ in the last
    // bits between thread counts (its block sizes follow them); the
    // backward must not.
    const AttentionForwardResult f = attention_forward_lse(in.q, in.k, in.v, in.bias, in.opt);
    const int saved = omp_get_max_threads();
    std::vector<std::vector<float>> runs;
    for (int t : {1, 2, 3, 8}) {
      omp_set_num_threads(t);
      const AttentionGradients g =
          attention_backward(in.q, in.k, in.v, in.bias, in.opt, f.out, f.lse, in.dout);
      std::vector<float> all = g.grad_q.to_float_vector();
      for (const Tensor* x : {&g.grad_k, &g.grad_v, &g.grad_table}) {
        const std::vector<float> v = x->to_float_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      runs.push_back(all);
    }
    omp_set_num_threads(saved);
    expect_bits_equal(runs[1], runs[0], "2 threads vs 1");
    expect_bits_equal(runs[2], runs[0], "3 threads vs 1");
    expect_bits_equal(runs[3], runs[0], "8 threads vs 1");
  }
}

TEST(AttentionBackward, DenseBiasBroadcastShapes) {
  // [i, j], [1, h, 1, j] and [b, 1, i, 1]: dS summed over broadcast dimensions.
  const std::int64_t b = 2, h = 3, i = 5, j = 7, d = 4;
  const Tensor q = random_tensor({b, h, i, d}, 1), k = random_tensor({b, h, j, d}, 2),
               v = random_tensor({b, h, j, d}, 3), go = random_tensor({b, h, i, d}, 4);
  const Tensor full_dense = random_tensor({b, h, i, j}, 5);
  for (const Shape& shape : {Shape{i, j}, Shape{1, h, 1, j}, Shape{b, 1, i, 1}, Shape{}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    const Tensor dense = random_tensor(shape, 6);
    AttentionOptions opt;
    const AttentionBias bias = AttentionBias::dense_bias(dense);
    const AttentionForwardResult f = attention_forward_lse(q, k, v, bias, opt);
    const AttentionGradients g = attention_backward(q, k, v, bias, opt, f.out, f.lse, go);
    ASSERT_EQ(g.grad_dense.shape(), shape);
    // The same bias expanded to [b, h, i, j]; its gradient reduced by hand.
    std::vector<float> ex;
    for (std::int64_t a = 0; a < b; ++a)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (std::int64_t r = 0; r < i; ++r)
          for (std::int64_t c = 0; c < j; ++c) {
            std::vector<std::int64_t> idx4 = {a, hh, r, c}, idx;
            for (std::size_t x = 4 - shape.size(); x < 4; ++x) {
              idx.push_back(shape[x - (4 - shape.size())] == 1 ? 0 : idx4[x]);
            }
            ex.push_back(dense.at(idx));
          }
    const AttentionBias fb = AttentionBias::dense_bias(Tensor::from_vector({b, h, i, j}, ex));
    const AttentionForwardResult ff = attention_forward_lse(q, k, v, fb, opt);
    const AttentionGradients gf = attention_backward(q, k, v, fb, opt, ff.out, ff.lse, go);
    std::vector<double> want(static_cast<std::size_t>(g.grad_dense.numel()), 0.0);
    const std::vector<float> gfull = gf.grad_dense.to_float_vector();
    for (std::int64_t a = 0; a < b; ++a)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (std::int64_t r = 0; r < i; ++r)
          for (std::int64_t c = 0; c < j; ++c) {
            std::int64_t flat = 0;
            const std::int64_t idx4[4] = {a, hh, r, c};
            for (std::size_t x = 4 - shape.size(); x < 4; ++x) {
              const std::int64_t e = shape[x - (4 - shape.size())];
              flat = flat * e + (e == 1 ? 0 : idx4[x]);
            }
            want[static_cast<std::size_t>(flat)] +=
                gfull[static_cast<std::size_t>(((a * h + hh) * i + r) * j + c)];
          }
    expect_near_all(g.grad_dense.to_float_vector(), want, "grad_dense", 1e-6);
  }
}

TEST(AttentionBackward, BadInputThrowsWithTheShapes) {
  const Tensor q = random_tensor({1, 2, 3, 4}, 1), k = random_tensor({1, 2, 5, 4}, 2);
  const AttentionForwardResult f = attention_forward_lse(q, k, k);
  EXPECT_EQ(f.lse.shape(), (Shape{1, 2, 3}));
  expect_throw_with<std::invalid_argument>(
      [&] {
        attention_backward(q, k, k, {}, {}, f.out, f.lse, random_tensor({1, 2, 3, 5}, 3));
      },
      "grad_out must be float32 [1, 2, 3, 4], got float32 [1, 2, 3, 5]");
  expect_throw_with<std::invalid_argument>(
      [&] {
        attention_backward(q, k, k, {}, {}, f.out, random_tensor({1, 2}, 3), f.out);
      },
      "lse must be float32 [1, 2, 3]");
  expect_throw_with<std::invalid_argument>(
      [&] { attention_backward(q, k, k, {}, {}, f.out.to(DType::kBFloat16), f.lse, f.out); },
      "out must be float32 [1, 2, 3, 4], got bfloat16");
  expect_throw_with<std::invalid_argument>(
      [&] { attention_backward(q, k, k, AttentionBias::alibi({0.5f}), {}, f.out, f.lse, f.out); },
      "one slope per query head");
}

TEST(AttentionBackward, RowsThatSeeNoKeyHaveZeroGradient) {
  // Causal i > j: the first i - j rows see nothing (lse -inf, zero grads).
  const Case c{1, 1, 1, 6, 3, 4, true, AttentionBiasKind::kAlibi};
  const Inputs in = make_inputs(c, 3);
  const AttentionForwardResult f = attention_forward_lse(in.q, in.k, in.v, in.bias, in.opt);
  const std::vector<float> lse = f.lse.to_float_vector();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(lse[static_cast<std::size_t>(r)], -INFINITY);
  const AttentionGradients g =
      attention_backward(in.q, in.k, in.v, in.bias, in.opt, f.out, f.lse, in.dout);
  const std::vector<float> dq = g.grad_q.to_float_vector();
  for (int e = 0; e < 3 * 4; ++e) EXPECT_EQ(dq[static_cast<std::size_t>(e)], 0.0f);
  // Empty shapes.
  const Tensor q0 = Tensor::empty({1, 2, 0, 4}, DType::kFloat32);
  const Tensor k0 = random_tensor({1, 2, 3, 4}, 4);
  const AttentionForwardResult f0 = attention_forward_lse(q0, k0, k0);
  const AttentionGradients g0 = attention_backward(q0, k0, k0, {}, {}, f0.out, f0.lse, f0.out);
  EXPECT_EQ(g0.grad_k.to_float_vector(), std::vector<float>(24, 0.0f));
}

}  // namespace
}  // namespace posbias
