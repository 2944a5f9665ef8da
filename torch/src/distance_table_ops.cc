// The distance-table ops: expand_distance_table and reduce_distance_table,
// one core call each (posbias/distance_table.h), and their autograd: the
// backward of the expansion is the reduction and the backward of the
// reduction is the expansion, so gradients of any order go through the core's
// Toeplitz kernels. float64 (a table, a gradient or a requested output
// dtype) takes the reference path instead: the same gather and diagonal sum
// written with ATen ops in float64 (exact: no arithmetic but the sums), whose
// autograd is ATen's, so gradcheck runs in float64.
#include <torch/torch.h>

#include <algorithm>

#include "core_bridge.h"
#include "posbias/distance_table.h"
#include "posbias/torch.h"

namespace posbias {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch_bridge::core_call;
using torch_bridge::to_torch;
using torch_bridge::view_of;

// ------------------------------------------------- float64 reference path

bool is_f64(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kDouble; }

// The table entry read for each (r, c) of [i, j], flattened:
// (n - 1) / 2 + (q_r - c) with q_r = j - i + r.
at::Tensor toeplitz_index(int64_t n, int64_t i, int64_t j) {
  const at::Tensor r = at::arange(i, at::kLong).unsqueeze(1);
  const at::Tensor c = at::arange(j, at::kLong).unsqueeze(0);
  return ((n - 1) / 2 + (j - i) + r - c).reshape({-1});
}

void check_table_length(const char* who, int64_t n, int64_t i, int64_t j, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(i >= 0 && j >= 0, "posbias.", who, ": i and j must be >= 0, got i = ", i,
                    ", j = ", j);
  TORCH_CHECK_VALUE(n % 2 == 1, "posbias.", who, ": the table length n = ", n, " (shape ", shape,
                    ") must be odd (read at its centre)");
  const int64_t need = 2 * std::max(i, j) - 1;
  TORCH_CHECK_VALUE(i == 0 || j == 0 || n >= need, "posbias.", who, ": the table length n = ", n,
                    " (shape ", shape, ") is too short for i = ", i, ", j = ", j,
                    ": it must be >= 2 max(i, j) - 1 = ", need);
}

at::Tensor expand_f64(const at::Tensor& table, int64_t i, int64_t j,
                      c10::optional<at::ScalarType> dtype) {
  torch_bridge::check_cpu(table, "expand_distance_table", "table");
  TORCH_CHECK_VALUE(table.dim() == 2, "posbias.expand_distance_table: table must be [h, n], got ",
                    table.sizes());
  TORCH_CHECK_TYPE(table.is_floating_point(),
                   "posbias.expand_distance_table: table must be floating, got ",
                   table.scalar_type());
  check_table_length("expand_distance_table", table.size(1), i, j, table.sizes());
  const at::Tensor idx = toeplitz_index(table.size(1), i, j);
  at::Tensor out = table.to(at::kDouble).index_select(1, idx).view({table.size(0), i, j});
  const at::ScalarType want = dtype.value_or(table.scalar_type());
  if (want != at::kDouble) torch_bridge::dtype_from_scalar(want, "expand_distance_table");
  return want == at::kDouble ? out : out.to(want);
}

at::Tensor reduce_f64(const at::Tensor& grad, int64_t n) {
  torch_bridge::check_cpu(grad, "reduce_distance_table", "grad");
  TORCH_CHECK_VALUE(grad.dim() == 3, "posbias.reduce_distance_table: grad must be [h, i, j], got ",
                    grad.sizes());
  const int64_t h = grad.size(0), i = grad.size(1), j = grad.size(2);
  check_table_length("reduce_distance_table", n, i, j, grad.sizes());
  return at::zeros({h, n}, grad.options())
      .index_add(1, toeplitz_index(n, i, j), grad.reshape({h, i * j}));
}

bool expand_wants_f64(const at::Tensor& table, const c10::optional<at::ScalarType>& dtype) {
  return is_f64(table) || (dtype.has_value() && *dtype == at::kDouble);
}

// The output dtype: the requested one, else the table's.
DType output_dtype(const at::Tensor& table, const c10::optional<at::ScalarType>& dtype) {
  return torch_bridge::dtype_from_scalar(dtype ? *dtype : table.scalar_type(),
                                         "expand_distance_table");
}

class ExpandFunction : public torch::autograd::Function<ExpandFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& table, int64_t i, int64_t j,
                            c10::optional<at::ScalarType> dtype) {
    at::Tensor out = ops::expand_distance_table_cpu(table, i, j, dtype);
    ctx->saved_data["n"] = table.size(1);
    ctx->saved_data["table_dtype"] = table.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t n = ctx->saved_data["n"].toInt();
    const at::ScalarType table_dtype = ctx->saved_data["table_dtype"].toScalarType();
    at::Tensor g = ops::reduce_distance_table(grads[0], n);
    if (g.scalar_type() != table_dtype) g = g.to(table_dtype);
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class ReduceFunction : public torch::autograd::Function<ReduceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, int64_t n) {
    at::Tensor out = ops::reduce_distance_table_cpu(grad, n);
    ctx->saved_data["i"] = grad.size(1);
    ctx->saved_data["j"] = grad.size(2);
    ctx->saved_data["grad_dtype"] = grad.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::ScalarType dtype = ctx->saved_data["grad_dtype"].toScalarType();
    return {ops::expand_distance_table(grads[0], ctx->saved_data["i"].toInt(),
                                       ctx->saved_data["j"].toInt(), dtype),
            at::Tensor()};
  }
};

}  // namespace

namespace ops {

at::Tensor expand_distance_table_cpu(const at::Tensor& table, int64_t i, int64_t j,
                                     c10::optional<at::ScalarType> dtype) {
  if (expand_wants_f64(table, dtype)) return expand_f64(table, i, j, dtype);
  torch_bridge::check_cpu(table, "expand_distance_table", "table");
  const Tensor t = view_of(table, torch_bridge::dtype_of(table, "expand_distance_table", "table"));
  const DType out = output_dtype(table, dtype);
  return core_call([&] { return to_torch(posbias::expand_distance_table(t, i, j, out)); });
}

at::Tensor reduce_distance_table_cpu(const at::Tensor& grad, int64_t n) {
  if (is_f64(grad)) return reduce_f64(grad, n);
  torch_bridge::check_cpu(grad, "reduce_distance_table", "grad");
  const Tensor g = view_of(grad, torch_bridge::dtype_of(grad, "reduce_distance_table", "grad"));
  return core_call([&] { return to_torch(posbias::reduce_distance_table(g, n)); });
}

at::Tensor expand_distance_table(const at::Tensor& table, int64_t i, int64_t j,
                                 c10::optional<at::ScalarType> dtype) {
  // float64: ATen ops, recorded by autograd (any order).
  if (expand_wants_f64(table, dtype)) return expand_f64(table, i, j, dtype);
  return ExpandFunction::apply(table, i, j, dtype);
}

at::Tensor reduce_distance_table(const at::Tensor& grad, int64_t n) {
  if (is_f64(grad)) return reduce_f64(grad, n);
  return ReduceFunction::apply(grad, n);
}

}  // namespace ops
}  // namespace posbias
