// The plain reference path of every attention call (see
// attention_reference.h): one row at a time, scores and sums in double, no
// blocking and no SIMD, so that it reads as the definition:
//
//   rel = q_pos - k_pos; score = softcap ? cap tanh(scale q.k / cap) : scale q.k
//   plus -slope |rel| (ALiBi), table[rel] (distance table) or dense[r][c];
//   softmax over the visible keys (causal, window, key mask); times v.
//
// A row that sees no key, or whose visible scores are all -inf, outputs
// zeros and lse -inf. A NaN score (or a +inf one, whose softmax is 0/0)
// makes the row NaN. A -inf score is a score: its v row is still read.
#include "attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dtype_dispatch.h"
#include "posbias/dtype.h"

namespace posbias::detail {

std::int64_t reference_key_offset(const AttentionParams& p, const Sequence& sq, std::int64_t s,
                                  std::int64_t kvh, std::int64_t c, const std::int64_t* stride) {
  if (p.key_layout == KeyLayout::kPaged) {
    const std::int64_t block =
        p.block_table[s * p.block_table_stride[0] + (c / p.block_size) * p.block_table_stride[1]];
    return block * stride[0] + kvh * stride[1] + (c % p.block_size) * stride[2];
  }
  return s * stride[0] + kvh * stride[1] + (sq.k_row0 + c) * stride[2];
}

bool reference_key_masked(const AttentionParams& p, std::int64_t s, std::int64_t c) {
  return p.key_mask != nullptr &&
         p.key_mask[s * p.key_mask_stride[0] + c * p.key_mask_stride[1]] == 0;
}

ReferenceScore reference_score(const AttentionParams& p, const AttentionDouble& dbl,
                               const Sequence& sq, std::int64_t s, std::int64_t x, std::int64_t r,
                               std::int64_t qpos, std::int64_t c) {
  const std::int64_t kvh = x / (p.h / p.hk);
  const std::int64_t qo = s * p.q_stride[0] + x * p.q_stride[1] + (sq.q_row0 + r) * p.q_stride[2];
  const std::int64_t ko = reference_key_offset(p, sq, s, kvh, c, p.k_stride);
  double dot = 0.0;
  for (std::int64_t e = 0; e < p.d; ++e) {
    dot += load_element(p.q, p.dtype, qo + e * p.q_stride[3]) *
           load_element(p.k, p.kv_dtype, ko + e * p.k_stride[3]);
  }
  ReferenceScore sc;
  sc.score = dbl.scale * dot;
  if (dbl.softcap > 0.0) {
    const double t = std::tanh(sc.score / dbl.softcap);
    sc.score = dbl.softcap * t;
    sc.dcap = 1.0 - t * t;
  }
  const double dist = static_cast<double>(std::llabs(c - qpos));
  switch (p.bias) {
    case FusedBias::kAlibi:
      sc.score -= (dbl.slopes != nullptr ? dbl.slopes[s * p.slopes_seq_stride + x]
                                         : static_cast<double>(slope_of(p, s, x))) *
                  dist;
      break;
    case FusedBias::kTable: {
      const std::int64_t at = x * p.rtable_stride + table_index(p, c - qpos);
      sc.score += dbl.rtable != nullptr ? dbl.rtable[at] : static_cast<double>(p.rtable[at]);
      break;
    }
    case FusedBias::kDense: {
      const std::int64_t at = s * p.dense_stride[0] + x * p.dense_stride[1] +
                              r * p.dense_stride[2] + c * p.dense_stride[3];
      sc.score += dbl.dense != nullptr ? dbl.dense[at] : static_cast<double>(p.dense[at]);
      break;
    }
    case FusedBias::kNone:
      break;
  }
  return sc;
}

namespace {

// One row: scores into `scores` (indexed from the first visible key), then
// the output and lse. `acc` holds d doubles.
void run_row(const AttentionParams& p, const AttentionDouble& dbl, const Sequence& sq,
             std::int64_t s, std::int64_t x, std::int64_t r, std::vector<double>& scores,
             std::vector<double>& acc) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::int64_t qpos = sq.q_offset + r;
  const KeyRange kr = visible_keys(p, sq.j, qpos);
  double mx = -kInf;
  bool nan = false;
  for (std::int64_t c = kr.begin; c < kr.end; ++c) {
    double& sc = scores[static_cast<std::size_t>(c - kr.begin)];
    sc =
        reference_key_masked(p, s, c) ? -kInf : reference_score(p, dbl, sq, s, x, r, qpos, c).score;
    if (std::isnan(sc)) nan = true;
    if (sc > mx) mx = sc;
  }
  std::fill(acc.begin(), acc.end(), 0.0);
  double lse = -kInf;
  if (nan || mx == kInf) {
    std::fill(acc.begin(), acc.end(), std::numeric_limits<double>::quiet_NaN());
    lse = std::numeric_limits<double>::quiet_NaN();
  } else if (mx > -kInf) {
    const std::int64_t kvh = x / (p.h / p.hk);
    double sum = 0.0;
    for (std::int64_t c = kr.begin; c < kr.end; ++c) {
      if (reference_key_masked(p, s, c)) continue;  // never read
      const double w = std::exp(scores[static_cast<std::size_t>(c - kr.begin)] - mx);
      sum += w;
      const std::int64_t vo = reference_key_offset(p, sq, s, kvh, c, p.v_stride);
      for (std::int64_t e = 0; e < p.d; ++e) {
        acc[static_cast<std::size_t>(e)] +=
            w * load_element(p.v, p.kv_dtype, vo + e * p.v_stride[3]);
      }
    }
    for (double& a : acc) a /= sum;
    lse = mx + std::log(sum);
  }
  const std::int64_t row = sq.q_row0 + r;
  const std::int64_t oo = s * p.out_stride[0] + x * p.out_stride[1] + row * p.out_stride[2];
  for (std::int64_t e = 0; e < p.d; ++e) {
    store_element(p.out, p.dtype, oo + e * p.out_stride[3], acc[static_cast<std::size_t>(e)]);
  }
  const std::int64_t lo = s * p.lse_stride[0] + x * p.lse_stride[1] + row * p.lse_stride[2];
  if (dbl.lse != nullptr) dbl.lse[lo] = lse;
  if (p.lse != nullptr) p.lse[lo] = static_cast<float>(lse);
}

}  // namespace

void attention_reference_run(const AttentionParams& p, const AttentionDouble* dbl_in) {
  if (p.b <= 0 || p.h <= 0) return;
  AttentionDouble plain;  // a float call: p's scale, softcap and float bias
  plain.scale = p.scale;
  plain.softcap = p.softcap;
  const AttentionDouble& dbl = dbl_in != nullptr ? *dbl_in : plain;
  std::int64_t rows = 0, keys = 0;  // the longest sequence's
  for (std::int64_t s = 0; s < p.b; ++s) {
    const Sequence sq = sequence(p, s);
    rows = std::max(rows, sq.i);
    keys = std::max(keys, sq.j);
  }
  const std::int64_t tasks = p.b * p.h * rows;
#pragma omp parallel
  {
    std::vector<double> scores(static_cast<std::size_t>(keys));
    std::vector<double> acc(static_cast<std::size_t>(p.d));
#pragma omp for schedule(dynamic, 4)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t s = t / (p.h * rows);
      const std::int64_t x = (t / rows) % p.h;
      const std::int64_t r = t % rows;
      const Sequence sq = sequence(p, s);
      if (r < sq.i) run_row(p, dbl, sq, s, x, r, scores, acc);
    }
  }
}

}  // namespace posbias::detail
