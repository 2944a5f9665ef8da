// The LibTorch front end: modules against the core and against plain
// libtorch computations from SPEC.md, state-dict names, ->to(dtype),
// autograd of DynamicPositionBias and of the attention (against autograd of a
// plain libtorch attention in double), bad input, and concurrent use of one
// AlibiPositionalBias module.
#include "posbias/torch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"

namespace {

using posbias::nn::AlibiPositionalBias;
using posbias::nn::AlibiPositionalBiasOptions;

// SPEC.md: bias[h][r][c] = -m_h |c - q_r|, q_r = j - i + r, zero heads after.
torch::Tensor plain_alibi(const torch::Tensor& slopes, int64_t total, int64_t i, int64_t j) {
  const auto q = torch::arange(j - i, j, torch::kDouble).unsqueeze(1);
  const auto c = torch::arange(0, j, torch::kDouble).unsqueeze(0);
  auto b = -slopes.to(torch::kDouble).view({-1, 1, 1}) * (c - q).abs().unsqueeze(0);
  if (total > slopes.size(0)) {
    b = torch::cat({b, torch::zeros({total - slopes.size(0), i, j}, torch::kDouble)});
  }
  return b.to(torch::kFloat);
}

TEST(AlibiPositionalBias, MatchesSpecAndCoreWithZeroHeads) {
  AlibiPositionalBias m(AlibiPositionalBiasOptions(6).total_heads(8));
  const auto slopes = posbias::ops::alibi_slopes(6);
  for (auto ij :
       std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {1, 9}, {9, 9}, {3, 12}, {7, 5}}) {
    const auto got = m->forward(ij.first, ij.second);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{8, ij.first, ij.second}));
    EXPECT_TRUE(torch::equal(got, plain_alibi(slopes, 8, ij.first, ij.second)));
  }
  EXPECT_TRUE(torch::equal(m->slopes, slopes));
  std::ostringstream os;
  m->pretty_print(os);
  EXPECT_EQ(os.str(), "posbias::nn::AlibiPositionalBias(heads=6, total_heads=8)");
}

TEST(AlibiPositionalBias, ToBFloat16KeepsFloat32Slopes) {
  AlibiPositionalBias m(12);
  m->to(torch::kBFloat16);
  EXPECT_EQ(m->slopes.scalar_type(), torch::kFloat);
  EXPECT_EQ(m->named_buffers()["slopes"].scalar_type(), torch::kFloat);
  const auto got = m->forward(5, 70);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(
      got, plain_alibi(posbias::ops::alibi_slopes(12), 12, 5, 70).to(torch::kBFloat16)));
  // A parent module's ->to() reaches it too.
  torch::nn::Sequential seq(m);
  seq->to(torch::kHalf);
  EXPECT_EQ(m->slopes.scalar_type(), torch::kFloat);
  EXPECT_EQ(m->forward(2, 3).scalar_type(), torch::kHalf);
}

TEST(AlibiPositionalBias, ConcurrentCallsWithMixedSizesStayExact) {
  AlibiPositionalBias m(AlibiPositionalBiasOptions(4).total_heads(6));
  const auto slopes = posbias::ops::alibi_slopes(4);
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<torch::Tensor, std::pair<int64_t, int64_t>>> held;
      for (int it = 0; it < 40; ++it) {
        const int64_t j = 1 + (t * 7 + it * 13) % 97;
        const int64_t i = 1 + (t + it * 5) % j;
        held.push_back({m->forward(i, j), {i, j}});
      }
      for (const auto& h : held) {
        if (!torch::equal(h.first, plain_alibi(slopes, 6, h.second.first, h.second.second))) {
          ++bad[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(bad[static_cast<std::size_t>(t)], 0) << "thread " << t;
}

TEST(AlibiBias, SeedWorkedExample) {
  posbias::nn::AlibiBias m(posbias::nn::AlibiBiasOptions(1).causal(false).slopes({-0.2f}));
  const auto b = m->forward(3, 3);
  const auto want = torch::tensor({0.0f, -0.2f, -0.4f, -0.2f, 0.0f, -0.2f, -0.4f, -0.2f, 0.0f})
                        .view({1, 1, 3, 3});
  EXPECT_TRUE(torch::allclose(b, want));
  const auto scores =
      torch::tensor({1.0f, 2.0f, 3.0f, 2.0f, 1.5f, 2.5f, 3.0f, 2.5f, 1.2f}).view({1, 1, 3, 3});
  const auto expect =
      torch::tensor({1.0f, 1.8f, 2.6f, 1.8f, 1.5f, 2.3f, 2.6f, 2.3f, 1.2f}).view({1, 1, 3, 3});
  EXPECT_TRUE(torch::allclose(scores + b, expect));
}

TEST(AlibiOps, DistanceTableAndSeedBuildAreCoreCalls) {
  const auto slopes = posbias::ops::alibi_slopes(5);
  const std::vector<float> s(slopes.data_ptr<float>(), slopes.data_ptr<float>() + 5);
  for (int64_t j : {1, 4, 19}) {
    for (bool signed_d : {true, false}) {
      const auto t = posbias::ops::alibi_distance_table(slopes, j, signed_d);
      ASSERT_EQ(t.sizes(), (std::vector<int64_t>{5, 2 * j - 1}));
      // SPEC.md "Distance tables": entry e holds distance d = e - (j - 1).
      auto d = torch::arange(2 * j - 1, torch::kDouble) - static_cast<double>(j - 1);
      d = signed_d ? d.abs() : d.clamp_min(0);
      EXPECT_TRUE(
          torch::equal(t, (-slopes.to(torch::kDouble).view({-1, 1}) * d).to(torch::kFloat)));
      EXPECT_EQ(std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel()),
                posbias::alibi_distance_table(s, j, signed_d).to_float_vector());
    }
    EXPECT_TRUE(torch::equal(
        posbias::ops::expand_distance_table(posbias::ops::alibi_distance_table(slopes, j), j, j),
        plain_alibi(slopes, 5, j, j)));
  }
  const auto seed = torch::tensor({-0.1f, -0.3f, -0.7f});
  for (bool causal : {true, false}) {
    posbias::nn::AlibiBias m(
        posbias::nn::AlibiBiasOptions(3).causal(causal).slopes({-0.1f, -0.3f, -0.7f}));
    EXPECT_TRUE(
        torch::equal(posbias::ops::alibi_bias_build(seed, 3, causal, 4, 6), m->forward(4, 6)));
    m->to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(
        posbias::ops::alibi_bias_build(seed, 3, causal, 4, 6, torch::kBFloat16), m->forward(4, 6)));
  }
  const auto expect_value = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_value([&] { posbias::ops::alibi_distance_table(slopes, 0); },
               "alibi_distance_table: j must be >= 1, got 0");
  expect_value([] { posbias::ops::alibi_distance_table(torch::zeros({0}), 2); },
               "need at least one slope, got 0");
  expect_value([] { posbias::ops::alibi_distance_table(torch::tensor({NAN}), 2); },
               "slope 0 is not finite");
  expect_value([&] { posbias::ops::alibi_bias_build(seed, 2, true, 3, 3); },
               "AlibiBias: slopes must have n_heads = 2 entries, got 3");
  expect_value([&] { posbias::ops::alibi_bias_build(seed, 3, true, -1, 3); },
               "AlibiBias::build: lengths must be >= 0, got i = -1, j = 3");
  // float64 takes the reference path (issue 18): the products in double; an
  // integer output dtype is refused.
  const at::Tensor b64 = posbias::ops::alibi_bias_build(seed, 3, true, 2, 2, torch::kDouble);
  EXPECT_EQ(b64.scalar_type(), torch::kDouble);
  EXPECT_TRUE(
      torch::allclose(b64, posbias::ops::alibi_bias_build(seed, 3, true, 2, 2).to(torch::kDouble)));
  EXPECT_THROW(posbias::ops::alibi_bias_build(seed, 3, true, 2, 2, torch::kInt), c10::TypeError);
}

TEST(DynamicPositionBias, StateDictNamesValuesAndAutograd) {
  posbias::nn::DynamicPositionBias m(16, 4);
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"mlp.0.weight", "mlp.0.bias", "mlp.2.weight",
                                             "mlp.2.bias", "mlp.4.weight", "mlp.4.bias"}));
  // Same values as the core module loaded with the same state dict.
  posbias::DynamicPositionBias core(16, 4);
  posbias::TensorMap state;
  for (const auto& p : m->named_parameters()) {
    const auto c = p.value().detach().contiguous();
    std::vector<float> v(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    state[p.key()] = posbias::Tensor::from_vector(c.sizes().vec(), v);
  }
  core.load_state_dict(state);
  const auto got = m->forward(5, 9);
  const posbias::Tensor want = core.forward(5, 9);
  const auto wt = torch::tensor(at::ArrayRef<float>(want.to_float_vector())).view({4, 5, 9});
  EXPECT_TRUE(torch::allclose(got, wt, 1e-5, 1e-6));
  EXPECT_EQ(m->forward(0, 5).sizes(), (std::vector<int64_t>{4, 0, 5}));
  EXPECT_THROW(m->forward(6, 5), c10::Error);
  // distance_table(j) read at (q - c) + (j - 1) gives the same bias.
  const auto table = m->distance_table(9);
  ASSERT_EQ(table.sizes(), (std::vector<int64_t>{4, 17}));
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 9; ++c) {
      const int64_t e = (9 - 5 + r) - c + 8;
      EXPECT_TRUE(torch::allclose(got.select(1, r).select(1, c), table.select(1, e)));
    }
  }
  // Gradients (float32 module, through the core's reduction) against
  // autograd of the plain libtorch module in double: MLP on 0..j-1, then a
  // gather by |q_r - c|.
  const auto go = torch::randn({4, 3, 6}, torch::kDouble);
  m->zero_grad();
  (m->forward(3, 6) * go.to(torch::kFloat)).sum().backward();
  std::vector<torch::Tensor> ref;
  for (const auto& p : m->named_parameters()) {
    ref.push_back(p.value().detach().to(torch::kDouble).requires_grad_());
  }
  auto x = torch::arange(0, 6, torch::kDouble).unsqueeze(1);
  x = torch::silu(torch::nn::functional::linear(x, ref[0], ref[1]));
  x = torch::silu(torch::nn::functional::linear(x, ref[2], ref[3]));
  x = torch::nn::functional::linear(x, ref[4], ref[5]);  // [j, heads]
  const auto qpos = torch::arange(3, 6, torch::kLong).unsqueeze(1);
  const auto cpos = torch::arange(0, 6, torch::kLong).unsqueeze(0);
  const auto bias = x.t().index_select(1, (qpos - cpos).abs().reshape({-1})).view({4, 3, 6});
  (bias * go).sum().backward();
  std::size_t k = 0;
  for (const auto& p : m->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value().grad().to(torch::kDouble), ref[k].grad(), 1e-4, 1e-5))
        << p.key() << "\n"
        << p.value().grad() << "\n"
        << ref[k].grad();
    ++k;
  }
  // A float64 module takes the reference path (issue 18): the same bias,
  // computed in double.
  const at::Tensor b32 = m->forward(3, 6).detach();
  m->to(torch::kDouble);
  const at::Tensor b64 = m->forward(3, 6);
  EXPECT_EQ(b64.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::allclose(b64.to(torch::kFloat), b32, 1e-5, 1e-6));
}

// SPEC.md's rule, written with torch ops: table[h][(n - 1) / 2 + (q_r - c)].
torch::Tensor plain_expand(const torch::Tensor& table, int64_t i, int64_t j) {
  const int64_t centre = (table.size(1) - 1) / 2;
  const auto q = torch::arange(j - i, j, torch::kLong).unsqueeze(1);
  const auto c = torch::arange(0, j, torch::kLong).unsqueeze(0);
  const auto idx = (q - c + centre).reshape({-1});
  return table.index_select(1, idx).view({table.size(0), i, j});
}

TEST(DistanceTableOps, ExpandMatchesAGatherForManyShapesAndDtypes) {
  torch::manual_seed(3);
  for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 7}, {7, 3}, {5, 5}, {1, 300}, {40, 2}, {0, 4}}) {
    for (int64_t extra : {0, 5}) {
      const int64_t n = 2 * std::max(i, j) - 1 + 2 * extra;
      // A strided (transposed) table, as the fused attention's callers pass.
      const auto table = torch::randn({n, 3}).t();
      for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        SCOPED_TRACE(std::to_string(i) + " " + std::to_string(j) + " n " + std::to_string(n));
        const auto got = posbias::ops::expand_distance_table(table, i, j, dt);
        EXPECT_EQ(got.scalar_type(), dt);
        EXPECT_TRUE(torch::equal(got, plain_expand(table, i, j).to(dt)));
        // A 16-bit table gives a 16-bit bias by default, exactly its values.
        const auto t16 = table.to(dt);
        EXPECT_TRUE(
            torch::equal(posbias::ops::expand_distance_table(t16, i, j), plain_expand(t16, i, j)));
      }
    }
  }
}

TEST(DistanceTableOps, GradientsAreTheReductionAgainstAutogradOfAGather) {
  torch::manual_seed(4);
  for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{{4, 9}, {9, 4}, {1, 50}, {6, 6}}) {
    const int64_t n = 2 * std::max(i, j) - 1 + 2;
    const auto table = torch::randn({5, n}, torch::kDouble);
    const auto go = torch::randn({5, i, j}, torch::kDouble);
    auto t64 = table.clone().requires_grad_();
    (plain_expand(t64, i, j) * go).sum().backward();
    auto t32 = table.to(torch::kFloat).requires_grad_();
    (posbias::ops::expand_distance_table(t32, i, j) * go.to(torch::kFloat)).sum().backward();
    EXPECT_TRUE(torch::allclose(t32.grad().to(torch::kDouble), t64.grad(), 1e-5, 1e-5));
    // A bfloat16 table gets a bfloat16 gradient.
    auto t16 = table.to(torch::kBFloat16).requires_grad_();
    posbias::ops::expand_distance_table(t16, i, j).sum().backward();
    EXPECT_EQ(t16.grad().scalar_type(), torch::kBFloat16);
    // The reduction is differentiable too (its backward is the expansion):
    // d/dgrad sum(reduce(grad) * w) = expand(w).
    auto g = go.to(torch::kFloat).requires_grad_();
    const auto w = torch::randn({5, n});
    (posbias::ops::reduce_distance_table(g, n) * w).sum().backward();
    EXPECT_TRUE(torch::allclose(g.grad(), plain_expand(w, i, j)));
  }
}

TEST(DistanceTableOps, CoreErrorsAreValueErrorsWithTheCoreMessage) {
  const auto expect_value = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_value(
      [] {
        posbias::ops::expand_distance_table(torch::zeros({2, 8}), 2, 3);
      },
      "expand_distance_table: the table length n = 8 (table [2, 8]) must be odd");
  expect_value(
      [] {
        posbias::ops::expand_distance_table(torch::zeros({2, 7}), 5, 3);
      },
      "too short for i = 5, j = 3");
  expect_value(
      [] {
        posbias::ops::expand_distance_table(torch::zeros({2, 7}), -1, 3);
      },
      "i = -1, j = 3");
  expect_value(
      [] {
        posbias::ops::reduce_distance_table(torch::zeros({2, 3, 4}), 5);
      },
      "reduce_distance_table");
  // float64 is the reference path (issue 18), with the same kind of errors.
  EXPECT_EQ(
      posbias::ops::expand_distance_table(torch::zeros({2, 7}, torch::kDouble), 2, 3).scalar_type(),
      torch::kDouble);
  expect_value(
      [] {
        posbias::ops::expand_distance_table(torch::zeros({2, 7}, torch::kDouble), 5, 3);
      },
      "too short for i = 5, j = 3");
  EXPECT_THROW(posbias::ops::expand_distance_table(torch::zeros({2, 7}), 2, 3, torch::kInt),
               c10::TypeError);
}

TEST(RelativePositionBias, MatchesTheCoreTable) {
  posbias::nn::RelativePositionBias m(
      posbias::nn::RelativePositionBiasOptions(0.5).causal(false).heads(3));
  EXPECT_EQ(m->named_parameters().keys(),
            (std::vector<std::string>{"relative_attention_bias.weight"}));
  const auto b = m->forward(4, 7);
  const auto t = m->distance_table(7);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 7; ++c) {
      const int64_t rel = c - (7 - 4 + r);
      const int64_t bucket = posbias::t5_relative_position_bucket(rel, false, 32, 128);
      const auto want = m->relative_attention_bias->weight[bucket] * 0.5;
      EXPECT_TRUE(torch::allclose(b.select(1, r).select(1, c), want));
      EXPECT_TRUE(torch::allclose(t.select(1, (7 - 4 + r) - c + 6), want));
    }
  }
  // i > j (query positions below zero): the core expands a table built for
  // max(i, j), read at its centre.
  const auto tall = m->forward(7, 4);
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      const int64_t bucket = posbias::t5_relative_position_bucket(c - (4 - 7 + r), false, 32, 128);
      EXPECT_TRUE(torch::allclose(tall.select(1, r).select(1, c),
                                  m->relative_attention_bias->weight[bucket] * 0.5));
    }
  }
}

// Attention in plain libtorch (double), the SPEC formula.
torch::Tensor plain_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& bias, bool causal) {
  const int64_t h = q.size(1), hk = k.size(1), i = q.size(2), j = k.size(2);
  const auto kk = k.repeat_interleave(h / hk, 1);
  const auto vv = v.repeat_interleave(h / hk, 1);
  auto s = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  if (bias.defined()) s = s + bias;
  if (causal) {
    const auto qp = torch::arange(j - i, j).unsqueeze(1);
    const auto cp = torch::arange(0, j).unsqueeze(0);
    s = s.masked_fill(cp > qp, -INFINITY);
  }
  return torch::matmul(torch::softmax(s, -1), vv);
}

TEST(AttentionOp, ValuesAndGradientsAgainstPlainLibtorch) {
  torch::manual_seed(1);
  for (const std::string kind : {"none", "alibi", "table", "dense"}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(kind + (causal ? " causal" : ""));
      const int64_t b = 2, h = 4, hk = 2, i = 5, j = 9, d = 3;
      auto q = torch::randn({b, h, i, d}, torch::kDouble).requires_grad_();
      auto k = torch::randn({b, hk, j, d}, torch::kDouble).requires_grad_();
      auto v = torch::randn({b, hk, j, d}, torch::kDouble).requires_grad_();
      const auto slopes = posbias::ops::alibi_slopes(h);
      auto table = torch::randn({h, 2 * j - 1}, torch::kDouble).requires_grad_();
      auto dense = torch::randn({h, i, j}, torch::kDouble).requires_grad_();
      torch::Tensor bias;
      const auto qp = torch::arange(j - i, j).unsqueeze(1);
      const auto cp = torch::arange(0, j).unsqueeze(0);
      if (kind == "alibi") {
        bias = -slopes.to(torch::kDouble).view({-1, 1, 1}) * (cp - qp).abs().to(torch::kDouble);
      } else if (kind == "table") {
        bias = table.index_select(1, (qp - cp + j - 1).reshape({-1})).view({h, i, j});
      } else if (kind == "dense") {
        bias = dense;
      }
      const auto want = plain_attention(q, k, v, bias, causal);
      const auto go = torch::randn_like(want);
      const auto want_grads =
          torch::autograd::grad({want}, {q, k, v, table, dense}, {go}, c10::nullopt, false, true);
      // The op in float32 on the same values.
      auto qf = q.detach().to(torch::kFloat).requires_grad_();
      auto kf = k.detach().to(torch::kFloat).requires_grad_();
      auto vf = v.detach().to(torch::kFloat).requires_grad_();
      auto tf = table.detach().to(torch::kFloat).requires_grad_();
      auto df = dense.detach().to(torch::kFloat).requires_grad_();
      c10::optional<at::Tensor> s_opt, t_opt, d_opt;
      if (kind == "alibi") s_opt = slopes;
      if (kind == "table") t_opt = tf;
      if (kind == "dense") d_opt = df;
      const auto got =
          posbias::ops::attention(qf, kf, vf, kind, s_opt, t_opt, d_opt, c10::nullopt, causal);
      EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want, 1e-4, 1e-5));
      got.backward(go.to(torch::kFloat));
      const std::vector<torch::Tensor> mine = {qf.grad(), kf.grad(), vf.grad(), tf.grad(),
                                               df.grad()};
      for (std::size_t x = 0; x < 5; ++x) {
        if (!want_grads[x].defined()) {
          EXPECT_FALSE(mine[x].defined()) << x;
          continue;
        }
        ASSERT_TRUE(mine[x].defined()) << x;
        EXPECT_TRUE(torch::allclose(mine[x].to(torch::kDouble), want_grads[x], 1e-4, 1e-5))
            << x << "\n"
            << mine[x] << "\n"
            << want_grads[x];
      }
    }
  }
}

TEST(AttentionOp, LseAndNonContiguousAnd16Bit) {
  const auto qb = torch::randn({1, 6, 2, 8});  // [b, len, h, d]
  const auto q = qb.transpose(1, 2);
  const auto k = torch::randn({1, 2, 6, 8});
  auto [out, lse] = posbias::ops::attention_lse(q, k, k, "none");
  const auto s = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(8.0);
  EXPECT_TRUE(torch::allclose(lse, torch::logsumexp(s, -1), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(out, plain_attention(q, k, k, {}, false), 1e-4, 1e-5));
  const auto o16 = posbias::ops::attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16),
                                           k.to(torch::kBFloat16));
  EXPECT_EQ(o16.scalar_type(), torch::kBFloat16);
}

TEST(AttentionOp, BadInputIsACleanError) {
  const auto q = torch::zeros({1, 2, 3, 4});
  auto expect_msg = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { posbias::ops::attention(q, q, q, "bogus"); }, "bias must be");
  expect_msg(
      [&] {
        const auto kv = q.view({1, 2, 4, 3});
        posbias::ops::attention(q, kv, kv);
      },
      "head dimension");
  // float64 is accepted (the core's double path); mixed with float32 it is refused.
  expect_msg([&] { posbias::ops::attention(q.to(torch::kDouble), q, q); },
             "one dtype, got Double, Float, Float");
  expect_msg([&] { posbias::ops::attention(q.to(torch::kInt), q, q); },
             "float32, bfloat16, float16 or float64");
  expect_msg([&] { posbias::ops::attention(q, q, q, "alibi"); }, "needs slopes");
  expect_msg([&] { posbias::ops::attention(q, q, q, "alibi", posbias::ops::alibi_slopes(3)); },
             "ALiBi needs");
  expect_msg([&] { posbias::ops::attention(q.view({2, 3, 4}), q, q); }, "4-d");
  expect_msg([&] { posbias::ops::alibi_slopes(0); }, "heads");
  expect_msg([&] { posbias::ops::alibi_bias(posbias::ops::alibi_slopes(4), 2, 2, 3); },
             "total_heads");
  expect_msg([&] { posbias::nn::DynamicPositionBias(0, 4); }, "dim and heads");
}

}  // namespace
