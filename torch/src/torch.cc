// The LibTorch front end: posbias::ops functions (the op kernels) and the
// posbias::nn modules, on top of the core. Tensors cross the boundary
// without copies: posbias::Tensor::from_blob views torch memory (keeping the
// torch tensor alive), and core results become torch tensors through
// torch::from_blob with a deleter that owns the core tensor.
#include "posbias/torch.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core_bridge.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/distance_table.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"

namespace posbias {
namespace {

using torch_bridge::as_float32;
using torch_bridge::check_cpu;
using torch_bridge::core_call;
using torch_bridge::dtype_from_scalar;
using torch_bridge::dtype_of;
using torch_bridge::slope_vector;
using torch_bridge::to_torch;
using torch_bridge::vector_tensor;
using torch_bridge::view_of;

// ---------------------------------------------------------------------------
// Attention.

struct AttentionArgs {
  Tensor q, k, v;
  AttentionBias bias;
  AttentionOptions options;
};

AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                             const c10::optional<at::Tensor>& table,
                             const c10::optional<at::Tensor>& dense, c10::optional<double> scale,
                             bool causal, at::Tensor* table32, at::Tensor* dense32) {
  const char* who = "attention";
  check_cpu(q, who, "q");
  check_cpu(k, who, "k");
  check_cpu(v, who, "v");
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "posbias.attention: q must be ",
                    "[b, h, i, d] and k, v [b, hk, j, d] (4-d), got q ", q.sizes(), ", k ",
                    k.sizes(), ", v ", v.sizes());
  // float64 q, k, v take the core's double reference path (bias in double).
  const DType dt = torch_bridge::float_dtype_of(q, who, "q");
  const bool f64 = dt == DType::kFloat64;
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "posbias.attention: q, k and v must have one dtype, got ", q.scalar_type(), ", ",
                   k.scalar_type(), ", ", v.scalar_type());
  AttentionArgs a;
  a.q = view_of(q, dt);
  a.k = view_of(k, dt);
  a.v = view_of(v, dt);
  if (scale) {
    TORCH_CHECK_VALUE(std::isfinite(*scale), "posbias.attention: scale must be finite, got ",
                      *scale);
    a.options.scale = *scale;
  }
  a.options.causal = causal;
  const bool has_s = slopes.has_value() && slopes->defined();
  const bool has_t = table.has_value() && table->defined();
  const bool has_d = dense.has_value() && dense->defined();
  const std::string kind(bias);
  if (kind == "none") {
    TORCH_CHECK_VALUE(!has_s && !has_t && !has_d,
                      "posbias.attention: bias=\"none\" takes no slopes, table or dense tensor");
  } else if (kind == "alibi") {
    TORCH_CHECK_VALUE(has_s, "posbias.attention: bias=\"alibi\" needs slopes [h]");
    TORCH_CHECK_VALUE(!has_t && !has_d, "posbias.attention: bias=\"alibi\" takes only slopes");
    // [h], or [b, h] per sequence (FlashAttention-2's alibi_slopes): b * h
    // values row-major; the core checks the count.
    a.bias = torch_bridge::attention_slopes_bias(*slopes, f64, who);
  } else if (kind == "table") {
    TORCH_CHECK_VALUE(has_t, "posbias.attention: bias=\"table\" needs table [h, 2j - 1]");
    TORCH_CHECK_VALUE(!has_s && !has_d, "posbias.attention: bias=\"table\" takes only table");
    a.bias = AttentionBias::distance_table(
        torch_bridge::attention_bias_tensor(*table, f64, who, "table", table32));
  } else if (kind == "dense") {
    TORCH_CHECK_VALUE(has_d, "posbias.attention: bias=\"dense\" needs dense [.., i, j]");
    TORCH_CHECK_VALUE(!has_s && !has_t, "posbias.attention: bias=\"dense\" takes only dense");
    a.bias = AttentionBias::dense_bias(
        torch_bridge::attention_bias_tensor(*dense, f64, who, "dense", dense32));
  } else {
    TORCH_CHECK_VALUE(false, "posbias.attention: bias must be \"none\", \"alibi\", \"table\" or ",
                      "\"dense\", got \"", kind, "\"");
  }
  return a;
}

at::Tensor opt_or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// The core's attention_backward on torch tensors: grad_q, grad_k, grad_v and
// (undefined when the kind has none) grad_slopes [h] float32, grad_table and
// grad_dense in their tensors' dtypes and shapes.
std::array<at::Tensor, 6> attention_grads(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const std::string& bias,
                                          const at::Tensor& slopes, const at::Tensor& table,
                                          const at::Tensor& dense, c10::optional<double> scale,
                                          bool causal, const at::Tensor& out, const at::Tensor& lse,
                                          at::Tensor go) {
  if (!go.defined()) go = at::zeros_like(out);
  if (go.scalar_type() != out.scalar_type()) go = go.to(out.scalar_type());
  at::Tensor table32, dense32;
  const AttentionArgs a =
      attention_args(q, k, v, bias, slopes, table, dense, scale, causal, &table32, &dense32);
  const DType dt = a.q.dtype();
  const bool f64 = dt == DType::kFloat64;
  const at::ScalarType lse_type = f64 ? at::kDouble : at::kFloat;
  TORCH_CHECK_TYPE(out.scalar_type() == q.scalar_type() && lse.scalar_type() == lse_type,
                   "posbias.attention_backward: out must have q's dtype and lse be ",
                   f64 ? "float64 (a float64 call)" : "float32", ", got ", out.scalar_type(),
                   " and ", lse.scalar_type());
  check_cpu(out, "attention_backward", "out");
  check_cpu(lse, "attention_backward", "lse");
  const Tensor go_view = view_of(go, dt);
  const Tensor out_view = view_of(out, dt);
  const Tensor lse_view = view_of(lse, f64 ? DType::kFloat64 : DType::kFloat32);
  const AttentionGradients g = core_call([&] {
    return attention_backward(a.q, a.k, a.v, a.bias, a.options, out_view, lse_view, go_view);
  });
  std::array<at::Tensor, 6> r = {to_torch(g.grad_q), to_torch(g.grad_k), to_torch(g.grad_v),
                                 at::Tensor(),       at::Tensor(),       at::Tensor()};
  if (slopes.defined() && !g.grad_slopes.empty()) {
    r[3] = torch_bridge::attention_slope_grad(g, f64).to(slopes.scalar_type()).view(slopes.sizes());
  }
  if (table.defined()) r[4] = to_torch(g.grad_table).to(table.scalar_type());
  if (dense.defined()) r[5] = to_torch(g.grad_dense).to(dense.scalar_type());
  return r;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::string& bias,
                               const c10::optional<at::Tensor>& slopes_opt,
                               const c10::optional<at::Tensor>& table_opt,
                               const c10::optional<at::Tensor>& dense_opt,
                               c10::optional<double> scale, bool causal) {
    // Optional tensors stay optionals here: Function::apply records every
    // plain Tensor argument as an input and cannot take an undefined one.
    const at::Tensor slopes = opt_or_undefined(slopes_opt);
    const at::Tensor table = opt_or_undefined(table_opt);
    const at::Tensor dense = opt_or_undefined(dense_opt);
    at::Tensor table32, dense32;
    const AttentionArgs a =
        attention_args(q, k, v, bias, slopes, table, dense, scale, causal, &table32, &dense32);
    const AttentionForwardResult r =
        core_call([&] { return attention_forward_lse(a.q, a.k, a.v, a.bias, a.options); });
    at::Tensor out = to_torch(r.out);
    at::Tensor lse = to_torch(r.lse);
    ctx->save_for_backward({q, k, v, out, lse, slopes, table, dense});
    ctx->saved_data["bias"] = bias;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4],
                     &slopes = saved[5], &table = saved[6], &dense = saved[7];
    const std::string bias = ctx->saved_data["bias"].toStringRef();
    const c10::IValue sv = ctx->saved_data["scale"];
    const c10::optional<double> scale =
        sv.isNone() ? c10::nullopt : c10::optional<double>(sv.toDouble());
    const bool causal = ctx->saved_data["causal"].toBool();
    // Learned ALiBi slopes get the core's dL/dslope [h] (in the slopes' dtype).
    const std::array<at::Tensor, 6> g =
        attention_grads(q, k, v, bias, slopes, table, dense, scale, causal, out, lse, grads[0]);
    return {g[0], g[1], g[2], at::Tensor(), g[3], g[4], g[5], at::Tensor(), at::Tensor()};
  }
};

// The core dtype of an ALiBi op's requested output: float32 by default,
// float64 too (the core's reference path, in double).
DType alibi_dtype(const c10::optional<at::ScalarType>& dtype, const char* who) {
  if (!dtype) return DType::kFloat32;
  return *dtype == at::kDouble ? DType::kFloat64 : dtype_from_scalar(*dtype, who);
}

}  // namespace

namespace ops {

at::Tensor alibi_slopes(int64_t heads, c10::optional<double> max_bias) {
  return core_call([&] {
    return vector_tensor(max_bias ? alibi_slopes_max_bias(heads, static_cast<float>(*max_bias))
                                  : posbias::alibi_slopes(heads));
  });
}

at::Tensor alibi_slopes_range(int64_t total_heads, int64_t head_begin, int64_t head_end,
                              c10::optional<double> max_bias) {
  return core_call([&] {
    return vector_tensor(max_bias ? alibi_slopes_range_max_bias(total_heads, head_begin, head_end,
                                                                static_cast<float>(*max_bias))
                                  : posbias::alibi_slopes_range(total_heads, head_begin, head_end));
  });
}

at::Tensor alibi_bias(const at::Tensor& slopes, int64_t i, int64_t j, int64_t total_heads,
                      c10::optional<at::ScalarType> dtype) {
  const std::vector<float> s = slope_vector(slopes, "alibi_bias");
  const int64_t h = static_cast<int64_t>(s.size());
  const int64_t total = total_heads == -1 ? h : total_heads;
  const DType dt = alibi_dtype(dtype, "alibi_bias");
  return core_call([&] { return to_torch(posbias::alibi_bias(s, total, i, j, dt)); });
}

at::Tensor alibi_distance_table(const at::Tensor& slopes, int64_t j, bool signed_distances) {
  const std::vector<float> s = slope_vector(slopes, "alibi_distance_table");
  return core_call([&] { return to_torch(posbias::alibi_distance_table(s, j, signed_distances)); });
}

at::Tensor alibi_bias_build(const at::Tensor& slopes, int64_t n_heads, bool causal, int64_t q_len,
                            int64_t k_len, c10::optional<at::ScalarType> dtype) {
  const std::vector<float> s = slope_vector(slopes, "alibi_bias_build");
  const DType dt = alibi_dtype(dtype, "alibi_bias_build");
  return core_call(
      [&] { return to_torch(posbias::AlibiBias(n_heads, causal, s).build(q_len, k_len, dt)); });
}

namespace {

// A 1-d integer tensor's values (any device, any strides) as int64.
std::vector<std::int64_t> position_vector(const at::Tensor& pos, const char* name) {
  TORCH_CHECK_TYPE(!at::isFloatingType(pos.scalar_type()) && pos.scalar_type() != at::kBool &&
                       !at::isComplexType(pos.scalar_type()),
                   "alibi_bias_custom_pos: ", name, " must be an integer tensor, got ",
                   pos.scalar_type());
  TORCH_CHECK_VALUE(pos.dim() == 1, "alibi_bias_custom_pos: ", name, " must be 1-d, got ",
                    pos.dim(), "-d");
  const at::Tensor p64 = pos.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t* data = p64.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(data, data + p64.numel());
}

}  // namespace

at::Tensor alibi_bias_custom_pos(const at::Tensor& slopes, int64_t total_heads,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos,
                                 c10::optional<at::ScalarType> dtype) {
  const std::vector<float> s = slope_vector(slopes, "alibi_bias_custom_pos");
  const std::vector<std::int64_t> qp = position_vector(q_pos, "q_pos");
  const std::vector<std::int64_t> kp = position_vector(k_pos, "k_pos");
  const int64_t th = total_heads < 0 ? static_cast<int64_t>(s.size()) : total_heads;
  const DType dt = alibi_dtype(dtype, "alibi_bias_custom_pos");
  return core_call([&] { return to_torch(posbias::alibi_bias_custom_pos(s, th, qp, kp, dt)); });
}

std::tuple<at::Tensor, at::Tensor> attention_lse_cpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, c10::string_view bias,
                                                     const c10::optional<at::Tensor>& slopes,
                                                     const c10::optional<at::Tensor>& table,
                                                     const c10::optional<at::Tensor>& dense,
                                                     c10::optional<double> scale, bool causal) {
  at::Tensor table32, dense32;
  const AttentionArgs a =
      attention_args(q, k, v, bias, slopes, table, dense, scale, causal, &table32, &dense32);
  const AttentionForwardResult r =
      core_call([&] { return attention_forward_lse(a.q, a.k, a.v, a.bias, a.options); });
  return {to_torch(r.out), to_torch(r.lse)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                   const c10::optional<at::Tensor>& table, const c10::optional<at::Tensor>& dense,
                   c10::optional<double> scale, bool causal, const at::Tensor& out,
                   const at::Tensor& lse, const at::Tensor& grad_out) {
  std::array<at::Tensor, 6> g =
      attention_grads(q, k, v, std::string(bias), opt_or_undefined(slopes), opt_or_undefined(table),
                      opt_or_undefined(dense), scale, causal, out, lse, grad_out);
  for (at::Tensor& t : g) {
    if (!t.defined()) t = at::empty({0}, at::kFloat);  // the kind has no such gradient
  }
  return {g[0], g[1], g[2], g[3], g[4], g[5]};
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                         const c10::optional<at::Tensor>& table,
                         const c10::optional<at::Tensor>& dense, c10::optional<double> scale,
                         bool causal) {
  at::Tensor table32, dense32;
  const AttentionArgs a =
      attention_args(q, k, v, bias, slopes, table, dense, scale, causal, &table32, &dense32);
  return core_call([&] { return to_torch(attention_forward(a.q, a.k, a.v, a.bias, a.options)); });
}

std::tuple<at::Tensor, at::Tensor> attention_lse(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, c10::string_view bias,
                                                 const c10::optional<at::Tensor>& slopes,
                                                 const c10::optional<at::Tensor>& table,
                                                 const c10::optional<at::Tensor>& dense,
                                                 c10::optional<double> scale, bool causal) {
  const variable_list r =
      AttentionFunction::apply(q, k, v, std::string(bias), slopes, table, dense, scale, causal);
  return {r[0], r[1]};
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                     const c10::optional<at::Tensor>& table, const c10::optional<at::Tensor>& dense,
                     c10::optional<double> scale, bool causal) {
  return std::get<0>(attention_lse(q, k, v, bias, slopes, table, dense, scale, causal));
}

}  // namespace ops

namespace nn {

namespace {

// Output dtype of a ->to(dtype) on a bias module: float32, bfloat16, float16.
torch::Dtype bias_dtype(torch::Dtype d, const char* who) {
  dtype_from_scalar(d, who);  // checks
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------
// AlibiPositionalBias

AlibiPositionalBiasImpl::AlibiPositionalBiasImpl(AlibiPositionalBiasOptions options_)
    : options(std::move(options_)) {
  reset();
}

void AlibiPositionalBiasImpl::reset() {
  const int64_t heads = options.heads();
  const int64_t total = options.total_heads() == -1 ? heads : options.total_heads();
  // heads, total_heads and the slopes (count, finite) are the core's checks.
  std::vector<float> s = options.slopes();
  core_ = core_call([&] {
    if (s.empty()) s = posbias::alibi_slopes(heads);
    return std::make_shared<posbias::AlibiPositionalBias>(heads, total, s,
                                                          dtype_from_scalar(dtype_, "to"));
  });
  core_slopes_ = s;
  slopes = register_buffer("slopes", vector_tensor(s).to(device_));
}

void AlibiPositionalBiasImpl::pretty_print(std::ostream& stream) const {
  stream << "posbias::nn::AlibiPositionalBias(heads=" << options.heads() << ", total_heads="
         << (options.total_heads() == -1 ? options.heads() : options.total_heads()) << ")";
}

std::shared_ptr<posbias::AlibiPositionalBias> AlibiPositionalBiasImpl::core() {
  std::lock_guard<std::mutex> lock(*mutex_);
  // The "slopes" buffer may have been changed (load_state_dict): rebuild.
  const at::Tensor s = slopes.to(at::kCPU, at::kFloat).contiguous();
  const std::vector<float> now(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  if (now != core_slopes_) {
    const int64_t total = options.total_heads() == -1 ? options.heads() : options.total_heads();
    core_ = core_call([&] {
      return std::make_shared<posbias::AlibiPositionalBias>(options.heads(), total, now,
                                                            dtype_from_scalar(dtype_, "to"));
    });
    core_slopes_ = now;
  }
  return core_;
}

at::Tensor AlibiPositionalBiasImpl::forward(int64_t i, int64_t j) {
  const auto c = core();
  at::Tensor out = core_call([&] { return to_torch(c->forward(i, j)); });
  return device_.is_cpu() ? out : out.to(device_);
}

at::Tensor AlibiPositionalBiasImpl::get_bias(int64_t i, int64_t j) {
  const auto c = core();
  at::Tensor out = core_call([&] { return to_torch(c->get_bias(i, j)); });
  return device_.is_cpu() ? out : out.to(device_);
}

void AlibiPositionalBiasImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  to(dtype, non_blocking);
  to(device, non_blocking);
}

void AlibiPositionalBiasImpl::to(torch::Dtype dtype, bool /*non_blocking*/) {
  std::lock_guard<std::mutex> lock(*mutex_);
  dtype_ = bias_dtype(dtype, "AlibiPositionalBias.to");
  core_->set_dtype(dtype_from_scalar(dtype_, "to"));
}

void AlibiPositionalBiasImpl::to(torch::Device device, bool non_blocking) {
  std::lock_guard<std::mutex> lock(*mutex_);
  device_ = device;
  torch::nn::Module::to(device, non_blocking);  // the buffer moves, stays float32
  slopes = named_buffers(false)["slopes"];
}

// ---------------------------------------------------------------------------
// AlibiBias

AlibiBiasImpl::AlibiBiasImpl(AlibiBiasOptions options_) : options(std::move(options_)) { reset(); }

void AlibiBiasImpl::reset() {
  const int64_t n = options.n_heads();
  core_ = core_call([&] {
    return options.slopes().empty()
               ? std::make_shared<posbias::AlibiBias>(n, options.causal())
               : std::make_shared<posbias::AlibiBias>(n, options.causal(), options.slopes());
  });
  core_slopes_ = core_->slopes();
  slopes = register_buffer("slopes", vector_tensor(core_slopes_).to(device_));
}

void AlibiBiasImpl::pretty_print(std::ostream& stream) const {
  stream << "posbias::nn::AlibiBias(n_heads=" << options.n_heads()
         << ", causal=" << (options.causal() ? "true" : "false") << ")";
}

at::Tensor AlibiBiasImpl::forward(int64_t q_len, int64_t k_len) {
  std::shared_ptr<posbias::AlibiBias> c;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    const at::Tensor s = slopes.to(at::kCPU, at::kFloat).contiguous();
    const std::vector<float> now(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
    if (now != core_slopes_) {
      core_ = core_call([&] {
        return std::make_shared<posbias::AlibiBias>(options.n_heads(), options.causal(), now);
      });
      core_slopes_ = now;
    }
    c = core_;
  }
  const DType dt = dtype_from_scalar(dtype_, "AlibiBias");
  at::Tensor out = core_call([&] { return to_torch(c->build(q_len, k_len, dt)); });
  return device_.is_cpu() ? out : out.to(device_);
}

void AlibiBiasImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  to(dtype, non_blocking);
  to(device, non_blocking);
}

void AlibiBiasImpl::to(torch::Dtype dtype, bool /*non_blocking*/) {
  std::lock_guard<std::mutex> lock(*mutex_);
  dtype_ = bias_dtype(dtype, "AlibiBias.to");
}

void AlibiBiasImpl::to(torch::Device device, bool non_blocking) {
  std::lock_guard<std::mutex> lock(*mutex_);
  device_ = device;
  torch::nn::Module::to(device, non_blocking);
  slopes = named_buffers(false)["slopes"];
}

// ---------------------------------------------------------------------------
// DynamicPositionBias

DynamicPositionBiasImpl::DynamicPositionBiasImpl(DynamicPositionBiasOptions options_)
    : options(std::move(options_)) {
  reset();
}

void DynamicPositionBiasImpl::reset() {
  const int64_t dim = options.dim(), heads = options.heads();
  TORCH_CHECK_VALUE(dim >= 1 && heads >= 1,
                    "posbias.DynamicPositionBias: dim and heads must be >= 1, ", "got dim = ", dim,
                    ", heads = ", heads);
  mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(1, dim), torch::nn::SiLU(),
                                                     torch::nn::Linear(dim, dim), torch::nn::SiLU(),
                                                     torch::nn::Linear(dim, heads)));
}

void DynamicPositionBiasImpl::pretty_print(std::ostream& stream) const {
  stream << "posbias::nn::DynamicPositionBias(dim=" << options.dim()
         << ", heads=" << options.heads() << ")";
}

at::Tensor DynamicPositionBiasImpl::forward(int64_t i, int64_t j) {
  TORCH_CHECK_VALUE(i >= 0 && i <= j, "posbias.DynamicPositionBias.forward: needs 0 <= i <= j ",
                    "(lengths, not positions), got i = ", i, ", j = ", j);
  if (j == 0) return at::empty({options.heads(), 0, 0}, mlp->parameters()[0].options());
  // The MLP on the distances (torch ops: autograd reaches the parameters),
  // then the core's expansion, whose backward is the core's reduction.
  return ops::expand_distance_table(distance_table(j), i, j);
}

at::Tensor DynamicPositionBiasImpl::distance_table(int64_t j) {
  return ops::dpb_distance_table(mlp->parameters(), j, "zeta");
}

// ---------------------------------------------------------------------------
// RelativePositionBias

RelativePositionBiasImpl::RelativePositionBiasImpl(RelativePositionBiasOptions options_)
    : options(std::move(options_)) {
  reset();
}

void RelativePositionBiasImpl::reset() {
  core_call([&] {
    // Validates the bucket arguments (and the heads, scale) like the core.
    return posbias::t5_relative_position_bucket(0, options.causal(), options.num_buckets(),
                                                options.max_distance());
  });
  TORCH_CHECK_VALUE(options.heads() >= 1, "posbias.RelativePositionBias: heads must be >= 1, got ",
                    options.heads());
  TORCH_CHECK_VALUE(std::isfinite(options.scale()),
                    "posbias.RelativePositionBias: scale must be finite, got ", options.scale());
  relative_attention_bias = register_module(
      "relative_attention_bias", torch::nn::Embedding(options.num_buckets(), options.heads()));
}

void RelativePositionBiasImpl::pretty_print(std::ostream& stream) const {
  stream << "posbias::nn::RelativePositionBias(scale=" << options.scale()
         << ", causal=" << (options.causal() ? "true" : "false")
         << ", num_buckets=" << options.num_buckets() << ", max_distance=" << options.max_distance()
         << ", heads=" << options.heads() << ")";
}

at::Tensor RelativePositionBiasImpl::forward(int64_t i, int64_t j) {
  TORCH_CHECK_VALUE(i >= 0 && j >= 0,
                    "posbias.RelativePositionBias.forward: i, j must be >= 0, got i = ", i,
                    ", j = ", j);
  const at::Tensor& w = relative_attention_bias->weight;
  if (i == 0 || j == 0) return at::empty({options.heads(), i, j}, w.options());
  // The table of the distances 1 - i .. j - 1 (read at its centre, so i > j
  // works too), then the core's expansion.
  return ops::expand_distance_table(distance_table(std::max(i, j)), i, j);
}

at::Tensor RelativePositionBiasImpl::distance_table(int64_t j) {
  return ops::t5_distance_table(relative_attention_bias->weight, j, options.causal(),
                                options.num_buckets(), options.max_distance(), options.scale());
}

}  // namespace nn
}  // namespace posbias
