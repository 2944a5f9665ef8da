// Packed variable-length batches (issue 16): attention_varlen_forward, its
// lse and attention_varlen_reference against the naive formula per sequence
// and against one dense call per sequence, over empty sequences, i > j,
// every bias kind a packed call takes, window, softcap, grouped-query heads
// and dtype pairs. And the bad input of cu_seqlens and the refused options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_naive.h"
#include "attention_test_util.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::Shape;

struct VarlenCase {
  std::vector<std::int64_t> iq, jk;  // queries and keys of each sequence
  std::int64_t h = 2, hk = 1, d = 8;
  DType qt = DType::kFloat32, kvt = DType::kFloat32;
  bool causal = false;
  std::int64_t left = -1, right = -1;
  float softcap = 0.0f;
  int bias = 0;          // 0 none, 1 ALiBi [h], 2 ALiBi [b, h], 3 centred table
  bool strided = false;  // q, k, v as slices of a wider last dimension
  std::uint32_t seed = 1;
};

// [tokens, heads, d] random values in dtype, contiguous or a strided view.
Tensor packed(std::int64_t tokens, std::int64_t heads, std::int64_t d, DType dt, bool strided,
              std::uint32_t seed) {
  if (!strided) return test::random_tensor({tokens, heads, d}, seed).to(dt);
  return test::random_tensor({tokens, heads, d + 3}, seed).to(dt).slice(2, 2, 2 + d);
}

Tensor offsets(const std::vector<std::int64_t>& lens) {
  std::vector<float> cu{0.0f};
  for (std::int64_t n : lens) cu.push_back(cu.back() + static_cast<float>(n));
  return Tensor::from_vector({static_cast<std::int64_t>(cu.size())}, cu).to(DType::kInt32);
}

void check_varlen_case(const VarlenCase& c) {
  const auto b = static_cast<std::int64_t>(c.iq.size());
  std::int64_t tq = 0, tk = 0, longest = 0;
  std::vector<std::int64_t> q0, k0;
  for (std::int64_t s = 0; s < b; ++s) {
    q0.push_back(tq);
    k0.push_back(tk);
    tq += c.iq[static_cast<std::size_t>(s)];
    tk += c.jk[static_cast<std::size_t>(s)];
    longest =
        std::max({longest, c.iq[static_cast<std::size_t>(s)], c.jk[static_cast<std::size_t>(s)]});
  }
  SCOPED_TRACE("b " + std::to_string(b) + " total_q " + std::to_string(tq) + " total_k " +
               std::to_string(tk) + " h " + std::to_string(c.h) + " hk " + std::to_string(c.hk) +
               " d " + std::to_string(c.d) + " " + dtype_name(c.qt) + "/" + dtype_name(c.kvt) +
               " causal " + std::to_string(c.causal) + (c.strided ? " strided" : "") + " window {" +
               std::to_string(c.left) + ", " + std::to_string(c.right) + "} softcap " +
               std::to_string(c.softcap) + " bias " + std::to_string(c.bias));
  const Tensor q = packed(tq, c.h, c.d, c.qt, c.strided, c.seed);
  const Tensor k = packed(tk, c.hk, c.d, c.kvt, c.strided, c.seed + 1);
  const Tensor v = packed(tk, c.hk, c.d, c.kvt, c.strided, c.seed + 2);
  const std::vector<float> qv = q.to_float_vector(), kv = k.to_float_vector(),
                           vv = v.to_float_vector();
  const Tensor cq = offsets(c.iq), ck = offsets(c.jk);

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window = {c.left, c.right};
  opt.softcap = c.softcap;
  std::mt19937 gen(c.seed + 9);
  std::uniform_real_distribution<float> u(0.05f, 0.6f);
  std::vector<float> slopes, table;
  const std::int64_t n = 2 * (longest + 4) + 1;  // centred, longer than needed
  AttentionBias bias;
  if (c.bias == 1 || c.bias == 2) {
    for (std::int64_t x = 0; x < (c.bias == 1 ? c.h : b * c.h); ++x) slopes.push_back(u(gen));
    bias = AttentionBias::alibi(slopes);
  } else if (c.bias == 3) {
    for (std::int64_t x = 0; x < c.h * n; ++x) table.push_back(u(gen) - 0.3f);
    bias = AttentionBias::distance_table(Tensor::from_vector({c.h, n}, table));
  }

  std::vector<float> want(static_cast<std::size_t>(tq * c.h * c.d));
  std::vector<double> want_lse(static_cast<std::size_t>(c.h * tq));
  std::vector<float> per_seq(want.size());
  for (std::int64_t s = 0; s < b; ++s) {
    test::NaiveSeq a;
    a.h = c.h, a.hk = c.hk, a.d = c.d;
    a.i = c.iq[static_cast<std::size_t>(s)];
    a.j = c.jk[static_cast<std::size_t>(s)];
    for (std::int64_t x = 0; x < c.h; ++x) {
      for (std::int64_t r = 0; r < a.i; ++r) {
        for (std::int64_t e = 0; e < c.d; ++e) {
          a.q.push_back(qv[static_cast<std::size_t>(((q0[s] + r) * c.h + x) * c.d + e)]);
        }
      }
    }
    for (std::int64_t x = 0; x < c.hk; ++x) {
      for (std::int64_t r = 0; r < a.j; ++r) {
        for (std::int64_t e = 0; e < c.d; ++e) {
          a.k.push_back(kv[static_cast<std::size_t>(((k0[s] + r) * c.hk + x) * c.d + e)]);
          a.v.push_back(vv[static_cast<std::size_t>(((k0[s] + r) * c.hk + x) * c.d + e)]);
        }
      }
    }
    a.q_offset = a.j - a.i;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    a.causal = c.causal, a.left = c.left, a.right = c.right, a.softcap = c.softcap;
    if (c.bias == 1) a.slopes = slopes;
    if (c.bias == 2) a.slopes.assign(slopes.begin() + s * c.h, slopes.begin() + (s + 1) * c.h);
    if (c.bias == 3) a.table = table, a.table_n = n;
    const test::NaiveOut o = test::naive_attention(a);
    // One dense call of this sequence alone (per-sequence slopes as [h]).
    AttentionBias dense_bias = bias;
    if (c.bias == 2) dense_bias = AttentionBias::alibi(a.slopes);
    const Tensor ds =
        attention_forward(Tensor::from_vector({1, c.h, a.i, c.d}, a.q).to(c.qt),
                          Tensor::from_vector({1, c.hk, a.j, c.d}, a.k).to(c.kvt),
                          Tensor::from_vector({1, c.hk, a.j, c.d}, a.v).to(c.kvt), dense_bias, opt);
    const std::vector<float> dv = ds.to_float_vector();
    for (std::int64_t x = 0; x < c.h; ++x) {
      for (std::int64_t r = 0; r < a.i; ++r) {
        want_lse[static_cast<std::size_t>(x * tq + q0[s] + r)] =
            o.lse[static_cast<std::size_t>(x * a.i + r)];
        for (std::int64_t e = 0; e < c.d; ++e) {
          const auto at = static_cast<std::size_t>(((q0[s] + r) * c.h + x) * c.d + e);
          want[at] = static_cast<float>(o.out[static_cast<std::size_t>((x * a.i + r) * c.d + e)]);
          per_seq[at] = dv[static_cast<std::size_t>((x * a.i + r) * c.d + e)];
        }
      }
    }
  }
  if (c.qt != DType::kFloat32) {
    want = Tensor::from_vector({static_cast<std::int64_t>(want.size())}, want)
               .to(c.qt)
               .to_float_vector();
  }
  const double atol = test::naive_atol(c.qt), rtol = test::naive_rtol(c.qt);
  const AttentionForwardResult fl = attention_varlen_forward_lse(q, k, v, cq, ck, bias, opt);
  ASSERT_EQ(fl.out.shape(), (Shape{tq, c.h, c.d}));
  ASSERT_EQ(fl.lse.shape(), (Shape{c.h, tq}));
  test::expect_close(fl.out.to_float_vector(), want, "varlen_forward_lse", atol, rtol);
  ASSERT_NO_FATAL_FAILURE(test::expect_lse_near(fl.lse, want_lse));
  const std::vector<float> fwd =
      attention_varlen_forward(q, k, v, cq, ck, bias, opt).to_float_vector();
  test::expect_close(fwd, want, "varlen_forward", atol, rtol);
  test::expect_close(fwd, per_seq, "varlen_forward vs dense per sequence", atol, rtol);
  test::expect_close(attention_varlen_reference(q, k, v, cq, ck, bias, opt).to_float_vector(), want,
                     "varlen_reference", atol, rtol);
}

const DType kPairs[5][2] = {{DType::kFloat32, DType::kFloat32},
                            {DType::kBFloat16, DType::kBFloat16},
                            {DType::kFloat16, DType::kFloat16},
                            {DType::kFloat32, DType::kBFloat16},
                            {DType::kFloat32, DType::kFloat16}};

TEST(AttentionVarlen, MatchesNaiveAndDensePerSequenceOverOptions) {
  const std::vector<std::vector<std::int64_t>> iqs = {{3, 1, 4}, {0, 5, 2, 0}, {1}, {7, 0, 33}};
  const std::vector<std::vector<std::int64_t>> jks = {{3, 5, 4}, {4, 2, 9, 0}, {70}, {7, 3, 40}};
  const std::int64_t windows[4][2] = {{-1, -1}, {2, -1}, {1, 3}, {0, 0}};
  std::uint32_t seed = 300;
  for (std::size_t t = 0; t < iqs.size(); ++t) {
    for (const auto& w : windows) {
      for (bool causal : {false, true}) {
        for (int bias = 0; bias < 4; ++bias) {
          VarlenCase c;
          c.iq = iqs[t], c.jk = jks[t];
          c.h = 4, c.hk = t % 2 ? 2 : 1;
          c.d = t == 3 ? 80 : t == 2 ? 1 : 33;
          c.left = w[0], c.right = w[1];
          c.causal = causal;
          c.softcap = seed % 3 == 0 ? 2.0f : 0.0f;
          c.bias = bias;
          c.qt = kPairs[seed % 5][0], c.kvt = kPairs[seed % 5][1];
          c.strided = seed % 3 == 1;
          c.seed = seed++;
          check_varlen_case(c);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionVarlen, ManyRandomSequencesWithHeadDimension128) {
  std::mt19937 gen(11);
  VarlenCase c;
  for (int s = 0; s < 9; ++s) {
    c.iq.push_back(std::int64_t(gen() % 20));
    c.jk.push_back(std::max<std::int64_t>(0, c.iq.back() + std::int64_t(gen() % 30) - 5));
  }
  c.h = 8, c.hk = 2, c.d = 128, c.causal = true, c.bias = 2, c.seed = 77;
  check_varlen_case(c);
}

// ------------------------------------------------------------ bad input

struct Packed {
  Tensor q = test::random_tensor({6, 2, 4}, 1);
  Tensor k = test::random_tensor({9, 1, 4}, 2);
};

Tensor ints(const std::vector<float>& v, DType dt = DType::kInt32) {
  return Tensor::from_vector({static_cast<std::int64_t>(v.size())}, v).to(dt);
}

void expect_varlen_bad(const Tensor& cq, const Tensor& ck, const std::string& needle,
                       const AttentionBias& bias = {}, const AttentionOptions& opt = {}) {
  const Packed p;
  test::expect_throw_with<std::invalid_argument>(
      [&] { attention_varlen_forward(p.q, p.k, p.k, cq, ck, bias, opt); }, needle);
  test::expect_throw_with<std::invalid_argument>(
      [&] { attention_varlen_reference(p.q, p.k, p.k, cq, ck, bias, opt); }, needle);
}

TEST(AttentionVarlenErrors, CuSeqlensThatDecrease) {
  expect_varlen_bad(ints({0, 4, 2, 6}), ints({0, 3, 6, 9}), "entry 2 is 2 after 4");
}

TEST(AttentionVarlenErrors, CuSeqlensThatDoNotStartAtZero) {
  expect_varlen_bad(ints({0, 3, 6}), ints({1, 3, 9}), "cu_seqlens_k must start at 0, got 1");
}

TEST(AttentionVarlenErrors, CuSeqlensThatDoNotEndAtTheTotal) {
  expect_varlen_bad(ints({0, 3, 5}), ints({0, 3, 9}), "6");    // total_q is 6
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 10}), "10");  // total_k is 9
}

TEST(AttentionVarlenErrors, CuSeqlensNotInt32OrOfDifferentLengths) {
  expect_varlen_bad(ints({0, 3, 6}, DType::kFloat32), ints({0, 3, 9}), "float32");
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}, DType::kUInt8), "uint8");
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 4, 9}), "got 3 and 4");
  expect_varlen_bad(ints({}), ints({}), "[0]");
}

TEST(AttentionVarlenErrors, RefusedOptionsAndBias) {
  AttentionOptions off;
  off.q_offset = 2;
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}), "q_offset", {}, off);
  AttentionOptions masked;
  masked.key_mask = Tensor::full({2, 9}, 1.0f, DType::kBool);
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}), "key_mask", {}, masked);
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}), "dense",
                    AttentionBias::dense_bias(Tensor::full({1, 2, 6, 9}, 0.0f)));
  // Per-sequence slopes with the wrong b (b = 2, h = 2: 2 or 4 slopes).
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}), "6",
                    AttentionBias::alibi(std::vector<float>(6, 0.1f)));
  // Table too short: sequence 1 has 3 queries at 3..5 against 6 keys.
  expect_varlen_bad(ints({0, 3, 6}), ints({0, 3, 9}), "distance 5",
                    AttentionBias::distance_table(Tensor::full({2, 5}, 0.0f)));
}

}  // namespace
}  // namespace posbias
