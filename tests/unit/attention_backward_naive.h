// The naive float64 attention with the options of real batches (issue 16)
// and its gradients, for the backward's tests: one call is a Problem (dense
// or packed sequences, options, bias), its inputs Data in the public layouts
// (dense [b, h, i, d], varlen [total, h, d]), naive() the forward's out and
// lse and every gradient straight from the definition.
#ifndef POSBIAS_TESTS_UNIT_ATTENTION_BACKWARD_NAIVE_H_
#define POSBIAS_TESTS_UNIT_ATTENTION_BACKWARD_NAIVE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "posbias/attention.h"
#include "test_util.h"

namespace posbias::bwd_naive {
using Shape = std::vector<std::int64_t>;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// One call: b sequences (dense: all of i and j queries and keys; varlen:
// lengths iq[s], jk[s] packed along the token dimension).
struct Problem {
  std::int64_t h = 2, hk = 1, d = 8;
  std::vector<std::int64_t> iq, jk;
  bool varlen = false;
  std::int64_t q_offset = 0;  // dense only
  bool causal = false;
  std::int64_t left = -1, right = -1;
  double softcap = 0.0;   // doubles, as AttentionOptions: float64 calls take them as given
  bool key_mask = false;  // dense only
  AttentionBiasKind kind = AttentionBiasKind::kNone;
  bool per_seq_slopes = false;
  std::int64_t centre = 0;  // kDistanceTable: table [h, 2 centre + 1]
  double scale = 0.3;

  std::int64_t b() const { return static_cast<std::int64_t>(iq.size()); }
  std::int64_t cu_q(std::int64_t s) const { return varlen ? sum(iq, s) : s * iq[0]; }
  std::int64_t cu_k(std::int64_t s) const { return varlen ? sum(jk, s) : s * jk[0]; }
  std::int64_t qoff(std::int64_t s) const {
    return varlen ? jk[static_cast<std::size_t>(s)] - iq[static_cast<std::size_t>(s)] : q_offset;
  }
  // Element offsets in the public layouts: dense [b, h, i, d], varlen
  // [total, h, d] (the same numbers: token = cu + row).
  std::int64_t qi(std::int64_t s, std::int64_t hh, std::int64_t r) const {
    if (varlen) return ((cu_q(s) + r) * h + hh) * d;
    return ((s * h + hh) * iq[0] + r) * d;
  }
  std::int64_t ki(std::int64_t s, std::int64_t kh, std::int64_t c) const {
    if (varlen) return ((cu_k(s) + c) * hk + kh) * d;
    return ((s * hk + kh) * jk[0] + c) * d;
  }
  static std::int64_t sum(const std::vector<std::int64_t>& v, std::int64_t n) {
    std::int64_t t = 0;
    for (std::int64_t s = 0; s < n; ++s) t += v[static_cast<std::size_t>(s)];
    return t;
  }
  std::int64_t total_q() const { return cu_q(b()); }
  std::int64_t total_k() const { return cu_k(b()); }
  std::int64_t slope_count() const { return per_seq_slopes ? b() * h : h; }
  std::string name() const {
    std::string n = std::string(varlen ? "varlen" : "dense") + " h" + std::to_string(h) + " hk" +
                    std::to_string(hk) + " d" + std::to_string(d) + " seqs";
    for (std::size_t s = 0; s < iq.size(); ++s) {
      n += " " + std::to_string(iq[s]) + "x" + std::to_string(jk[s]);
    }
    static const char* kinds[] = {"none", "alibi", "table", "dense"};
    return n + " off " + std::to_string(q_offset) + (causal ? " causal" : "") + " window " +
           std::to_string(left) + "," + std::to_string(right) + " cap " + std::to_string(softcap) +
           (key_mask ? " mask " : " ") + kinds[static_cast<int>(kind)] +
           (per_seq_slopes ? " per-seq" : "");
  }
};

struct Data {
  std::vector<double> q, k, v, dout, slopes, table, dense;
  std::vector<std::uint8_t> mask;  // dense [b, j]
};

inline std::vector<double> uniform(std::int64_t n, std::uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(static_cast<float>(lo), static_cast<float>(hi));
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

inline Data make_data(const Problem& pb, std::uint32_t seed) {
  Data in;
  const std::int64_t nq = pb.total_q() * pb.h * pb.d, nk = pb.total_k() * pb.hk * pb.d;
  in.q = uniform(nq, seed, -2.0, 2.0);
  in.k = uniform(nk, seed + 1, -2.0, 2.0);
  in.v = uniform(nk, seed + 2, -1.0, 1.0);
  in.dout = uniform(nq, seed + 3, -1.0, 1.0);
  in.slopes = uniform(pb.slope_count(), seed + 4, 0.05, 0.6);
  in.table = uniform(pb.h * (2 * pb.centre + 1), seed + 5, -2.0, 2.0);
  if (pb.kind == AttentionBiasKind::kDense) {
    in.dense = uniform(pb.b() * pb.h * pb.iq[0] * pb.jk[0], seed + 6, -2.0, 2.0);
  }
  if (pb.key_mask) {
    std::mt19937 gen(seed + 7);
    for (std::int64_t s = 0; s < pb.b(); ++s) {
      // Left padding on even sequences, random holes on odd ones.
      const std::int64_t j = pb.jk[0], pad = j / 3;
      for (std::int64_t c = 0; c < j; ++c) {
        in.mask.push_back(s % 2 == 0 ? c >= pad : (gen() % 4 != 0));
      }
    }
  }
  return in;
}

struct Naive {
  std::vector<double> out, lse, dq, dk, dv, dslopes, dtable, ddense;
};

// The forward and its gradients in float64, straight from the definition.
inline Naive naive(const Problem& pb, const Data& in) {
  const std::int64_t h = pb.h, d = pb.d, group = pb.h / pb.hk;
  Naive res;
  res.out.assign(in.q.size(), 0.0);
  res.lse.assign(static_cast<std::size_t>(pb.total_q() * h), -kInf);  // [token, h]
  res.dq.assign(in.q.size(), 0.0);
  res.dk.assign(in.k.size(), 0.0);
  res.dv.assign(in.v.size(), 0.0);
  res.dslopes.assign(in.slopes.size(), 0.0);
  res.dtable.assign(in.table.size(), 0.0);
  res.ddense.assign(in.dense.size(), 0.0);
  const std::int64_t tn = 2 * pb.centre + 1;
  for (std::int64_t s = 0; s < pb.b(); ++s) {
    const std::int64_t i = pb.iq[static_cast<std::size_t>(s)],
                       j = pb.jk[static_cast<std::size_t>(s)];
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t kh = hh / group;
      const std::size_t slope_at = static_cast<std::size_t>(pb.per_seq_slopes ? s * h + hh : hh);
      for (std::int64_t r = 0; r < i; ++r) {
        const std::int64_t qpos = pb.qoff(s) + r;
        const double* qr = &in.q[static_cast<std::size_t>(pb.qi(s, hh, r))];
        const double* gr = &in.dout[static_cast<std::size_t>(pb.qi(s, hh, r))];
        std::vector<std::int64_t> keys;
        std::vector<double> score, dtanh;
        for (std::int64_t c = 0; c < j; ++c) {
          if (pb.causal && c > qpos) continue;
          if (pb.left >= 0 && c < qpos - pb.left) continue;
          if (pb.right >= 0 && c > qpos + pb.right) continue;
          if (pb.key_mask && in.mask[static_cast<std::size_t>(s * j + c)] == 0) continue;
          const double* kc = &in.k[static_cast<std::size_t>(pb.ki(s, kh, c))];
          double raw = 0.0;
          for (std::int64_t x = 0; x < d; ++x) raw += qr[x] * kc[x];
          raw *= pb.scale;
          double sc = raw, dt = 1.0;
          if (pb.softcap > 0.0f) {
            const double t = std::tanh(raw / pb.softcap);
            sc = pb.softcap * t;
            dt = 1.0 - t * t;
          }
          if (pb.kind == AttentionBiasKind::kAlibi) {
            sc -= in.slopes[slope_at] * std::fabs(static_cast<double>(c - qpos));
          } else if (pb.kind == AttentionBiasKind::kDistanceTable) {
            sc += in.table[static_cast<std::size_t>(hh * tn + qpos - c + pb.centre)];
          } else if (pb.kind == AttentionBiasKind::kDense) {
            sc += in.dense[static_cast<std::size_t>(((s * h + hh) * i + r) * j + c)];
          }
          keys.push_back(c);
          score.push_back(sc);
          dtanh.push_back(dt);
        }
        if (keys.empty()) continue;
        double mx = -kInf;
        for (double x : score) mx = std::max(mx, x);
        double sum = 0.0;
        for (double x : score) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        const std::int64_t tok = pb.cu_q(s) + r;
        res.lse[static_cast<std::size_t>(tok * h + hh)] = lse;
        double* orow = &res.out[static_cast<std::size_t>(pb.qi(s, hh, r))];
        for (std::size_t e = 0; e < keys.size(); ++e) {
          const double* vc = &in.v[static_cast<std::size_t>(pb.ki(s, kh, keys[e]))];
          for (std::int64_t x = 0; x < d; ++x) orow[x] += std::exp(score[e] - lse) * vc[x];
        }
        double delta = 0.0;
        for (std::int64_t x = 0; x < d; ++x) delta += gr[x] * orow[x];
        double* dqr = &res.dq[static_cast<std::size_t>(pb.qi(s, hh, r))];
        for (std::size_t e = 0; e < keys.size(); ++e) {
          const std::int64_t c = keys[e];
          const std::size_t kv = static_cast<std::size_t>(pb.ki(s, kh, c));
          const double pc = std::exp(score[e] - lse);
          double dp = 0.0;
          for (std::int64_t x = 0; x < d; ++x) dp += gr[x] * in.v[kv + static_cast<std::size_t>(x)];
          const double ds = pc * (dp - delta);
          const double draw = ds * dtanh[e];
          for (std::int64_t x = 0; x < d; ++x) {
            const std::size_t at = kv + static_cast<std::size_t>(x);
            dqr[x] += pb.scale * draw * in.k[at];
            res.dk[at] += pb.scale * draw * qr[x];
            res.dv[at] += pc * gr[x];
          }
          if (pb.kind == AttentionBiasKind::kAlibi) {
            res.dslopes[slope_at] -= ds * std::fabs(static_cast<double>(c - qpos));
          } else if (pb.kind == AttentionBiasKind::kDistanceTable) {
            res.dtable[static_cast<std::size_t>(hh * tn + qpos - c + pb.centre)] += ds;
          } else if (pb.kind == AttentionBiasKind::kDense) {
            res.ddense[static_cast<std::size_t>(((s * h + hh) * i + r) * j + c)] += ds;
          }
        }
      }
    }
  }
  return res;
}

// |got - want| <= tol (1 + max |want|) elementwise.
inline void expect_near_all(const std::vector<float>& got, const std::vector<double>& want,
                            const std::string& what, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0.0;
  for (double w : want) mx = std::max(mx, std::fabs(w));
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (!(std::fabs(got[e] - want[e]) <= tol * (1.0 + mx))) {
      FAIL() << what << ": element " << e << " is " << got[e] << ", expected " << want[e]
             << " (max |want| " << mx << ")";
    }
  }
}

inline std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Data rounded to dt (what the kernel sees) for the naive reference.
inline Data rounded(const Data& in, DType dt) {
  Data r = in;
  for (std::vector<double>* x : {&r.q, &r.k, &r.v, &r.dout}) {
    for (double& e : *x) e = test::round_to(dt, static_cast<float>(e));
  }
  return r;
}

inline Problem dense_problem(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                             std::int64_t j, std::int64_t d) {
  Problem pb;
  pb.h = h;
  pb.hk = hk;
  pb.d = d;
  pb.iq.assign(static_cast<std::size_t>(b), i);
  pb.jk.assign(static_cast<std::size_t>(b), j);
  pb.q_offset = j - i;
  return pb;
}

inline Problem varlen_problem(std::vector<std::int64_t> iq, std::vector<std::int64_t> jk,
                              std::int64_t h, std::int64_t hk, std::int64_t d) {
  Problem pb;
  pb.h = h;
  pb.hk = hk;
  pb.d = d;
  pb.iq = std::move(iq);
  pb.jk = std::move(jk);
  pb.varlen = true;
  return pb;
}

// The largest |q_pos - c| a problem's visible pairs may have: the table's
// centre must cover it.
inline std::int64_t widest_distance(const Problem& pb) {
  std::int64_t most = 0;
  for (std::int64_t s = 0; s < pb.b(); ++s) {
    const std::int64_t i = pb.iq[static_cast<std::size_t>(s)],
                       j = pb.jk[static_cast<std::size_t>(s)];
    if (i == 0 || j == 0) continue;
    const std::int64_t first = pb.qoff(s), last = pb.qoff(s) + i - 1;
    most = std::max({most, std::abs(first), std::abs(last), std::abs(first - (j - 1)),
                     std::abs(last - (j - 1))});
  }
  return most;
}

}  // namespace posbias::bwd_naive

#endif  // POSBIAS_TESTS_UNIT_ATTENTION_BACKWARD_NAIVE_H_
