// The ops of attention's options and batch layouts (issues 16 and 17), a
// fragment of the posbias op library: forward and backward of dense
// attention with q_offset / window / softcap / key_mask, of packed
// variable-length batches (FlashAttention-2's varlen layout), attention
// against a KV cache and kvcache_append. CPU kernels only: each is one core
// call (the core checks every argument; its messages reach Python as
// ValueError). Autograd: the forward ops' Autograd kernels are
// torch::autograd::Functions whose backward is the *_backward op's kernel,
// so LibTorch C++ callers get gradients as Python does (gradients of q, k,
// v, the slopes and the table or dense bias, in their dtypes and shapes);
// the backward and KV-cache ops' Autograd kernels are their CPU kernels (no
// gradient). Meta tensors reach the Meta kernels of meta_ops.h from every
// Autograd kernel (as in ops.cc).
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "core_bridge.h"
#include "meta_ops.h"
#include "posbias/attention.h"

namespace posbias {
namespace {

using torch_bridge::check_cpu;
using torch_bridge::core_call;
using torch_bridge::to_torch;
using torch_bridge::view_of;

using OptT = c10::optional<at::Tensor>;
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

bool given(const OptT& t) { return t.has_value() && t->defined(); }

// The bias and options of a call, with the float32 copies they view.
struct Call {
  AttentionBias bias;
  AttentionOptions options;
  at::Tensor table32, dense32, mask;
};

// q float64: the bias in double for the core's float64 path (issue 18).
Call make_call(const char* who, const at::Tensor& q, const OptT& slopes, const OptT& table,
               const OptT& dense, c10::optional<double> scale, bool causal,
               c10::optional<int64_t> q_offset, int64_t left, int64_t right, double softcap,
               const OptT& key_mask) {
  Call c;
  const bool f64 = q.scalar_type() == at::kDouble;
  TORCH_CHECK_VALUE(given(slopes) + given(table) + given(dense) <= 1, "posbias.", who,
                    ": give at most one of slopes, table and dense");
  if (given(slopes)) {
    c.bias = torch_bridge::attention_slopes_bias(*slopes, f64, who);
  } else if (given(table)) {
    c.bias = AttentionBias::distance_table(
        torch_bridge::attention_bias_tensor(*table, f64, who, "table", &c.table32));
  } else if (given(dense)) {
    c.bias = AttentionBias::dense_bias(
        torch_bridge::attention_bias_tensor(*dense, f64, who, "dense", &c.dense32));
  }
  if (scale) {
    TORCH_CHECK_VALUE(std::isfinite(*scale), "posbias.", who, ": scale must be finite, got ",
                      *scale);
    c.options.scale = *scale;
  }
  c.options.causal = causal;
  if (q_offset) c.options.q_offset = *q_offset;
  c.options.window = AttentionWindow{left, right};
  c.options.softcap = softcap;
  if (given(key_mask)) {
    check_cpu(*key_mask, who, "key_mask");
    const at::ScalarType st = key_mask->scalar_type();
    TORCH_CHECK_TYPE(st == at::kBool || st == at::kByte, "posbias.", who,
                     ": key_mask must be bool or uint8, got ", st);
    c.mask = *key_mask;
    c.options.key_mask = view_of(c.mask, st == at::kBool ? DType::kBool : DType::kUInt8);
  }
  return c;
}

// q, k, v as core views: one float dtype for q, one for k and v (the core
// checks the pair).
std::vector<Tensor> qkv(const char* who, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v) {
  check_cpu(q, who, "q");
  check_cpu(k, who, "k");
  check_cpu(v, who, "v");
  using torch_bridge::float_dtype_of;
  return {view_of(q, float_dtype_of(q, who, "q")), view_of(k, float_dtype_of(k, who, "k")),
          view_of(v, float_dtype_of(v, who, "v"))};
}

Tensor int_view(const char* who, const at::Tensor& t, const char* name) {
  check_cpu(t, who, name);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, "posbias.", who, ": ", name, " must be int32, got ",
                   t.scalar_type());
  return view_of(t, DType::kInt32);
}

Tensor block_view(const char* who, const OptT& block_table) {
  return given(block_table) ? int_view(who, *block_table, "block_table") : Tensor();
}

// The core's gradients as torch tensors; a kind without a gradient gives an
// empty float32 tensor (an op returns no undefined tensor).
Grads to_grads(const AttentionGradients& g, const OptT& slopes, const OptT& table,
               const OptT& dense) {
  at::Tensor gs = at::empty({0}, at::kFloat), gt = gs, gd = gs;
  if (given(slopes) && !g.grad_slopes.empty()) {
    gs = torch_bridge::attention_slope_grad(g, !g.grad_slopes_f64.empty()).view(slopes->sizes());
  }
  if (given(table)) gt = to_torch(g.grad_table);
  if (given(dense)) gd = to_torch(g.grad_dense);
  return {to_torch(g.grad_q), to_torch(g.grad_k), to_torch(g.grad_v), gs, gt, gd};
}

Tensor go_view(const char* who, const at::Tensor& go, const at::Tensor& out) {
  check_cpu(go, who, "grad_out");
  const at::Tensor g = go.scalar_type() == out.scalar_type() ? go : go.to(out.scalar_type());
  return view_of(g, torch_bridge::float_dtype_of(g, who, "grad_out"));
}

std::tuple<at::Tensor, at::Tensor> attention_options_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptT& slopes,
    const OptT& table, const OptT& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> q_offset, int64_t left, int64_t right, double softcap,
    const OptT& key_mask) {
  const char* who = "attention";
  const Call c = make_call(who, q, slopes, table, dense, scale, causal, q_offset, left, right,
                           softcap, key_mask);
  const std::vector<Tensor> t = qkv(who, q, k, v);
  const AttentionForwardResult r =
      core_call([&] { return attention_forward_lse(t[0], t[1], t[2], c.bias, c.options); });
  return {to_torch(r.out), to_torch(r.lse)};
}

Grads attention_options_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const OptT& slopes, const OptT& table, const OptT& dense,
                                 c10::optional<double> scale, bool causal,
                                 c10::optional<int64_t> q_offset, int64_t left, int64_t right,
                                 double softcap, const OptT& key_mask, const at::Tensor& out,
                                 const at::Tensor& lse, const at::Tensor& grad_out) {
  const char* who = "attention_backward";
  const Call c = make_call(who, q, slopes, table, dense, scale, causal, q_offset, left, right,
                           softcap, key_mask);
  const std::vector<Tensor> t = qkv(who, q, k, v);
  const Tensor go = go_view(who, grad_out, out);
  const Tensor o = view_of(out, torch_bridge::float_dtype_of(out, who, "out"));
  at::Tensor lse_kept;
  const Tensor l =
      torch_bridge::attention_lse_view(lse, q.scalar_type() == at::kDouble, who, &lse_kept);
  const AttentionGradients g =
      core_call([&] { return attention_backward(t[0], t[1], t[2], c.bias, c.options, o, l, go); });
  return to_grads(g, slopes, table, dense);
}

std::tuple<at::Tensor, at::Tensor> attention_varlen_forward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
    const at::Tensor& cu_k, const OptT& slopes, const OptT& table, c10::optional<double> scale,
    bool causal, int64_t left, int64_t right, double softcap) {
  const char* who = "attention_varlen";
  const Call c = make_call(who, q, slopes, table, c10::nullopt, scale, causal, c10::nullopt, left,
                           right, softcap, c10::nullopt);
  const std::vector<Tensor> t = qkv(who, q, k, v);
  const Tensor cq = int_view(who, cu_q, "cu_seqlens_q"), ck = int_view(who, cu_k, "cu_seqlens_k");
  const AttentionForwardResult r = core_call(
      [&] { return attention_varlen_forward_lse(t[0], t[1], t[2], cq, ck, c.bias, c.options); });
  return {to_torch(r.out), to_torch(r.lse)};
}

Grads attention_varlen_backward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_q, const at::Tensor& cu_k,
                                   const OptT& slopes, const OptT& table,
                                   c10::optional<double> scale, bool causal, int64_t left,
                                   int64_t right, double softcap, const at::Tensor& out,
                                   const at::Tensor& lse, const at::Tensor& grad_out) {
  const char* who = "attention_varlen_backward";
  const Call c = make_call(who, q, slopes, table, c10::nullopt, scale, causal, c10::nullopt, left,
                           right, softcap, c10::nullopt);
  const std::vector<Tensor> t = qkv(who, q, k, v);
  const Tensor cq = int_view(who, cu_q, "cu_seqlens_q"), ck = int_view(who, cu_k, "cu_seqlens_k");
  const Tensor go = go_view(who, grad_out, out);
  const Tensor o = view_of(out, torch_bridge::float_dtype_of(out, who, "out"));
  at::Tensor lse_kept;
  const Tensor l =
      torch_bridge::attention_lse_view(lse, q.scalar_type() == at::kDouble, who, &lse_kept);
  const AttentionGradients g = core_call([&] {
    return attention_varlen_backward(t[0], t[1], t[2], cq, ck, c.bias, c.options, o, l, go);
  });
  return to_grads(g, slopes, table, c10::nullopt);
}

// The KV-cache call: out, and the lse [b, h, i] when want_lse (an
// undefined tensor otherwise).
std::tuple<at::Tensor, at::Tensor> kvcache_call(const at::Tensor& q, const at::Tensor& k_cache,
                                                const at::Tensor& v_cache,
                                                const at::Tensor& cache_seqlens,
                                                const OptT& block_table, const OptT& slopes,
                                                const OptT& table, c10::optional<double> scale,
                                                bool causal, int64_t left, int64_t right,
                                                double softcap, bool want_lse) {
  const char* who = "attention_with_kvcache";
  const Call c = make_call(who, q, slopes, table, c10::nullopt, scale, causal, c10::nullopt, left,
                           right, softcap, c10::nullopt);
  const std::vector<Tensor> t = qkv(who, q, k_cache, v_cache);
  const Tensor sl = int_view(who, cache_seqlens, "cache_seqlens");
  const Tensor bt = block_view(who, block_table);
  return core_call([&]() -> std::tuple<at::Tensor, at::Tensor> {
    if (!want_lse) {
      return {to_torch(attention_kvcache_forward(t[0], t[1], t[2], sl, bt, c.bias, c.options)),
              at::Tensor()};
    }
    const AttentionForwardResult r =
        attention_kvcache_forward_lse(t[0], t[1], t[2], sl, bt, c.bias, c.options);
    return {to_torch(r.out), to_torch(r.lse)};
  });
}

at::Tensor attention_kvcache_op(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                const OptT& block_table, const OptT& slopes, const OptT& table,
                                c10::optional<double> scale, bool causal, int64_t left,
                                int64_t right, double softcap) {
  return std::get<0>(kvcache_call(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table,
                                  scale, causal, left, right, softcap, false));
}

std::tuple<at::Tensor, at::Tensor> attention_kvcache_lse_op(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cache_seqlens, const OptT& block_table, const OptT& slopes, const OptT& table,
    c10::optional<double> scale, bool causal, int64_t left, int64_t right, double softcap) {
  return kvcache_call(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table, scale, causal,
                      left, right, softcap, true);
}

void kvcache_append_op(const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& cache_seqlens, const OptT& block_table,
                       const at::Tensor& k, const at::Tensor& v) {
  const char* who = "kvcache_append";
  std::vector<Tensor> caches = qkv(who, k_cache, k_cache, v_cache);
  const std::vector<Tensor> kv = qkv(who, k, k, v);
  const Tensor sl = int_view(who, cache_seqlens, "cache_seqlens");
  const Tensor bt = block_view(who, block_table);
  core_call([&] { kvcache_append(caches[0], caches[2], sl, bt, kv[0], kv[2]); });
}

// ---------------------------------------------------------------------------
// Autograd.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

OptT opt(const at::Tensor& t) { return t.defined() ? OptT(t) : OptT(); }

at::Tensor or_undefined(const OptT& t) { return given(t) ? *t : at::Tensor(); }

// A float32 gradient g of the input t in t's dtype and shape; undefined when
// t was not given or the kind has no gradient for it.
at::Tensor grad_like(const at::Tensor& g, const OptT& t) {
  if (!given(t) || !g.defined() || g.numel() != t->numel()) return at::Tensor();
  return g.to(t->scalar_type()).reshape(t->sizes());
}

// The incoming gradient of out (zeros when out's gradient is undefined).
at::Tensor grad_of_out(const variable_list& grads, const at::Tensor& out) {
  return grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
}

// The scalar options every differentiable batch op saves for its backward.
void save_options(AutogradContext* ctx, c10::optional<double> scale, bool causal, int64_t left,
                  int64_t right, double softcap) {
  ctx->saved_data["scale"] = scale;
  ctx->saved_data["causal"] = causal;
  ctx->saved_data["left"] = left;
  ctx->saved_data["right"] = right;
  ctx->saved_data["softcap"] = softcap;
}

struct SavedOptions {
  c10::optional<double> scale;
  bool causal;
  int64_t left, right;
  double softcap;
};

SavedOptions saved_options(AutogradContext* ctx) {
  const c10::IValue sv = ctx->saved_data["scale"];
  return {sv.isNone() ? c10::nullopt : c10::optional<double>(sv.toDouble()),
          ctx->saved_data["causal"].toBool(), ctx->saved_data["left"].toInt(),
          ctx->saved_data["right"].toInt(), ctx->saved_data["softcap"].toDouble()};
}

// Dense attention with options: out differentiable in q, k, v, slopes, table
// and dense; lse not differentiable; key_mask has no gradient.
class OptionsAttention : public torch::autograd::Function<OptionsAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const OptT& slopes, const OptT& table,
                               const OptT& dense, c10::optional<double> scale, bool causal,
                               c10::optional<int64_t> q_offset, int64_t left, int64_t right,
                               double softcap, const OptT& key_mask) {
    auto [out, lse] = attention_options_forward(q, k, v, slopes, table, dense, scale, causal,
                                                q_offset, left, right, softcap, key_mask);
    ctx->save_for_backward({q, k, v, out, lse, or_undefined(slopes), or_undefined(table),
                            or_undefined(dense), or_undefined(key_mask)});
    save_options(ctx, scale, causal, left, right, softcap);
    ctx->saved_data["q_offset"] = q_offset;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const SavedOptions o = saved_options(ctx);
    const c10::IValue qo = ctx->saved_data["q_offset"];
    const c10::optional<int64_t> q_offset =
        qo.isNone() ? c10::nullopt : c10::optional<int64_t>(qo.toInt());
    const OptT slopes = opt(s[5]), table = opt(s[6]), dense = opt(s[7]);
    const Grads g = attention_options_backward(s[0], s[1], s[2], slopes, table, dense, o.scale,
                                               o.causal, q_offset, o.left, o.right, o.softcap,
                                               opt(s[8]), s[3], s[4], grad_of_out(grads, s[3]));
    const at::Tensor none;
    return {std::get<0>(g),
            std::get<1>(g),
            std::get<2>(g),
            grad_like(std::get<3>(g), slopes),
            grad_like(std::get<4>(g), table),
            grad_like(std::get<5>(g), dense),
            none,
            none,
            none,
            none,
            none,
            none,
            none};
  }
};

// Packed variable-length attention: out differentiable in q, k, v, slopes and
// table; lse not differentiable; cu_seqlens have no gradient.
class VarlenAttention : public torch::autograd::Function<VarlenAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& cu_q, const at::Tensor& cu_k,
                               const OptT& slopes, const OptT& table, c10::optional<double> scale,
                               bool causal, int64_t left, int64_t right, double softcap) {
    auto [out, lse] = attention_varlen_forward_op(q, k, v, cu_q, cu_k, slopes, table, scale, causal,
                                                  left, right, softcap);
    ctx->save_for_backward(
        {q, k, v, out, lse, cu_q, cu_k, or_undefined(slopes), or_undefined(table)});
    save_options(ctx, scale, causal, left, right, softcap);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const SavedOptions o = saved_options(ctx);
    const OptT slopes = opt(s[7]), table = opt(s[8]);
    const Grads g = attention_varlen_backward_op(s[0], s[1], s[2], s[5], s[6], slopes, table,
                                                 o.scale, o.causal, o.left, o.right, o.softcap,
                                                 s[3], s[4], grad_of_out(grads, s[3]));
    const at::Tensor none;
    return {std::get<0>(g),
            std::get<1>(g),
            std::get<2>(g),
            none,
            none,
            grad_like(std::get<3>(g), slopes),
            grad_like(std::get<4>(g), table),
            none,
            none,
            none,
            none,
            none};
  }
};

bool any_meta(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    if (meta::is_meta(*t)) return true;
  }
  return false;
}

std::tuple<at::Tensor, at::Tensor> attention_options_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptT& slopes,
    const OptT& table, const OptT& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> q_offset, int64_t left, int64_t right, double softcap,
    const OptT& key_mask) {
  if (any_meta({&q, &k, &v})) {
    return meta::attention_options_forward(q, k, v, slopes, table, dense, scale, causal, q_offset,
                                           left, right, softcap, key_mask);
  }
  const variable_list r = OptionsAttention::apply(q, k, v, slopes, table, dense, scale, causal,
                                                  q_offset, left, right, softcap, key_mask);
  return {r[0], r[1]};
}

Grads attention_options_backward_autograd(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const OptT& slopes,
                                          const OptT& table, const OptT& dense,
                                          c10::optional<double> scale, bool causal,
                                          c10::optional<int64_t> q_offset, int64_t left,
                                          int64_t right, double softcap, const OptT& key_mask,
                                          const at::Tensor& out, const at::Tensor& lse,
                                          const at::Tensor& grad_out) {
  if (any_meta({&q, &k, &v})) {
    return meta::attention_options_backward(q, k, v, slopes, table, dense, scale, causal, q_offset,
                                            left, right, softcap, key_mask, out, lse, grad_out);
  }
  return attention_options_backward(q, k, v, slopes, table, dense, scale, causal, q_offset, left,
                                    right, softcap, key_mask, out, lse, grad_out);
}

std::tuple<at::Tensor, at::Tensor> attention_varlen_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
    const at::Tensor& cu_k, const OptT& slopes, const OptT& table, c10::optional<double> scale,
    bool causal, int64_t left, int64_t right, double softcap) {
  if (any_meta({&q, &k, &v})) {
    return meta::attention_varlen_forward(q, k, v, cu_q, cu_k, slopes, table, scale, causal, left,
                                          right, softcap);
  }
  const variable_list r = VarlenAttention::apply(q, k, v, cu_q, cu_k, slopes, table, scale, causal,
                                                 left, right, softcap);
  return {r[0], r[1]};
}

Grads attention_varlen_backward_autograd(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& cu_q,
                                         const at::Tensor& cu_k, const OptT& slopes,
                                         const OptT& table, c10::optional<double> scale,
                                         bool causal, int64_t left, int64_t right, double softcap,
                                         const at::Tensor& out, const at::Tensor& lse,
                                         const at::Tensor& grad_out) {
  if (any_meta({&q, &k, &v})) {
    return meta::attention_varlen_backward(q, k, v, cu_q, cu_k, slopes, table, scale, causal, left,
                                           right, softcap, out, lse, grad_out);
  }
  return attention_varlen_backward_op(q, k, v, cu_q, cu_k, slopes, table, scale, causal, left,
                                      right, softcap, out, lse, grad_out);
}

at::Tensor attention_kvcache_autograd(const at::Tensor& q, const at::Tensor& k_cache,
                                      const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                      const OptT& block_table, const OptT& slopes,
                                      const OptT& table, c10::optional<double> scale, bool causal,
                                      int64_t left, int64_t right, double softcap) {
  if (any_meta({&q, &k_cache, &v_cache})) {
    return meta::attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table,
                                   scale, causal, left, right, softcap);
  }
  return attention_kvcache_op(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table, scale,
                              causal, left, right, softcap);
}

std::tuple<at::Tensor, at::Tensor> attention_kvcache_lse_autograd(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cache_seqlens, const OptT& block_table, const OptT& slopes, const OptT& table,
    c10::optional<double> scale, bool causal, int64_t left, int64_t right, double softcap) {
  if (any_meta({&q, &k_cache, &v_cache})) {
    return meta::attention_kvcache_lse(q, k_cache, v_cache, cache_seqlens, block_table, slopes,
                                       table, scale, causal, left, right, softcap);
  }
  return attention_kvcache_lse_op(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table,
                                  scale, causal, left, right, softcap);
}

void kvcache_append_autograd(const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& cache_seqlens, const OptT& block_table,
                             const at::Tensor& k, const at::Tensor& v) {
  if (any_meta({&k_cache, &v_cache, &k, &v})) {
    meta::kvcache_append(k_cache, v_cache, cache_seqlens, block_table, k, v);
    return;
  }
  kvcache_append_op(k_cache, v_cache, cache_seqlens, block_table, k, v);
}

}  // namespace
}  // namespace posbias

TORCH_LIBRARY_FRAGMENT(posbias, m) {
  m.def(
      "attention_options_forward(Tensor q, Tensor k, Tensor v, Tensor? slopes, Tensor? table, "
      "Tensor? dense, float? scale, bool causal, int? q_offset, int window_left, int "
      "window_right, float softcap, Tensor? key_mask) -> (Tensor out, Tensor lse)");
  m.def(
      "attention_options_backward(Tensor q, Tensor k, Tensor v, Tensor? slopes, Tensor? table, "
      "Tensor? dense, float? scale, bool causal, int? q_offset, int window_left, int "
      "window_right, float softcap, Tensor? key_mask, Tensor out, Tensor lse, Tensor grad_out) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "attention_varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor "
      "cu_seqlens_k, Tensor? slopes, Tensor? table, float? scale, bool causal, int window_left, "
      "int window_right, float softcap) -> (Tensor out, Tensor lse)");
  m.def(
      "attention_varlen_backward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor "
      "cu_seqlens_k, Tensor? slopes, Tensor? table, float? scale, bool causal, int window_left, "
      "int window_right, float softcap, Tensor out, Tensor lse, Tensor grad_out) -> (Tensor, "
      "Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
      "Tensor? block_table, Tensor? slopes, Tensor? table, float? scale, bool causal, int "
      "window_left, int window_right, float softcap) -> Tensor");
  m.def(
      "attention_kvcache_lse(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
      "Tensor? block_table, Tensor? slopes, Tensor? table, float? scale, bool causal, int "
      "window_left, int window_right, float softcap) -> (Tensor out, Tensor lse)");
  m.def(
      "kvcache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? "
      "block_table, Tensor k, Tensor v) -> ()");
}

TORCH_LIBRARY_IMPL(posbias, CPU, m) {
  m.impl("attention_options_forward", TORCH_FN(posbias::attention_options_forward));
  m.impl("attention_options_backward", TORCH_FN(posbias::attention_options_backward));
  m.impl("attention_varlen_forward", TORCH_FN(posbias::attention_varlen_forward_op));
  m.impl("attention_varlen_backward", TORCH_FN(posbias::attention_varlen_backward_op));
  m.impl("attention_kvcache", TORCH_FN(posbias::attention_kvcache_op));
  m.impl("attention_kvcache_lse", TORCH_FN(posbias::attention_kvcache_lse_op));
  m.impl("kvcache_append", TORCH_FN(posbias::kvcache_append_op));
}

TORCH_LIBRARY_IMPL(posbias, Meta, m) {
  m.impl("attention_options_forward", TORCH_FN(posbias::meta::attention_options_forward));
  m.impl("attention_options_backward", TORCH_FN(posbias::meta::attention_options_backward));
  m.impl("attention_varlen_forward", TORCH_FN(posbias::meta::attention_varlen_forward));
  m.impl("attention_varlen_backward", TORCH_FN(posbias::meta::attention_varlen_backward));
  m.impl("attention_kvcache", TORCH_FN(posbias::meta::attention_kvcache));
  m.impl("attention_kvcache_lse", TORCH_FN(posbias::meta::attention_kvcache_lse));
  m.impl("kvcache_append", TORCH_FN(posbias::meta::kvcache_append));
}

TORCH_LIBRARY_IMPL(posbias, Autograd, m) {
  m.impl("attention_options_forward", TORCH_FN(posbias::attention_options_autograd));
  m.impl("attention_options_backward", TORCH_FN(posbias::attention_options_backward_autograd));
  m.impl("attention_varlen_forward", TORCH_FN(posbias::attention_varlen_autograd));
  m.impl("attention_varlen_backward", TORCH_FN(posbias::attention_varlen_backward_autograd));
  m.impl("attention_kvcache", TORCH_FN(posbias::attention_kvcache_autograd));
  m.impl("attention_kvcache_lse", TORCH_FN(posbias::attention_kvcache_lse_autograd));
  m.impl("kvcache_append", TORCH_FN(posbias::kvcache_append_autograd));
}
