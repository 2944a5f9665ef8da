// The float64 backward of attention (see attention_reference.h): one query
// row at a time in double, straight from the definition,
//
//   P[c] = exp(S[c] - lse), dP[c] = dO . v_c, dS[c] = P[c] (dP[c] - dO . out),
//   dV_c += P[c] dO, dQ += scale dcap dS[c] k_c, dK_c += scale dcap dS[c] q,
//
// (dcap the softcap derivative, 1 without it) and the bias gradients dS
// times -|c - q_r| (ALiBi), dS summed along the diagonal (table) or dS itself
// (dense). A task is one (sequence, kv head): it owns that head's dK and dV
// rows of the sequence and the dQ rows of its query heads, so no two tasks
// write one element; the slope and table gradients go through per-(sequence,
// head) partials summed afterwards in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_reference.h"
#include "dtype_dispatch.h"

namespace posbias::detail {
namespace {

// Element offsets of the contiguous outputs: dq (and the [.., h, .., d]
// tensors, as p.out_stride) and dk, dv ([b, hk, j, d] or [total_k, hk, d]).
struct GradLayout {
  std::int64_t k[3] = {};  // sequence, kv head, key token
};

GradLayout grad_layout(const AttentionParams& p) {
  GradLayout g;
  if (p.cu_q != nullptr) {
    g.k[0] = 0, g.k[1] = p.d, g.k[2] = p.hk * p.d;
  } else {
    g.k[0] = p.hk * p.j * p.d, g.k[1] = p.j * p.d, g.k[2] = p.d;
  }
  return g;
}

// Per-(sequence, head) partial bias gradients of one call.
struct Partials {
  std::int64_t table_len = 0;
  std::vector<double> slopes;  // [b, h]
  std::vector<double> table;   // [b, h, table_len]
};

// One query row r of sequence s, head x: accumulates dK, dV (the task's) and
// the bias partials, and writes the row's dQ.
void backward_row(const AttentionParams& p, const AttentionDouble& dbl, const GradLayout& gl,
                  Partials& part, const Sequence& sq, std::int64_t s, std::int64_t x,
                  std::int64_t r, std::vector<double>& dq) {
  const std::int64_t kvh = x / (p.h / p.hk), row = sq.q_row0 + r, qpos = sq.q_offset + r;
  auto* gq = static_cast<double*>(p.dq);
  auto* gk = static_cast<double*>(p.dk);
  auto* gv = static_cast<double*>(p.dv);
  std::fill(dq.begin(), dq.end(), 0.0);
  const double lse = dbl.saved_lse[s * p.saved_lse_stride[0] + x * p.saved_lse_stride[1] +
                                   row * p.saved_lse_stride[2]];
  const std::int64_t qo = s * p.q_stride[0] + x * p.q_stride[1] + row * p.q_stride[2];
  const std::int64_t oo =
      s * p.saved_out_stride[0] + x * p.saved_out_stride[1] + row * p.saved_out_stride[2];
  const std::int64_t go = s * p.dout_stride[0] + x * p.dout_stride[1] + row * p.dout_stride[2];
  const auto dout = [&](std::int64_t e) {
    return load_element(p.dout, p.dtype, go + e * p.dout_stride[3]);
  };
  if (lse != -std::numeric_limits<double>::infinity()) {
    double delta = 0.0;  // dO . out
    for (std::int64_t e = 0; e < p.d; ++e) {
      delta += dout(e) * load_element(p.saved_out, p.dtype, oo + e * p.saved_out_stride[3]);
    }
    const KeyRange kr = visible_keys(p, sq.j, qpos);
    const std::int64_t slot = s * p.h + x;
    for (std::int64_t c = kr.begin; c < kr.end; ++c) {
      if (reference_key_masked(p, s, c)) continue;
      const ReferenceScore sc = reference_score(p, dbl, sq, s, x, r, qpos, c);
      const double prob = std::exp(sc.score - lse);
      const std::int64_t ko = reference_key_offset(p, sq, s, kvh, c, p.k_stride);
      const std::int64_t vo = reference_key_offset(p, sq, s, kvh, c, p.v_stride);
      double dp = 0.0;
      for (std::int64_t e = 0; e < p.d; ++e) {
        dp += dout(e) * load_element(p.v, p.kv_dtype, vo + e * p.v_stride[3]);
      }
      const double ds = prob * (dp - delta);
      const double draw = dbl.scale * sc.dcap * ds;
      const std::int64_t gko = s * gl.k[0] + kvh * gl.k[1] + (sq.k_row0 + c) * gl.k[2];
      for (std::int64_t e = 0; e < p.d; ++e) {
        const auto ue = static_cast<std::size_t>(e);
        dq[ue] += draw * load_element(p.k, p.kv_dtype, ko + e * p.k_stride[3]);
        gk[gko + e] += draw * load_element(p.q, p.dtype, qo + e * p.q_stride[3]);
        gv[gko + e] += prob * dout(e);
      }
      if (dbl.dslopes != nullptr) {
        part.slopes[static_cast<std::size_t>(slot)] -=
            ds * static_cast<double>(std::llabs(c - qpos));
      }
      if (dbl.dtable != nullptr) {
        part.table[static_cast<std::size_t>(slot * part.table_len + (qpos - c) + p.table_centre)] +=
            ds;
      }
      if (dbl.ddense != nullptr) dbl.ddense[((s * p.h + x) * p.i + r) * p.j + c] = ds;
    }
  }
  const std::int64_t qg = s * p.out_stride[0] + x * p.out_stride[1] + row * p.out_stride[2];
  for (std::int64_t e = 0; e < p.d; ++e) gq[qg + e] = dq[static_cast<std::size_t>(e)];
}

}  // namespace

void attention_backward_reference(const AttentionParams& p, const AttentionDouble& dbl) {
  if (p.b <= 0 || p.h <= 0) return;
  const GradLayout gl = grad_layout(p);
  const std::int64_t group = p.h / p.hk;
  Partials part;
  if (dbl.dslopes != nullptr) part.slopes.assign(static_cast<std::size_t>(p.b * p.h), 0.0);
  if (dbl.dtable != nullptr) {
    part.table_len = 2 * p.table_centre + 1;
    part.table.assign(static_cast<std::size_t>(p.b * p.h * part.table_len), 0.0);
  }
  if (dbl.ddense != nullptr) std::fill_n(dbl.ddense, p.b * p.h * p.i * p.j, 0.0);
  const std::int64_t tasks = p.b * p.hk;
#pragma omp parallel
  {
    std::vector<double> dq(static_cast<std::size_t>(p.d));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t s = t / p.hk, kvh = t % p.hk;
      const Sequence sq = sequence(p, s);
      for (std::int64_t c = 0; c < sq.j; ++c) {
        const std::int64_t gko = s * gl.k[0] + kvh * gl.k[1] + (sq.k_row0 + c) * gl.k[2];
        std::fill_n(static_cast<double*>(p.dk) + gko, p.d, 0.0);
        std::fill_n(static_cast<double*>(p.dv) + gko, p.d, 0.0);
      }
      for (std::int64_t x = kvh * group; x < (kvh + 1) * group; ++x) {
        for (std::int64_t r = 0; r < sq.i; ++r) backward_row(p, dbl, gl, part, sq, s, x, r, dq);
      }
    }
  }
  // The partials in sequence order: per-head slopes and the table sum over
  // the sequences, per-sequence slopes are their own.
  if (dbl.dslopes != nullptr) {
    const std::int64_t n = p.slopes_seq_stride == 0 ? p.h : p.b * p.h;
    std::fill_n(dbl.dslopes, n, 0.0);
    for (std::int64_t slot = 0; slot < p.b * p.h; ++slot) {
      dbl.dslopes[p.slopes_seq_stride == 0 ? slot % p.h : slot] +=
          part.slopes[static_cast<std::size_t>(slot)];
    }
  }
  if (dbl.dtable != nullptr) {
    std::fill_n(dbl.dtable, p.h * part.table_len, 0.0);
    for (std::int64_t slot = 0; slot < p.b * p.h; ++slot) {
      for (std::int64_t e = 0; e < part.table_len; ++e) {
        dbl.dtable[(slot % p.h) * part.table_len + e] +=
            part.table[static_cast<std::size_t>(slot * part.table_len + e)];
      }
    }
  }
}

}  // namespace posbias::detail
