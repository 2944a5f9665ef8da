// Shared by the option, varlen, KV-cache and serving tests: an independent
// naive attention formula in double for ONE sequence, written from the spec
// (rel = q_pos - k_pos; softcap; + bias; visible iff causal rel >= 0,
// rel <= left, -rel <= right, key mask 1; a row seeing no key gives zeros),
// not from the library's AttentionParams helpers. Inputs are plain float
// vectors (the values a 16-bit tensor holds, widened exactly).
#ifndef POSBIAS_TESTS_UNIT_ATTENTION_NAIVE_H_
#define POSBIAS_TESTS_UNIT_ATTENTION_NAIVE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::test {

// One sequence: q [h, i, d], k and v [hk, j, d], row-major.
struct NaiveSeq {
  std::int64_t h = 1, hk = 1, i = 0, j = 0, d = 1;
  std::vector<float> q, k, v;
  std::int64_t q_offset = 0;  // position of row 0 minus that of key 0
  double scale = 1.0;
  bool causal = false;
  std::int64_t left = -1, right = -1;
  double softcap = 0.0;
  std::vector<std::uint8_t> key_mask;  // j entries, or empty
  std::vector<float> slopes;           // h entries (ALiBi), or empty
  std::vector<float> table;            // [h, n] row-major (distance table), or empty
  std::int64_t table_n = 0;
  std::vector<float> dense;  // [h, i, j] additive, or empty
};

struct NaiveOut {
  std::vector<double> out;  // [h, i, d]
  std::vector<double> lse;  // [h, i]
};

inline NaiveOut naive_attention(const NaiveSeq& a) {
  const double inf = std::numeric_limits<double>::infinity();
  NaiveOut res;
  res.out.assign(static_cast<std::size_t>(a.h * a.i * a.d), 0.0);
  res.lse.assign(static_cast<std::size_t>(a.h * a.i), -inf);
  for (std::int64_t x = 0; x < a.h; ++x) {
    const std::int64_t kv = x / (a.h / a.hk);
    for (std::int64_t r = 0; r < a.i; ++r) {
      const std::int64_t qpos = a.q_offset + r;
      std::vector<double> s(static_cast<std::size_t>(a.j), -inf);
      std::vector<bool> seen(static_cast<std::size_t>(a.j), false);
      double mx = -inf;
      for (std::int64_t c = 0; c < a.j; ++c) {
        const std::int64_t rel = qpos - c;
        if (a.causal && rel < 0) continue;
        if (a.left >= 0 && rel > a.left) continue;
        if (a.right >= 0 && -rel > a.right) continue;
        if (!a.key_mask.empty() && a.key_mask[static_cast<std::size_t>(c)] == 0) continue;
        double dot = 0.0;
        for (std::int64_t e = 0; e < a.d; ++e) {
          dot += static_cast<double>(a.q[static_cast<std::size_t>((x * a.i + r) * a.d + e)]) *
                 a.k[static_cast<std::size_t>((kv * a.j + c) * a.d + e)];
        }
        double sc = a.scale * dot;
        if (a.softcap > 0) sc = a.softcap * std::tanh(sc / a.softcap);
        if (!a.slopes.empty()) sc -= a.slopes[static_cast<std::size_t>(x)] * std::fabs(double(rel));
        if (!a.table.empty()) {
          sc += a.table[static_cast<std::size_t>(x * a.table_n + rel + (a.table_n - 1) / 2)];
        }
        if (!a.dense.empty()) sc += a.dense[static_cast<std::size_t>((x * a.i + r) * a.j + c)];
        s[static_cast<std::size_t>(c)] = sc;
        seen[static_cast<std::size_t>(c)] = true;
        mx = std::max(mx, sc);
      }
      if (mx == -inf) continue;
      double sum = 0.0;
      double* o = &res.out[static_cast<std::size_t>((x * a.i + r) * a.d)];
      for (std::int64_t c = 0; c < a.j; ++c) {
        if (!seen[static_cast<std::size_t>(c)]) continue;
        const double w = std::exp(s[static_cast<std::size_t>(c)] - mx);
        sum += w;
        for (std::int64_t e = 0; e < a.d; ++e) {
          o[e] += w * a.v[static_cast<std::size_t>((kv * a.j + c) * a.d + e)];
        }
      }
      for (std::int64_t e = 0; e < a.d; ++e) o[e] /= sum;
      res.lse[static_cast<std::size_t>(x * a.i + r)] = mx + std::log(sum);
    }
  }
  return res;
}

// Tolerances of a result in dtype against the double formula.
inline double naive_atol(DType t) {
  return t == DType::kBFloat16 ? 1e-2 : t == DType::kFloat16 ? 2e-3 : 2e-5;
}
inline double naive_rtol(DType t) {
  return t == DType::kBFloat16 ? 1e-2 : t == DType::kFloat16 ? 2e-3 : 2e-4;
}

// A call's lse (float32, any layout) against the formula's, element by
// element in the same order: -inf where the formula's is (a row that sees
// no key), else within 2e-4 + 2e-5 |want|. Fatal on the first miss (wrap
// the call in ASSERT_NO_FATAL_FAILURE).
inline void expect_lse_near(const Tensor& got, const std::vector<double>& want) {
  const std::vector<float> lse = got.to_float_vector();
  ASSERT_EQ(lse.size(), want.size());
  for (std::size_t x = 0; x < lse.size(); ++x) {
    if (std::isinf(want[x])) {
      ASSERT_TRUE(std::isinf(lse[x]) && lse[x] < 0)
          << "lse " << x << " is " << lse[x] << ", expected -inf";
    } else {
      ASSERT_NEAR(lse[x], want[x], 2e-4 + 2e-5 * std::fabs(want[x])) << "lse " << x;
    }
  }
}

// Uniform values in [lo, hi) as a float32 tensor, converted to dtype, and
// the values it then holds (exact widening).
inline std::vector<float> values_of(const Tensor& t) { return t.to_float_vector(); }

}  // namespace posbias::test

#endif  // POSBIAS_TESTS_UNIT_ATTENTION_NAIVE_H_
