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

// True when a tensor argument is on the meta device: the Autograd kernels
// then call the functions above (there is nothing to differentiate).
inline bool is_meta(const at::Tensor& t) { return t.defined() && t.is_meta(); }

}  // namespace posbias::meta

#endif  // POSBIAS_TORCH_SRC_META_OPS_H_
