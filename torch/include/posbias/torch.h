// posbias in LibTorch: the C++ frontend modules (posbias::nn) and the
// functions behind the `torch.ops.posbias` ops (posbias::ops), all on CPU
// tensors, calling the posbias core. See docs/torch.md.
//
// Conventions (SPEC.md): queries are the LAST i of the j key positions
// (q_r = j - i + r); a distance table [h, 2j - 1] is read at
// (q_r - c) + (j - 1). Slopes, tables and dense biases are float32 for the
// computation (other floating dtypes are converted); attention inputs are
// float32, bfloat16 or float16. Arguments are validated once, in the core:
// its std::invalid_argument / std::length_error (any std::logic_error) become
// c10::ValueError with the core's message (ValueError in Python), a dtype the
// core cannot take c10::TypeError; errors have the shapes and values in the
// message.
//
//   #include <posbias/torch.h>
//   posbias::nn::AlibiPositionalBias alibi(posbias::nn::AlibiPositionalBiasOptions(8));
//   torch::Tensor bias = alibi->forward(16, 16);   // [8, 16, 16]
//   torch::Tensor out = posbias::ops::attention(q, k, v, "alibi",
//                                               posbias::ops::alibi_slopes(8));
#ifndef POSBIAS_TORCH_H_
#define POSBIAS_TORCH_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace posbias {

class AlibiPositionalBias;  // the core modules (posbias/alibi.h)
class AlibiBias;

namespace ops {

/// float32 [heads]: the standard ALiBi schedule (max_bias unset) or ggml /
/// MPT's max_bias schedule. heads >= 1.
at::Tensor alibi_slopes(int64_t heads, c10::optional<double> max_bias = c10::nullopt);

/// Slopes of heads [head_begin, head_end) of the total_heads schedule (what a
/// tensor-parallel rank holding those heads needs).
at::Tensor alibi_slopes_range(int64_t total_heads, int64_t head_begin, int64_t head_end,
                              c10::optional<double> max_bias = c10::nullopt);

/// [max(total_heads, h), i, j] with bias[h][r][c] = -slopes[h] * |c - q_r|
/// and zero heads after the h slopes; slopes: 1-d, h >= 1 finite values.
/// total_heads = -1 means h. dtype float32 (default), bfloat16 or float16
/// (computed in float32, rounded once). Not differentiable.
at::Tensor alibi_bias(const at::Tensor& slopes, int64_t i, int64_t j, int64_t total_heads = -1,
                      c10::optional<at::ScalarType> dtype = c10::nullopt);

/// float32 [h, 2j - 1]: entry e (distance q - c = e - (j - 1)) holds
/// -slopes[h] * |e - (j - 1)| (signed_distances, the ALiBi bias), or
/// -slopes[h] * max(e - (j - 1), 0) (only past keys biased): the core's
/// posbias::alibi_distance_table. slopes: 1-d floating CPU tensor (read as
/// float32), h >= 1 finite values; j >= 1 (c10::ValueError with the core's
/// message otherwise). Not differentiable.
at::Tensor alibi_distance_table(const at::Tensor& slopes, int64_t j, bool signed_distances = true);

/// The "ALiBi" seed's bias [1, n_heads, q_len, k_len] (top-left positions,
/// slope_h * max(r - c, 0) when causal, else slope_h * |r - c|):
/// posbias::AlibiBias(n_heads, causal, slopes).build(q_len, k_len, dtype).
/// slopes: 1-d floating CPU tensor of n_heads finite values (read as
/// float32); dtype float32 (default), bfloat16 or float16 (computed in
/// float32, rounded once). Every check is the core's (c10::ValueError with
/// its message). Not differentiable.
at::Tensor alibi_bias_build(const at::Tensor& slopes, int64_t n_heads, bool causal, int64_t q_len,
                            int64_t k_len, c10::optional<at::ScalarType> dtype = c10::nullopt);

/// ALiBi at arbitrary positions (packed sequences, chunked prefill, context
/// parallelism): [total_heads, q_pos.numel(), k_pos.numel()] with
/// -slopes[h] * |k_pos[c] - q_pos[r]|, zero heads appended: the core's
/// posbias::alibi_bias_custom_pos. slopes: 1-d floating CPU tensor (read as
/// float32); q_pos, k_pos: 1-d integer tensors (c10::TypeError otherwise);
/// total_heads = -1 means h; dtype float32 (default), bfloat16 or float16.
/// Every other check is the core's (c10::ValueError with its message). Not
/// differentiable.
at::Tensor alibi_bias_custom_pos(const at::Tensor& slopes, int64_t total_heads,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos,
                                 c10::optional<at::ScalarType> dtype = c10::nullopt);

/// [h, 2j - 1] T5 table from the [num_buckets, h] embedding: entry e holds
/// embedding[bucket(c - q)][h] * scale with c - q = (j - 1) - e: the core's
/// RelativePositionBias::distance_table over a view of the embedding (no
/// copy), computed in float32, returned in the embedding's dtype (float32,
/// bfloat16, float16; float64 is c10::TypeError). Differentiable w.r.t. the
/// embedding: the backward is the core's backward_distance_table (a
/// scatter-add into the buckets), first order only. j >= 1 and the bucket
/// arguments are checked by the core (c10::ValueError with its message).
at::Tensor t5_distance_table(const at::Tensor& embedding, int64_t j, bool causal,
                             int64_t num_buckets, int64_t max_distance, double scale);

/// [heads, 2j - 1] Dynamic Position Bias table from its parameters in
/// state-dict order (docs/torch.md): variant "zeta" (6 tensors, MLP on the
/// distances 0..j-1, entry e = T[|e - (j - 1)|]) or "x-transformers" (MLP on
/// the signed distances -(j-1)..(j-1), sign(x) ln(|x| + 1) with log_distance,
/// LayerNorm with norm). One core call each way: the core's
/// DynamicPositionBias (parameters loaded, i.e. copied once to float32) runs
/// distance_table(j); the backward is its backward_distance_table (every
/// parameter's gradient, first order only). float32, bfloat16 or float16
/// CPU parameters (float64 is c10::TypeError: the core is float32); the
/// table has the first parameter's dtype. Shapes, values (finite) and j are
/// checked by the core (c10::ValueError with its message).
at::Tensor dpb_distance_table(at::TensorList params, int64_t j, c10::string_view variant = "zeta",
                              bool log_distance = false, bool norm = false, double eps = 1e-5);

/// The CPU kernels of the two ops above, without autograd.
at::Tensor t5_distance_table_cpu(const at::Tensor& embedding, int64_t j, bool causal,
                                 int64_t num_buckets, int64_t max_distance, double scale);
at::Tensor dpb_distance_table_cpu(at::TensorList params, int64_t j, c10::string_view variant,
                                  bool log_distance, bool norm, double eps);

/// The dense bias [h, i, j] of a distance table [h, n], n odd, read at its
/// centre: bias[h][r][c] = table[h][(n - 1) / 2 + (q_r - c)], q_r = j - i + r,
/// so n >= 2 max(i, j) - 1 (posbias/distance_table.h; one core call). table:
/// float32, bfloat16 or float16 (TypeError otherwise), any strides, CPU.
/// dtype: the output dtype (default: the table's). Differentiable w.r.t. the
/// table: the backward is reduce_distance_table. Bad values (even n, a table
/// too short, negative lengths) are the core's std::invalid_argument, raised
/// as c10::ValueError with its message.
at::Tensor expand_distance_table(const at::Tensor& table, int64_t i, int64_t j,
                                 c10::optional<at::ScalarType> dtype = c10::nullopt);

/// The adjoint of expand_distance_table: float32 [h, n] whose entry
/// (n - 1) / 2 + s is the sum of grad[h][r][c] over q_r - c = s (zeros where
/// nothing is read). grad [h, i, j]: float32, bfloat16 or float16, any
/// strides. Differentiable (its backward is the expansion).
at::Tensor reduce_distance_table(const at::Tensor& grad, int64_t n);

/// The CPU kernels of the two ops above, without autograd (what the op
/// library registers for the CPU dispatch key).
at::Tensor expand_distance_table_cpu(const at::Tensor& table, int64_t i, int64_t j,
                                     c10::optional<at::ScalarType> dtype);
at::Tensor reduce_distance_table_cpu(const at::Tensor& grad, int64_t n);

/// Fused attention with a positional bias, differentiable (autograd) w.r.t.
/// q, k, v, table and dense:
///   out = softmax(scale q k^T + bias, mask) v,   out [b, h, i, d] in q's dtype.
/// q [b, h, i, d], k, v [b, hk, j, d] (h % hk == 0), one dtype of float32,
/// bfloat16, float16, any strides (read in place). bias: "none", "alibi"
/// (slopes [h]), "table" (table [h, >= 2j - 1]) or "dense" (dense
/// broadcastable to [b, h, i, j]); a tensor the kind does not use is an
/// error. scale default 1/sqrt(d). causal: key c visible iff c <= q_r; a row
/// without keys outputs zeros. The backward recomputes the scores block by
/// block (posbias::attention_backward); slopes that require grad get
/// dL/dslope [h] (learned ALiBi slopes).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     c10::string_view bias = "none",
                     const c10::optional<at::Tensor>& slopes = c10::nullopt,
                     const c10::optional<at::Tensor>& table = c10::nullopt,
                     const c10::optional<at::Tensor>& dense = c10::nullopt,
                     c10::optional<double> scale = c10::nullopt, bool causal = false);

/// As attention(), also returning lse float32 [b, h, i] (log of the softmax
/// denominator with the max and scale; -inf for a row without keys), for
/// merging key-split softmax states. Differentiable through out only.
std::tuple<at::Tensor, at::Tensor> attention_lse(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, c10::string_view bias = "none",
    const c10::optional<at::Tensor>& slopes = c10::nullopt,
    const c10::optional<at::Tensor>& table = c10::nullopt,
    const c10::optional<at::Tensor>& dense = c10::nullopt,
    c10::optional<double> scale = c10::nullopt, bool causal = false);

/// The CPU kernel of attention_lse without autograd (what the op library
/// registers for the CPU dispatch key).
std::tuple<at::Tensor, at::Tensor> attention_lse_cpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, c10::string_view bias,
                                                     const c10::optional<at::Tensor>& slopes,
                                                     const c10::optional<at::Tensor>& table,
                                                     const c10::optional<at::Tensor>& dense,
                                                     c10::optional<double> scale, bool causal);

/// The backward of attention_lse as a plain function (no autograd): the
/// gradients (grad_q, grad_k, grad_v, grad_slopes, grad_table, grad_dense)
/// of a loss given grad_out = dL/dout, from the inputs exactly as given to
/// the forward and a forward's out and lse (posbias::attention_backward).
/// Passing the out and lse of attention over MORE keys than k, v hold (the
/// merged softmax state of all key blocks) gives this key block's share of
/// that attention's gradients: what ring attention's backward adds up.
/// grad_slopes [h] float32, grad_table in the table's shape and dtype,
/// grad_dense in the dense bias's; a kind's absent gradients are empty
/// tensors (numel 0).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                   const c10::optional<at::Tensor>& table, const c10::optional<at::Tensor>& dense,
                   c10::optional<double> scale, bool causal, const at::Tensor& out,
                   const at::Tensor& lse, const at::Tensor& grad_out);

/// attention_lse_cpu's output only.
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                         const c10::optional<at::Tensor>& table,
                         const c10::optional<at::Tensor>& dense, c10::optional<double> scale,
                         bool causal);

}  // namespace ops

namespace nn {

/// Options of AlibiPositionalBias: heads biased heads, total_heads >= heads
/// (-1: heads) with zero heads appended, optional custom slopes (length
/// heads).
struct AlibiPositionalBiasOptions {
  explicit AlibiPositionalBiasOptions(int64_t heads) : heads_(heads) {}
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(int64_t, total_heads) = -1;
  TORCH_ARG(std::vector<float>, slopes) = {};
};

/// zeta's / x-transformers' AlibiPositionalBias: forward(i, j) returns
/// [total_heads, i, j], bias[h][r][c] = -m_h * |c - q_r| (bottom-right),
/// zero heads past `heads`. Buffer "slopes" (float32 [heads]) stays float32
/// after ->to(kBFloat16): the dtype only sets the output dtype; ->to(device)
/// moves the output. Results come from the core module's cache (its largest
/// bias; a smaller request is a bottom-right view, no copy): treat them as
/// read-only. Thread-safe: concurrent forward() calls on one module are
/// fine and results stay valid when the cache is replaced. Changing the
/// "slopes" buffer (e.g. load_state_dict) takes effect on the next call.
class AlibiPositionalBiasImpl : public torch::nn::Cloneable<AlibiPositionalBiasImpl> {
 public:
  explicit AlibiPositionalBiasImpl(int64_t heads, int64_t total_heads = -1)
      : AlibiPositionalBiasImpl(AlibiPositionalBiasOptions(heads).total_heads(total_heads)) {}
  explicit AlibiPositionalBiasImpl(AlibiPositionalBiasOptions options);
  /// (Re)creates the slopes buffer and the core module from the options.
  void reset() override;
  /// "posbias::nn::AlibiPositionalBias(heads=8, total_heads=8)".
  void pretty_print(std::ostream& stream) const override;
  /// [total_heads, i, j] in the module's dtype, on its device. i, j >= 0.
  at::Tensor forward(int64_t i, int64_t j);
  /// The slope-free distances -|c - q_r|, [1, i, j].
  at::Tensor get_bias(int64_t i, int64_t j);
  /// Output dtype and device follow ->to(...); slopes stay float32.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  /// The options the module was built with.
  AlibiPositionalBiasOptions options;
  at::Tensor slopes;  ///< float32 [heads], registered buffer "slopes"

 private:
  std::shared_ptr<posbias::AlibiPositionalBias> core();
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<posbias::AlibiPositionalBias> core_;
  std::vector<float> core_slopes_;
  torch::Dtype dtype_ = torch::kFloat32;
  torch::Device device_ = torch::kCPU;
};
TORCH_MODULE(AlibiPositionalBias);

/// Options of AlibiBias (the "ALiBi" seed's builder): n_heads, causal,
/// custom slopes (length n_heads; default linspace(-0.05, -0.5, n_heads)).
struct AlibiBiasOptions {
  explicit AlibiBiasOptions(int64_t n_heads) : n_heads_(n_heads) {}
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(std::vector<float>, slopes) = {};
};

/// The seed's AlibiBias: forward(q_len, k_len) (alias build) returns
/// [1, n_heads, q_len, k_len], slope_h * dist with TOP-LEFT positions:
/// causal dist = max(r - c, 0), else |r - c|. Buffer "slopes" float32.
class AlibiBiasImpl : public torch::nn::Cloneable<AlibiBiasImpl> {
 public:
  explicit AlibiBiasImpl(int64_t n_heads, bool causal = true)
      : AlibiBiasImpl(AlibiBiasOptions(n_heads).causal(causal)) {}
  explicit AlibiBiasImpl(AlibiBiasOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// [1, n_heads, q_len, k_len] in the module's dtype, on its device.
  at::Tensor forward(int64_t q_len, int64_t k_len);
  at::Tensor build(int64_t q_len, int64_t k_len) { return forward(q_len, k_len); }
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  /// The options the module was built with.
  AlibiBiasOptions options;
  at::Tensor slopes;  ///< float32 [n_heads], registered buffer "slopes"

 private:
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<posbias::AlibiBias> core_;
  std::vector<float> core_slopes_;
  torch::Dtype dtype_ = torch::kFloat32;
  torch::Device device_ = torch::kCPU;
};
TORCH_MODULE(AlibiBias);

/// Options of DynamicPositionBias (zeta): hidden width dim, heads.
struct DynamicPositionBiasOptions {
  DynamicPositionBiasOptions(int64_t dim, int64_t heads) : dim_(dim), heads_(heads) {}
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(int64_t, heads);
};

/// zeta's DynamicPositionBias: mlp = Sequential(Linear(1, dim), SiLU,
/// Linear(dim, dim), SiLU, Linear(dim, heads)), so the state-dict names are
/// zeta's (mlp.0.weight [dim, 1], mlp.0.bias, mlp.2.weight, mlp.2.bias,
/// mlp.4.weight [heads, dim], mlp.4.bias). nn.Linear's default init.
/// forward(i, j), 0 <= i <= j: the MLP on the distances 0..j-1 gives
/// T[j, heads]; bias[h][r][c] = T[|q_r - c|][h], [heads, i, j]; i and j are
/// lengths (forward(0, 5) is an empty [heads, 0, 5]). The table is the
/// core's (dpb_distance_table, backward the core's backward_distance_table),
/// the bias the core's expansion (expand_distance_table; its backward the
/// core's reduction): trainable through autograd, in the module's dtype
/// (float32, bfloat16, float16; a float64 module is refused with
/// c10::TypeError), on the CPU.
class DynamicPositionBiasImpl : public torch::nn::Cloneable<DynamicPositionBiasImpl> {
 public:
  DynamicPositionBiasImpl(int64_t dim, int64_t heads)
      : DynamicPositionBiasImpl(DynamicPositionBiasOptions(dim, heads)) {}
  explicit DynamicPositionBiasImpl(DynamicPositionBiasOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// [heads, i, j]; requires 0 <= i <= j.
  at::Tensor forward(int64_t i, int64_t j);
  /// [heads, 2j - 1] for attention(..., "table", table): dpb_distance_table.
  at::Tensor distance_table(int64_t j);

  /// The options the module was built with.
  DynamicPositionBiasOptions options;
  /// The MLP (state-dict names mlp.0, mlp.2, mlp.4 as in zeta).
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(DynamicPositionBias);

/// Options of RelativePositionBias (x-transformers' T5 bias).
struct RelativePositionBiasOptions {
  explicit RelativePositionBiasOptions(double scale) : scale_(scale) {}
  TORCH_ARG(double, scale);
  TORCH_ARG(bool, causal) = false;
  TORCH_ARG(int64_t, num_buckets) = 32;
  TORCH_ARG(int64_t, max_distance) = 128;
  TORCH_ARG(int64_t, heads) = 8;
};

/// T5 relative position bias: embedding "relative_attention_bias"
/// [num_buckets, heads] (N(0, 1) init, as nn.Embedding);
/// bias[h][r][c] = E[bucket(c - q_r)][h] * scale, [heads, i, j] (i > j
/// too): the core's expansion of distance_table(max(i, j)). Trainable
/// through autograd.
class RelativePositionBiasImpl : public torch::nn::Cloneable<RelativePositionBiasImpl> {
 public:
  explicit RelativePositionBiasImpl(RelativePositionBiasOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// [heads, i, j]; i, j >= 0.
  at::Tensor forward(int64_t i, int64_t j);
  /// [heads, 2j - 1] for attention(..., "table", table): t5_distance_table.
  at::Tensor distance_table(int64_t j);

  /// The options the module was built with.
  RelativePositionBiasOptions options;
  /// The embedding [num_buckets, heads] (state-dict name relative_attention_bias.weight).
  torch::nn::Embedding relative_attention_bias{nullptr};
};
TORCH_MODULE(RelativePositionBias);

}  // namespace nn
}  // namespace posbias

#endif  // POSBIAS_TORCH_H_
