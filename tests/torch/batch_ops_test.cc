// The batch ops of the op library (torch/src/batch_ops.cc) from C++, through
// the dispatcher as a LibTorch user calls them after loading the library:
// values against a naive formula written here with ATen in double
// (include/posbias/attention.h's contract: rel = q_pos - k_pos; score =
// softcap ? cap tanh(scale q.k / cap) : scale q.k; minus slope |rel|; key
// visible iff causal: rel >= 0, left >= 0: rel <= left, right >= 0: -rel <=
// right, and the key mask; a row that sees no key gives zeros), gradients
// from the ops' own autograd (C++ Functions) against autograd of that formula,
// Meta kernels, and bad input messages.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using OptT = c10::optional<at::Tensor>;
using Pair = std::tuple<at::Tensor, at::Tensor>;

// Loads the op library once (its TORCH_LIBRARY registrations).
void load_ops() {
  static void* handle = dlopen(POSBIAS_TORCH_OPS_FILE, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(handle, nullptr) << dlerror();
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

Pair options_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const OptT& slopes, c10::optional<int64_t> q_offset, int64_t left,
                     int64_t right, double softcap, const OptT& key_mask, bool causal = true,
                     const OptT& table = {}) {
  static auto h = op<Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptT&,
                          const OptT&, const OptT&, c10::optional<double>, bool,
                          c10::optional<int64_t>, int64_t, int64_t, double, const OptT&)>(
      "posbias::attention_options_forward");
  return h.call(q, k, v, slopes, table, OptT(), c10::nullopt, causal, q_offset, left, right,
                softcap, key_mask);
}

Pair varlen_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& cu_q, const at::Tensor& cu_k, const OptT& slopes,
                    bool causal, int64_t left, int64_t right, double softcap) {
  static auto h =
      op<Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const OptT&, const OptT&, c10::optional<double>, bool, int64_t,
              int64_t, double)>("posbias::attention_varlen_forward");
  return h.call(q, k, v, cu_q, cu_k, slopes, OptT(), c10::nullopt, causal, left, right, softcap);
}

at::Tensor kvcache(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc,
                   const at::Tensor& seqlens, const OptT& block_table, const OptT& slopes,
                   bool causal) {
  static auto h = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const OptT&, const OptT&, const OptT&,
                                c10::optional<double>, bool, int64_t, int64_t, double)>(
      "posbias::attention_kvcache");
  return h.call(q, kc, vc, seqlens, block_table, slopes, OptT(), c10::nullopt, causal, -1, -1,
                0.0);
}

void append(const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& seqlens,
            const OptT& block_table, const at::Tensor& k, const at::Tensor& v) {
  static auto h = op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptT&,
                          const at::Tensor&, const at::Tensor&)>("posbias::kvcache_append");
  h.call(kc, vc, seqlens, block_table, k, v);
}

// The naive formula for one sequence: q [h, i, d], k, v [hk, j, d] (double);
// slopes [h] double or undefined; mask [j] bool or undefined. (out, lse).
Pair naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& slopes, int64_t q_offset, bool causal, int64_t left, int64_t right,
           double softcap, const at::Tensor& mask) {
  const int64_t h = q.size(0), i = q.size(1), j = k.size(1);
  const at::Tensor kk = k.repeat_interleave(h / k.size(0), 0);
  const at::Tensor vv = v.repeat_interleave(h / v.size(0), 0);
  at::Tensor s = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(double(q.size(2)));
  if (softcap > 0) s = softcap * torch::tanh(s / softcap);
  const at::Tensor rel = (torch::arange(i, torch::kDouble) + double(q_offset)).unsqueeze(1) -
                         torch::arange(j, torch::kDouble).unsqueeze(0);
  if (slopes.defined()) s = s - slopes.view({h, 1, 1}) * rel.abs();
  at::Tensor vis = torch::ones({i, j}, torch::kBool);
  if (causal) vis = vis & (rel >= 0);
  if (left >= 0) vis = vis & (rel <= double(left));
  if (right >= 0) vis = vis & (-rel <= double(right));
  if (mask.defined()) vis = vis & mask.to(torch::kBool).unsqueeze(0);
  vis = vis.expand({h, i, j});
  const at::Tensor any = vis.any(-1, true);
  const at::Tensor neg = torch::full({}, -INFINITY, torch::kDouble);
  const at::Tensor s2 = torch::where(any, torch::where(vis, s, neg), torch::zeros_like(s));
  const at::Tensor p = torch::softmax(s2, -1) * vis;
  const at::Tensor lse = torch::where(any.squeeze(-1), torch::logsumexp(s2, -1), neg);
  return {torch::matmul(p, vv), lse};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol = 2e-4) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const at::Tensor g = got.to(torch::kDouble);
  const double scale = 1.0 + (want.numel() ? want.abs().max().item<double>() : 0.0);
  const double err = want.numel() ? (g - want).abs().max().item<double>() : 0.0;
  EXPECT_LE(err, tol * scale) << "got\n" << got << "\nwant\n" << want;
}

at::Tensor leaf(at::IntArrayRef shape) { return torch::randn(shape).requires_grad_(); }

at::Tensor as_double_leaf(const at::Tensor& t) {
  return t.detach().to(torch::kDouble).requires_grad_();
}

struct OptionCase {
  bool causal;
  c10::optional<int64_t> q_offset;
  int64_t left, right;
  double softcap;
  bool masked;
};

TEST(BatchOps, OptionsForwardAndGradientsAgainstTheNaiveFormula) {
  load_ops();
  torch::manual_seed(2);
  const int64_t b = 2, h = 4, hk = 2, i = 5, j = 9, d = 8;
  for (const OptionCase& c :
       {OptionCase{true, c10::nullopt, -1, -1, 0.0, false}, OptionCase{true, 11, 3, -1, 0.0, true},
        OptionCase{false, -2, 2, 1, 4.0, true}, OptionCase{true, 6, 0, 0, 3.0, false}}) {
    SCOPED_TRACE(std::string("causal ") + (c.causal ? "1" : "0") + " left " +
                 std::to_string(c.left) + " right " + std::to_string(c.right));
    at::Tensor q = leaf({b, h, i, d}), k = leaf({b, hk, j, d}), v = leaf({b, hk, j, d});
    at::Tensor slopes = (torch::rand({h}) * 0.5 + 0.05).requires_grad_();
    const OptT mask = c.masked ? OptT(torch::rand({b, j}) > 0.3) : OptT();
    auto [out, lse] =
        options_forward(q, k, v, slopes, c.q_offset, c.left, c.right, c.softcap, mask, c.causal);
    ASSERT_TRUE(out.requires_grad());
    EXPECT_FALSE(lse.requires_grad());
    const at::Tensor go = torch::randn_like(out);
    out.backward(go);
    const at::Tensor sd = as_double_leaf(slopes);
    for (int64_t s = 0; s < b; ++s) {
      const at::Tensor qd = as_double_leaf(q[s]), kd = as_double_leaf(k[s]),
                       vd = as_double_leaf(v[s]);
      auto [want, want_lse] = naive(qd, kd, vd, sd, c.q_offset.value_or(j - i), c.causal, c.left,
                                    c.right, c.softcap, mask ? (*mask)[s] : at::Tensor());
      expect_close(out.detach()[s], want.detach());
      const at::Tensor fin = torch::isfinite(want_lse);
      EXPECT_TRUE(torch::equal(torch::isfinite(lse[s]), fin));
      expect_close(lse[s].masked_select(fin), want_lse.detach().masked_select(fin));
      want.backward(go[s].to(torch::kDouble));
      expect_close(q.grad()[s], qd.grad(), 3e-4);
      expect_close(k.grad()[s], kd.grad(), 3e-4);
      expect_close(v.grad()[s], vd.grad(), 3e-4);
    }
    ASSERT_TRUE(slopes.grad().defined());
    EXPECT_EQ(slopes.grad().sizes(), slopes.sizes());
    expect_close(slopes.grad(), sd.grad(), 3e-4);
  }
}

TEST(BatchOps, VarlenForwardAndGradientsAgainstThePerSequenceFormula) {
  load_ops();
  torch::manual_seed(3);
  const int64_t h = 4, hk = 1, d = 8;
  const std::vector<int64_t> lq = {3, 0, 6, 2}, lk = {5, 4, 6, 1};  // i > j in the last
  std::vector<int32_t> cq = {0}, ck = {0};
  for (std::size_t s = 0; s < lq.size(); ++s) {
    cq.push_back(cq.back() + static_cast<int32_t>(lq[s]));
    ck.push_back(ck.back() + static_cast<int32_t>(lk[s]));
  }
  const at::Tensor cu_q = torch::tensor(cq, torch::kInt), cu_k = torch::tensor(ck, torch::kInt);
  at::Tensor q = leaf({cq.back(), h, d}), k = leaf({ck.back(), hk, d}),
             v = leaf({ck.back(), hk, d});
  at::Tensor slopes = (torch::rand({h}) * 0.5 + 0.05).requires_grad_();
  auto [out, lse] = varlen_forward(q, k, v, cu_q, cu_k, slopes, true, 2, -1, 5.0);
  EXPECT_EQ(lse.sizes(), (std::vector<int64_t>{h, cq.back()}));
  const at::Tensor go = torch::randn_like(out);
  out.backward(go);
  const at::Tensor sd = as_double_leaf(slopes);
  for (std::size_t s = 0; s < lq.size(); ++s) {
    if (lq[s] == 0) continue;
    SCOPED_TRACE("sequence " + std::to_string(s));
    const at::Tensor qs = q.narrow(0, cq[s], lq[s]).transpose(0, 1);
    const at::Tensor ks = k.narrow(0, ck[s], lk[s]).transpose(0, 1);
    const at::Tensor vs = v.narrow(0, ck[s], lk[s]).transpose(0, 1);
    const at::Tensor qd = as_double_leaf(qs), kd = as_double_leaf(ks), vd = as_double_leaf(vs);
    auto [want, want_lse] = naive(qd, kd, vd, sd, lk[s] - lq[s], true, 2, -1, 5.0, at::Tensor());
    expect_close(out.detach().narrow(0, cq[s], lq[s]).transpose(0, 1), want.detach());
    want.backward(go.narrow(0, cq[s], lq[s]).transpose(0, 1).to(torch::kDouble));
    expect_close(q.grad().narrow(0, cq[s], lq[s]).transpose(0, 1), qd.grad(), 3e-4);
    expect_close(k.grad().narrow(0, ck[s], lk[s]).transpose(0, 1), kd.grad(), 3e-4);
    expect_close(v.grad().narrow(0, ck[s], lk[s]).transpose(0, 1), vd.grad(), 3e-4);
  }
  expect_close(slopes.grad(), sd.grad(), 3e-4);
}

TEST(BatchOps, KvcacheAppendThenAttendAgainstTheFormula) {
  load_ops();
  torch::manual_seed(4);
  const int64_t b = 2, hk = 2, h = 4, d = 8, max_len = 12, n = 2;
  const at::Tensor kc = torch::randn({b, max_len, hk, d}), vc = torch::randn({b, max_len, hk, d});
  const at::Tensor seqlens = torch::tensor(std::vector<int32_t>{4, 9}, torch::kInt);
  const at::Tensor kn = torch::randn({b, n, hk, d}), vn = torch::randn({b, n, hk, d});
  append(kc, vc, seqlens, OptT(), kn, vn);
  for (int64_t s = 0; s < b; ++s) {
    const int64_t at = seqlens[s].item<int64_t>();
    EXPECT_TRUE(torch::equal(kc[s].narrow(0, at, n), kn[s]));
    EXPECT_TRUE(torch::equal(vc[s].narrow(0, at, n), vn[s]));
  }
  const at::Tensor lens = seqlens + n;
  const at::Tensor q = torch::randn({b, 1, h, d}), slopes = torch::rand({h}) * 0.3;
  const at::Tensor out = kvcache(q, kc, vc, lens.to(torch::kInt), OptT(), slopes, true);
  EXPECT_EQ(out.sizes(), q.sizes());
  for (int64_t s = 0; s < b; ++s) {
    const int64_t j = lens[s].item<int64_t>();
    const auto [want, lse] =
        naive(q[s].transpose(0, 1).to(torch::kDouble),
              kc[s].narrow(0, 0, j).transpose(0, 1).to(torch::kDouble),
              vc[s].narrow(0, 0, j).transpose(0, 1).to(torch::kDouble), slopes.to(torch::kDouble),
              j - 1, true, -1, -1, 0.0, at::Tensor());
    expect_close(out[s].transpose(0, 1), want);
  }
}

TEST(BatchOps, MetaTensorsGiveShapesWithoutRunning) {
  load_ops();
  const auto m = [](at::IntArrayRef shape) { return torch::empty(shape, torch::kMeta); };
  auto [out, lse] = options_forward(m({2, 4, 5, 8}), m({2, 2, 9, 8}), m({2, 2, 9, 8}), m({4}), 3,
                                    2, -1, 0.0, OptT());
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 4, 5, 8}));
  EXPECT_EQ(lse.sizes(), (std::vector<int64_t>{2, 4, 5}));
  const at::Tensor cu = torch::empty({3}, torch::TensorOptions().dtype(torch::kInt).device(
                                              torch::kMeta));
  auto [vo, vl] = varlen_forward(m({7, 4, 8}), m({11, 2, 8}), m({11, 2, 8}), cu, cu, OptT(), true,
                                 -1, -1, 0.0);
  EXPECT_EQ(vo.sizes(), (std::vector<int64_t>{7, 4, 8}));
  EXPECT_EQ(vl.sizes(), (std::vector<int64_t>{4, 7}));
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BatchOps, BadInputIsACleanErrorNamingTheValues) {
  load_ops();
  const at::Tensor q = torch::zeros({1, 2, 3, 4}), k = torch::zeros({1, 2, 5, 4});
  expect_error([&] { options_forward(q, k, k, OptT(), c10::nullopt, -2, -1, 0.0, OptT()); },
               "window entries must be >= -1 (-1: unbounded), got {-2, -1}");
  expect_error([&] { options_forward(q, k, k, OptT(), c10::nullopt, -1, -1, -1.5, OptT()); },
               "softcap must be finite and >= 0 (0: off), got -1.5");
  expect_error(
      [&] { options_forward(q, k, k, OptT(), c10::nullopt, -1, -1, 0.0, torch::ones({1, 5})); },
      "key_mask must be bool or uint8, got Float");
  expect_error(
      [&] {
        options_forward(q, k, k, OptT(), c10::nullopt, -1, -1, 0.0,
                        torch::ones({1, 4}, torch::kBool));
      },
      "key_mask must be bool or uint8 [b, j] = [1, 5], got bool [1, 4]");
  expect_error([&] { options_forward(q, k, k, torch::ones({3}), c10::nullopt, -1, -1, 0.0, {}); },
               "got 3 slopes for h = 2, b = 1");
  const at::Tensor qv = torch::zeros({4, 2, 4}), kv = torch::zeros({6, 2, 4});
  const at::Tensor cu = torch::tensor(std::vector<int32_t>{0, 4}, torch::kInt);
  const at::Tensor cuk = torch::tensor(std::vector<int32_t>{0, 6}, torch::kInt);
  expect_error([&] { varlen_forward(qv, kv, kv, cu.to(torch::kLong), cuk, OptT(), true, -1, -1,
                                    0.0); },
               "cu_seqlens_q must be int32, got Long");
  expect_error(
      [&] {
        varlen_forward(qv, kv, kv, torch::tensor(std::vector<int32_t>{0, 3}, torch::kInt), cuk,
                       OptT(), true, -1, -1, 0.0);
      },
      "cu_seqlens_q must end at the token count 4, got 3");
  expect_error(
      [&] { varlen_forward(qv, kv.to(torch::kHalf), kv, cu, cuk, OptT(), true, -1, -1, 0.0); },
      "got float32, float16, float32");
}

}  // namespace
