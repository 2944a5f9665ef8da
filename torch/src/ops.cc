// The op library: the one TORCH_LIBRARY(posbias, m) of the repository.
// Load it with torch.ops.load_library(path) (Python) or link / dlopen it
// (C++); the kernels are the posbias::ops functions of <posbias/torch.h>.
//
// Registration: ops without a custom backward are CompositeImplicitAutograd
// (m.def with a function): the distance tables are built from torch ops, so
// autograd differentiates them. attention and attention_lse have a CPU
// kernel (no autograd) and an Autograd kernel (a torch::autograd::Function
// whose backward is posbias::attention_backward).
#include <torch/library.h>

#include "posbias/torch.h"

namespace {

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              c10::string_view bias, const c10::optional<at::Tensor>& slopes,
                              const c10::optional<at::Tensor>& table,
                              const c10::optional<at::Tensor>& dense,
                              c10::optional<double> scale, bool causal) {
  return posbias::ops::attention(q, k, v, bias, slopes, table, dense, scale, causal);
}

std::tuple<at::Tensor, at::Tensor> attention_lse_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, c10::string_view bias,
    const c10::optional<at::Tensor>& slopes, const c10::optional<at::Tensor>& table,
    const c10::optional<at::Tensor>& dense, c10::optional<double> scale, bool causal) {
  return posbias::ops::attention_lse(q, k, v, bias, slopes, table, dense, scale, causal);
}

}  // namespace

TORCH_LIBRARY(posbias, m) {
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
  m.def("alibi_distance_table(Tensor slopes, int j, bool signed=True) -> Tensor",
        TORCH_FN(posbias::ops::alibi_distance_table));
  m.def(
      "t5_distance_table(Tensor embedding, int j, bool causal, int num_buckets, int "
      "max_distance, float scale) -> Tensor",
      TORCH_FN(posbias::ops::t5_distance_table));
  m.def(
      "dpb_distance_table(Tensor[] params, int j, str variant=\"zeta\", bool log_distance=False, "
      "bool norm=False, float eps=1e-05) -> Tensor",
      TORCH_FN(posbias::ops::dpb_distance_table));
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, str bias=\"none\", Tensor? slopes=None, Tensor? "
      "table=None, Tensor? dense=None, float? scale=None, bool causal=False) -> Tensor");
  m.def(
      "attention_lse(Tensor q, Tensor k, Tensor v, str bias=\"none\", Tensor? slopes=None, "
      "Tensor? table=None, Tensor? dense=None, float? scale=None, bool causal=False) -> (Tensor "
      "out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(posbias, CPU, m) {
  m.impl("attention", TORCH_FN(posbias::ops::attention_cpu));
  m.impl("attention_lse", TORCH_FN(posbias::ops::attention_lse_cpu));
}

TORCH_LIBRARY_IMPL(posbias, Autograd, m) {
  m.impl("attention", TORCH_FN(attention_autograd));
  m.impl("attention_lse", TORCH_FN(attention_lse_autograd));
}
