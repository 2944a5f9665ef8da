// The op library: the one TORCH_LIBRARY(posbias, m) of the repository.
// Load it with torch.ops.load_library(path) (Python) or link / dlopen it
// (C++); the kernels are the posbias::ops functions of <posbias/torch.h>.
//
// Registration: the slopes and alibi_bias are CompositeImplicitAutograd
// (m.def with a function; the slopes take no tensor to dispatch on). The
// other ops have a CPU kernel (a core call), and an Autograd kernel:
// - differentiable ops, a torch::autograd::Function whose backward is a core
//   call: attention and attention_lse (posbias::attention_backward),
//   expand_distance_table and reduce_distance_table (each the other's
//   backward), dpb_distance_table and t5_distance_table (the core modules'
//   backward_distance_table);
// - ops without a backward (alibi_distance_table, alibi_bias_build,
//   alibi_bias_custom_pos), the CPU
//   kernel itself, so that their result never requires grad on any torch
//   version (without one, torch 2.x's autograd fallback would mark it as
//   requiring grad when the slopes do, and only warn at backward).
// Meta kernels (meta_ops.h): shapes and dtypes only. A meta tensor also
// reaches the Autograd kernels (its key is AutogradMeta): they hand it to the
// Meta kernel, as there is nothing to differentiate.
#include <torch/library.h>

#include <string>
#include <vector>

#include "core_bridge.h"
#include "meta_ops.h"
#include "posbias/torch.h"
#include "posbias/version.h"

namespace {

// The C++ library's version (CMake's project version): posbias.__version__.
std::string library_version() { return posbias::version(); }

// The OpenMP thread count the core's kernels get when an op is called from
// this thread (torch's: see core_bridge.h); for the tests.
int64_t num_threads() { return posbias::torch_bridge::follow_torch_threads(); }

// A tensor on the core's storage (posbias::Tensor::empty, wrapped without a
// copy): 64-byte aligned, and from 4 MiB up mapped straight from the kernel,
// 2 MiB aligned and advised as transparent huge pages. Uninitialised, like
// torch.empty. For long-lived KV caches: torch 1.13's allocator never advises
// huge pages, and a decode reading a 1 GiB cache in 4 KiB pages pays about
// 15-20% in TLB misses (docs/python.md). float32, bfloat16, float16 or
// float64; the core checks the shape (ValueError for a negative extent,
// std::length_error, as a ValueError, when it cannot fit in memory).
at::Tensor empty(std::vector<int64_t> size, c10::optional<at::ScalarType> dtype) {
  const at::ScalarType s = dtype.value_or(at::kFloat);
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf || s == at::kDouble,
                   "posbias.empty: dtype must be float32, bfloat16, float16 or float64, got ", s);
  const posbias::DType dt = s == at::kDouble ? posbias::DType::kFloat64
                                             : posbias::torch_bridge::dtype_from_scalar(s, "empty");
  return posbias::torch_bridge::core_call(
      [&] { return posbias::torch_bridge::to_torch(posbias::Tensor::empty(size, dt)); });
}

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                              const c10::optional<at::Tensor>& table,
                              const c10::optional<at::Tensor>& dense, c10::optional<double> scale,
                              bool causal) {
  if (posbias::meta::is_meta(q)) {
    return posbias::meta::attention(q, k, v, bias, slopes, table, dense, scale, causal);
  }
  return posbias::ops::attention(q, k, v, bias, slopes, table, dense, scale, causal);
}

std::tuple<at::Tensor, at::Tensor> attention_lse_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, c10::string_view bias,
    const c10::optional<at::Tensor>& slopes, const c10::optional<at::Tensor>& table,
    const c10::optional<at::Tensor>& dense, c10::optional<double> scale, bool causal) {
  if (posbias::meta::is_meta(q)) {
    return posbias::meta::attention_lse(q, k, v, bias, slopes, table, dense, scale, causal);
  }
  return posbias::ops::attention_lse(q, k, v, bias, slopes, table, dense, scale, causal);
}

at::Tensor expand_distance_table_autograd(const at::Tensor& table, int64_t i, int64_t j,
                                          c10::optional<at::ScalarType> dtype) {
  if (posbias::meta::is_meta(table))
    return posbias::meta::expand_distance_table(table, i, j, dtype);
  return posbias::ops::expand_distance_table(table, i, j, dtype);
}

at::Tensor reduce_distance_table_autograd(const at::Tensor& grad, int64_t n) {
  if (posbias::meta::is_meta(grad)) return posbias::meta::reduce_distance_table(grad, n);
  return posbias::ops::reduce_distance_table(grad, n);
}

at::Tensor t5_distance_table_autograd(const at::Tensor& embedding, int64_t j, bool causal,
                                      int64_t num_buckets, int64_t max_distance, double scale) {
  if (posbias::meta::is_meta(embedding)) {
    return posbias::meta::t5_distance_table(embedding, j, causal, num_buckets, max_distance, scale);
  }
  return posbias::ops::t5_distance_table(embedding, j, causal, num_buckets, max_distance, scale);
}

at::Tensor dpb_distance_table_autograd(at::TensorList params, int64_t j, c10::string_view variant,
                                       bool log_distance, bool norm, double eps) {
  if (!params.empty() && posbias::meta::is_meta(params.front())) {
    return posbias::meta::dpb_distance_table(params, j, variant, log_distance, norm, eps);
  }
  return posbias::ops::dpb_distance_table(params, j, variant, log_distance, norm, eps);
}

// The ops without a backward: their Autograd kernel is the CPU kernel (see
// the file comment), or the Meta kernel for a meta tensor.
at::Tensor alibi_distance_table_autograd(const at::Tensor& slopes, int64_t j, bool signed_d) {
  if (posbias::meta::is_meta(slopes))
    return posbias::meta::alibi_distance_table(slopes, j, signed_d);
  return posbias::ops::alibi_distance_table(slopes, j, signed_d);
}

at::Tensor alibi_bias_build_autograd(const at::Tensor& slopes, int64_t n_heads, bool causal,
                                     int64_t q_len, int64_t k_len,
                                     c10::optional<at::ScalarType> dtype) {
  if (posbias::meta::is_meta(slopes)) {
    return posbias::meta::alibi_bias_build(slopes, n_heads, causal, q_len, k_len, dtype);
  }
  return posbias::ops::alibi_bias_build(slopes, n_heads, causal, q_len, k_len, dtype);
}

at::Tensor alibi_bias_custom_pos_autograd(const at::Tensor& slopes, int64_t total_heads,
                                          const at::Tensor& q_pos, const at::Tensor& k_pos,
                                          c10::optional<at::ScalarType> dtype) {
  if (posbias::meta::is_meta(slopes) || posbias::meta::is_meta(q_pos) ||
      posbias::meta::is_meta(k_pos)) {
    return posbias::meta::alibi_bias_custom_pos(slopes, total_heads, q_pos, k_pos, dtype);
  }
  return posbias::ops::alibi_bias_custom_pos(slopes, total_heads, q_pos, k_pos, dtype);
}

}  // namespace

TORCH_LIBRARY(posbias, m) {
  m.def("version() -> str", TORCH_FN(library_version));
  m.def("_num_threads() -> int", TORCH_FN(num_threads));
  m.def("empty(int[] size, ScalarType? dtype=None) -> Tensor", TORCH_FN(empty));
  m.def("alibi_slopes(int heads, float? max_bias=None) -> Tensor",
        TORCH_FN(posbias::ops::alibi_slopes));
  m.def(
      "alibi_slopes_range(int total_heads, int head_begin, int head_end, float? max_bias=None) "
      "-> Tensor",
      TORCH_FN(posbias::ops::alibi_slopes_range));
  m.def(
      "alibi_bias(Tensor slopes, int i, int j, int total_heads=-1, ScalarType? dtype=None) -> "
      "Tensor",
      TORCH_FN(posbias::ops::alibi_bias));
  m.def("alibi_distance_table(Tensor slopes, int j, bool signed=True) -> Tensor");
  m.def(
      "alibi_bias_build(Tensor slopes, int n_heads, bool causal, int q_len, int k_len, "
      "ScalarType? dtype=None) -> Tensor");
  m.def(
      "alibi_bias_custom_pos(Tensor slopes, int total_heads, Tensor q_pos, Tensor k_pos, "
      "ScalarType? dtype=None) -> Tensor");
  m.def(
      "t5_distance_table(Tensor embedding, int j, bool causal, int num_buckets, int "
      "max_distance, float scale) -> Tensor");
  m.def(
      "dpb_distance_table(Tensor[] params, int j, str variant=\"zeta\", bool log_distance=False, "
      "bool norm=False, float eps=1e-05) -> Tensor");
  m.def("expand_distance_table(Tensor table, int i, int j, ScalarType? dtype=None) -> Tensor");
  m.def("reduce_distance_table(Tensor grad, int n) -> Tensor");
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, str bias=\"none\", Tensor? slopes=None, Tensor? "
      "table=None, Tensor? dense=None, float? scale=None, bool causal=False) -> Tensor");
  m.def(
      "attention_lse(Tensor q, Tensor k, Tensor v, str bias=\"none\", Tensor? slopes=None, "
      "Tensor? table=None, Tensor? dense=None, float? scale=None, bool causal=False) -> (Tensor "
      "out, Tensor lse)");
  m.def(
      "attention_backward(Tensor q, Tensor k, Tensor v, str bias, Tensor? slopes, Tensor? table, "
      "Tensor? dense, float? scale, bool causal, Tensor out, Tensor lse, Tensor grad_out) -> "
      "(Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor grad_slopes, Tensor grad_table, "
      "Tensor grad_dense)");
}

TORCH_LIBRARY_IMPL(posbias, CPU, m) {
  m.impl("alibi_distance_table", TORCH_FN(posbias::ops::alibi_distance_table));
  m.impl("alibi_bias_build", TORCH_FN(posbias::ops::alibi_bias_build));
  m.impl("alibi_bias_custom_pos", TORCH_FN(posbias::ops::alibi_bias_custom_pos));
  m.impl("attention", TORCH_FN(posbias::ops::attention_cpu));
  m.impl("attention_lse", TORCH_FN(posbias::ops::attention_lse_cpu));
  m.impl("attention_backward", TORCH_FN(posbias::ops::attention_backward));
  m.impl("expand_distance_table", TORCH_FN(posbias::ops::expand_distance_table_cpu));
  m.impl("reduce_distance_table", TORCH_FN(posbias::ops::reduce_distance_table_cpu));
  m.impl("t5_distance_table", TORCH_FN(posbias::ops::t5_distance_table_cpu));
  m.impl("dpb_distance_table", TORCH_FN(posbias::ops::dpb_distance_table_cpu));
}

TORCH_LIBRARY_IMPL(posbias, Meta, m) {
  m.impl("alibi_distance_table", TORCH_FN(posbias::meta::alibi_distance_table));
  m.impl("alibi_bias_build", TORCH_FN(posbias::meta::alibi_bias_build));
  m.impl("alibi_bias_custom_pos", TORCH_FN(posbias::meta::alibi_bias_custom_pos));
  m.impl("attention", TORCH_FN(posbias::meta::attention));
  m.impl("attention_lse", TORCH_FN(posbias::meta::attention_lse));
  m.impl("expand_distance_table", TORCH_FN(posbias::meta::expand_distance_table));
  m.impl("reduce_distance_table", TORCH_FN(posbias::meta::reduce_distance_table));
  m.impl("t5_distance_table", TORCH_FN(posbias::meta::t5_distance_table));
  m.impl("dpb_distance_table", TORCH_FN(posbias::meta::dpb_distance_table));
}

TORCH_LIBRARY_IMPL(posbias, Autograd, m) {
  m.impl("alibi_distance_table", TORCH_FN(alibi_distance_table_autograd));
  m.impl("alibi_bias_build", TORCH_FN(alibi_bias_build_autograd));
  m.impl("alibi_bias_custom_pos", TORCH_FN(alibi_bias_custom_pos_autograd));
  m.impl("attention", TORCH_FN(attention_autograd));
  m.impl("attention_lse", TORCH_FN(attention_lse_autograd));
  m.impl("attention_backward", TORCH_FN(posbias::ops::attention_backward));  // not differentiable
  m.impl("expand_distance_table", TORCH_FN(expand_distance_table_autograd));
  m.impl("reduce_distance_table", TORCH_FN(reduce_distance_table_autograd));
  m.impl("t5_distance_table", TORCH_FN(t5_distance_table_autograd));
  m.impl("dpb_distance_table", TORCH_FN(dpb_distance_table_autograd));
}
