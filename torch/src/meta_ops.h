// Internal to the LibTorch front end: the Meta (shape-only) kernels of the
// op library, registered with TORCH_LIBRARY_IMPL(posbias, Meta, m) in ops.cc.
// Each returns empty meta tensors of the shape and dtype its CPU kernel
// returns, computing nothing, so that shape propagation (and anything that
// runs a model on the meta device) works without running the ops. The
// shape arguments are checked as far as shapes go (ValueError); values are
// not (a meta tensor has none).
#ifndef POSBIAS_TORCH_SRC_META_OPS_H_
#define POSBIAS_TORCH_SRC_META_OPS_H_

#include <ATen/ATen.h>

#include <tuple>

namespace posbias::meta {

std::tuple<at::Tensor, at::Tensor> attention_lse(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, c10::string_view bias,
                                                 const c10::optional<at::Tensor>& slopes,
                                                 const c10::optional<at::Tensor>& table,
                                                 const c10::optional<at::Tensor>& dense,
                                                 c10::optional<double> scale, bool causal);

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                     const c10::optional<at::Tensor>& table, const c10::optional<at::Tensor>& dense,
                     c10::optional<double> scale, bool causal);

at::Tensor expand_distance_table(const at::Tensor& table, int64_t i, int64_t j,
                                 c10::optional<at::ScalarType> dtype);

at::Tensor reduce_distance_table(const at::Tensor& grad, int64_t n);

at::Tensor dpb_distance_table(at::TensorList params, int64_t j, c10::string_view variant,
                              bool log_distance, bool norm, double eps);

at::Tensor t5_distance_table(const at::Tensor& embedding, int64_t j, bool causal,
                             int64_t num_buckets, int64_t max_distance, double scale);

at::Tensor alibi_distance_table(const at::Tensor& slopes, int64_t j, bool signed_distances);

at::Tensor alibi_bias_build(const at::Tensor& slopes, int64_t n_heads, bool causal, int64_t q_len,
                            int64_t k_len, c10::optional<at::ScalarType> dtype);

at::Tensor alibi_bias_custom_pos(const at::Tensor& slopes, int64_t total_heads,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos,
                                 c10::optional<at::ScalarType> dtype);

// The batch ops (batch_ops.cc). Grads: grad_q, grad_k, grad_v (their inputs'
// shapes and dtypes), then float32 grad_slopes, grad_table and grad_dense in
// their tensors' shapes, or empty [0] when the tensor was not given.
using OptTensor = c10::optional<at::Tensor>;
using BatchGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

std::tuple<at::Tensor, at::Tensor> attention_options_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& slopes,
    const OptTensor& table, const OptTensor& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> q_offset, int64_t window_left, int64_t window_right, double softcap,
    const OptTensor& key_mask);

BatchGrads attention_options_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& slopes,
    const OptTensor& table, const OptTensor& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> q_offset, int64_t window_left, int64_t window_right, double softcap,
    const OptTensor& key_mask, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& grad_out);

std::tuple<at::Tensor, at::Tensor> attention_varlen_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const OptTensor& slopes, const OptTensor& table,
    c10::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap);

BatchGrads attention_varlen_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const OptTensor& slopes, const OptTensor& table,
    c10::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out);

at::Tensor attention_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                             const OptTensor& block_table, const OptTensor& slopes,
                             const OptTensor& table, c10::optional<double> scale, bool causal,
                             int64_t window_left, int64_t window_right, double softcap);

std::tuple<at::Tensor, at::Tensor> attention_kvcache_lse(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cache_seqlens, const OptTensor& block_table, const OptTensor& slopes,
    const OptTensor& table, c10::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap);

void kvcache_append(const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& cache_seqlens, const OptTensor& block_table,
                    const at::Tensor& k, const at::Tensor& v);

// True when a tensor argument is on the meta device: the Autograd kernels
// then call the functions above (there is nothing to differentiate).
inline bool is_meta(const at::Tensor& t) { return t.defined() && t.is_meta(); }

}  // namespace posbias::meta

#endif  // POSBIAS_TORCH_SRC_META_OPS_H_
