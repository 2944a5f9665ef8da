// The distance-table ops: expand_distance_table and reduce_distance_table,
// one core call each (posbias/distance_table.h), and their autograd: the
// backward of the expansion is the reduction and the backward of the
// reduction is the expansion, so gradients of any order go through the core's
// Toeplitz kernels. float64 (a table, a gradient or a requested output
// dtype) goes to the core like the other dtypes, which takes its reference
// path (exact in double), so gradcheck and gradgradcheck run in float64.
#include <torch/torch.h>

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

// The output dtype: the requested one, else the table's (float64 included).
DType output_dtype(const at::Tensor& table, const c10::optional<at::ScalarType>& dtype) {
  const at::ScalarType s = dtype ? *dtype : table.scalar_type();
  if (s == at::kDouble) return DType::kFloat64;
  return torch_bridge::dtype_from_scalar(s, "expand_distance_table");
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
  torch_bridge::check_cpu(table, "expand_distance_table", "table");
  const Tensor t =
      view_of(table, torch_bridge::float_dtype_of(table, "expand_distance_table", "table"));
  const DType out = output_dtype(table, dtype);
  return core_call([&] { return to_torch(posbias::expand_distance_table(t, i, j, out)); });
}

at::Tensor reduce_distance_table_cpu(const at::Tensor& grad, int64_t n) {
  torch_bridge::check_cpu(grad, "reduce_distance_table", "grad");
  const Tensor g =
      view_of(grad, torch_bridge::float_dtype_of(grad, "reduce_distance_table", "grad"));
  return core_call([&] { return to_torch(posbias::reduce_distance_table(g, n)); });
}

at::Tensor expand_distance_table(const at::Tensor& table, int64_t i, int64_t j,
                                 c10::optional<at::ScalarType> dtype) {
  return ExpandFunction::apply(table, i, j, dtype);
}

at::Tensor reduce_distance_table(const at::Tensor& grad, int64_t n) {
  return ReduceFunction::apply(grad, n);
}

}  // namespace ops
}  // namespace posbias
