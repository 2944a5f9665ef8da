#include "meta_ops.h"

#include <c10/util/Exception.h>

#include <initializer_list>

namespace posbias::meta {
namespace {

at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::empty(shape, at::TensorOptions().device(at::kMeta).dtype(dtype));
}

void check_length(const char* who, const char* name, int64_t n) {
  TORCH_CHECK_VALUE(n >= 0, "posbias.", who, ": ", name, " must be >= 0, got ", n);
}

// The width 2j - 1 of a distance table (j >= 1).
int64_t table_width(const char* who, int64_t j) {
  TORCH_CHECK_VALUE(j >= 1, "posbias.", who, ": j must be >= 1, got ", j);
  return 2 * j - 1;
}

// ValueError unless every tensor is d-dimensional (what the shapes below read).
void check_dims(const char* who, const char* layout, int64_t d,
                std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    TORCH_CHECK_VALUE(t->dim() == d, "posbias.", who, ": ", layout, " (", d, "-d), got ",
                      t->sizes());
  }
}

at::Tensor like(const at::Tensor& t) { return empty(t.sizes(), t.scalar_type()); }

// The dtype of an attention call's lse and bias gradients: float64 in a
// float64 call (q float64), float32 otherwise, as the CPU kernels return.
at::ScalarType stats_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The gradient of an optional bias tensor: its shape in dt, or float32 [0]
// when not given.
at::Tensor grad_of(const OptTensor& t, at::ScalarType dt) {
  return t.has_value() && t->defined() ? empty(t->sizes(), dt) : empty({0}, at::kFloat);
}

BatchGrads grads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const OptTensor& slopes, const OptTensor& table, const OptTensor& dense) {
  const at::ScalarType dt = stats_dtype(q);
  return {like(q), like(k), like(v), grad_of(slopes, dt), grad_of(table, dt), grad_of(dense, dt)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_lse(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, c10::string_view /*bias*/,
                                                 const c10::optional<at::Tensor>& /*slopes*/,
                                                 const c10::optional<at::Tensor>& /*table*/,
                                                 const c10::optional<at::Tensor>& /*dense*/,
                                                 c10::optional<double> /*scale*/, bool /*causal*/) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "posbias.attention: q must be ",
                    "[b, h, i, d] and k, v [b, hk, j, d] (4-d), got q ", q.sizes(), ", k ",
                    k.sizes(), ", v ", v.sizes());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) &&
                        k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
                    "posbias.attention: k and v must be [b, hk, j, d] with q's b and d and "
                    "h % hk == 0, got q ",
                    q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  return {empty(q.sizes(), q.scalar_type()),
          empty({q.size(0), q.size(1), q.size(2)}, stats_dtype(q))};
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                     const c10::optional<at::Tensor>& table, const c10::optional<at::Tensor>& dense,
                     c10::optional<double> scale, bool causal) {
  return std::get<0>(attention_lse(q, k, v, bias, slopes, table, dense, scale, causal));
}

at::Tensor expand_distance_table(const at::Tensor& table, int64_t i, int64_t j,
                                 c10::optional<at::ScalarType> dtype) {
  TORCH_CHECK_VALUE(table.dim() == 2, "posbias.expand_distance_table: table must be [h, n], got ",
                    table.sizes());
  check_length("expand_distance_table", "i", i);
  check_length("expand_distance_table", "j", j);
  return empty({table.size(0), i, j}, dtype.value_or(table.scalar_type()));
}

at::Tensor reduce_distance_table(const at::Tensor& grad, int64_t n) {
  TORCH_CHECK_VALUE(grad.dim() == 3, "posbias.reduce_distance_table: grad must be [h, i, j], got ",
                    grad.sizes());
  check_length("reduce_distance_table", "n", n);
  return empty({grad.size(0), n}, at::kFloat);
}

at::Tensor dpb_distance_table(at::TensorList params, int64_t j, c10::string_view /*variant*/,
                              bool /*log_distance*/, bool /*norm*/, double /*eps*/) {
  TORCH_CHECK_VALUE(!params.empty() && params.back().dim() == 1,
                    "posbias.dpb_distance_table: the last parameter must be the output bias "
                    "[heads]");
  return empty({params.back().size(0), table_width("dpb_distance_table", j)},
               params.front().scalar_type());
}

at::Tensor t5_distance_table(const at::Tensor& embedding, int64_t j, bool /*causal*/,
                             int64_t /*num_buckets*/, int64_t /*max_distance*/, double /*scale*/) {
  TORCH_CHECK_VALUE(embedding.dim() == 2,
                    "posbias.t5_distance_table: embedding must be [num_buckets, heads], got ",
                    embedding.sizes());
  return empty({embedding.size(1), table_width("t5_distance_table", j)}, embedding.scalar_type());
}

at::Tensor alibi_distance_table(const at::Tensor& slopes, int64_t j, bool /*signed_distances*/) {
  TORCH_CHECK_VALUE(slopes.dim() == 1, "posbias.alibi_distance_table: slopes must be [h], got ",
                    slopes.sizes());
  return empty({slopes.size(0), table_width("alibi_distance_table", j)}, at::kFloat);
}

at::Tensor alibi_bias_build(const at::Tensor& /*slopes*/, int64_t n_heads, bool /*causal*/,
                            int64_t q_len, int64_t k_len, c10::optional<at::ScalarType> dtype) {
  check_length("alibi_bias_build", "n_heads", n_heads);
  check_length("alibi_bias_build", "q_len", q_len);
  check_length("alibi_bias_build", "k_len", k_len);
  return empty({1, n_heads, q_len, k_len}, dtype.value_or(at::kFloat));
}

at::Tensor alibi_bias_custom_pos(const at::Tensor& slopes, int64_t total_heads,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos,
                                 c10::optional<at::ScalarType> dtype) {
  TORCH_CHECK_VALUE(slopes.dim() == 1 && q_pos.dim() == 1 && k_pos.dim() == 1,
                    "posbias.alibi_bias_custom_pos: slopes, q_pos and k_pos must be 1-d, got ",
                    slopes.sizes(), ", ", q_pos.sizes(), ", ", k_pos.sizes());
  const int64_t heads = total_heads < 0 ? slopes.size(0) : total_heads;
  return empty({heads, q_pos.size(0), k_pos.size(0)}, dtype.value_or(at::kFloat));
}

std::tuple<at::Tensor, at::Tensor> attention_options_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& slopes,
    const OptTensor& table, const OptTensor& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> /*q_offset*/, int64_t /*window_left*/, int64_t /*window_right*/,
    double /*softcap*/, const OptTensor& /*key_mask*/) {
  return attention_lse(q, k, v, "none", slopes, table, dense, scale, causal);
}

BatchGrads attention_options_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& slopes,
    const OptTensor& table, const OptTensor& dense, c10::optional<double> scale, bool causal,
    c10::optional<int64_t> /*q_offset*/, int64_t /*window_left*/, int64_t /*window_right*/,
    double /*softcap*/, const OptTensor& /*key_mask*/, const at::Tensor& /*out*/,
    const at::Tensor& /*lse*/, const at::Tensor& /*grad_out*/) {
  attention_lse(q, k, v, "none", slopes, table, dense, scale, causal);  // the shape checks
  return grads(q, k, v, slopes, table, dense);
}

std::tuple<at::Tensor, at::Tensor> attention_varlen_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& /*cu_seqlens_q*/, const at::Tensor& /*cu_seqlens_k*/,
    const OptTensor& /*slopes*/, const OptTensor& /*table*/, c10::optional<double> /*scale*/,
    bool /*causal*/, int64_t /*window_left*/, int64_t /*window_right*/, double /*softcap*/) {
  check_dims("attention_varlen", "q must be [total_q, h, d] and k, v [total_k, hk, d]", 3,
             {&q, &k, &v});
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(2) == q.size(2) && k.size(1) >= 1 &&
                        q.size(1) % k.size(1) == 0,
                    "posbias.attention_varlen: k and v must be [total_k, hk, d] with q's d and "
                    "h % hk == 0, got q ",
                    q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  return {like(q), empty({q.size(1), q.size(0)}, stats_dtype(q))};
}

BatchGrads attention_varlen_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const OptTensor& slopes, const OptTensor& table,
    c10::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap, const at::Tensor& /*out*/, const at::Tensor& /*lse*/,
    const at::Tensor& /*grad_out*/) {
  attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, slopes, table, scale, causal,
                           window_left, window_right, softcap);  // the shape checks
  return grads(q, k, v, slopes, table, c10::nullopt);
}

at::Tensor attention_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& /*cache_seqlens*/,
                             const OptTensor& /*block_table*/, const OptTensor& /*slopes*/,
                             const OptTensor& /*table*/, c10::optional<double> /*scale*/,
                             bool /*causal*/, int64_t /*window_left*/, int64_t /*window_right*/,
                             double /*softcap*/) {
  check_dims("attention_with_kvcache",
             "q must be [b, i, h, d] and the caches [b, max_len, hk, d] or paged "
             "[num_blocks, block_size, hk, d]",
             4, {&q, &k_cache, &v_cache});
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes() && k_cache.size(3) == q.size(3) &&
                        k_cache.size(2) >= 1 && q.size(2) % k_cache.size(2) == 0,
                    "posbias.attention_with_kvcache: k_cache and v_cache must have one shape "
                    "with q's d and h % hk == 0, got q ",
                    q.sizes(), ", k_cache ", k_cache.sizes(), ", v_cache ", v_cache.sizes());
  return like(q);
}

std::tuple<at::Tensor, at::Tensor> attention_kvcache_lse(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cache_seqlens, const OptTensor& block_table, const OptTensor& slopes,
    const OptTensor& table, c10::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap) {
  at::Tensor out = attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, slopes, table,
                                     scale, causal, window_left, window_right, softcap);
  return {out, empty({q.size(0), q.size(2), q.size(1)}, stats_dtype(q))};
}

void kvcache_append(const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& /*cache_seqlens*/, const OptTensor& /*block_table*/,
                    const at::Tensor& k, const at::Tensor& v) {
  check_dims("kvcache_append", "k_cache, v_cache, k and v must be 4-d", 4,
             {&k_cache, &v_cache, &k, &v});
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(2) == k_cache.size(2) &&
                        k.size(3) == k_cache.size(3) && k_cache.sizes() == v_cache.sizes(),
                    "posbias.kvcache_append: k and v must be [b, n, hk, d] with the caches' hk "
                    "and d, got k ",
                    k.sizes(), ", v ", v.sizes(), ", k_cache ", k_cache.sizes());
}

}  // namespace posbias::meta
