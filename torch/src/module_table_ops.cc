// The module-table ops: dpb_distance_table and t5_distance_table, one core
// call each way. The forward builds the core module over the parameter
// tensors (DynamicPositionBias: its parameters loaded, i.e. copied once to
// float32; RelativePositionBias: a view of the embedding, no copy) and calls
// its distance_table(j); the backward calls the same module's
// backward_distance_table (the MLP's parameter gradients, the embedding's
// scatter-add). The core module is kept for the backward in the autograd
// context (a capsule), not rebuilt. Argument errors are the core's, through
// core_call (ValueError with its message); what only the front end sees (the
// variant's spelling, the parameter count, a float64 or non-CPU tensor) is
// checked here.
//
// float64 parameters take the core's float64 references
// (dpb_distance_table_f64, t5_distance_table_f64 and their backwards), one
// core call each way, so gradcheck runs in float64.
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core_bridge.h"
#include "posbias/dpb.h"
#include "posbias/t5.h"
#include "posbias/torch.h"

namespace posbias {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch_bridge::core_call;
using torch_bridge::to_torch;
using torch_bridge::view_of;

// A core module kept alive in an autograd context between forward and backward.
template <typename Module>
struct CoreHolder : torch::CustomClassHolder {
  explicit CoreHolder(Module m) : module(std::move(m)) {}
  Module module;
};

template <typename Module>
c10::IValue keep(Module m) {
  return c10::IValue::make_capsule(c10::make_intrusive<CoreHolder<Module>>(std::move(m)));
}

template <typename Module>
const Module& kept(const c10::IValue& v) {
  return static_cast<const CoreHolder<Module>*>(v.toCapsule().get())->module;
}

// A float32 core result as a torch tensor of `dtype` (the parameters').
at::Tensor result_as(const Tensor& t, at::ScalarType dtype) {
  at::Tensor out = to_torch(t);
  return out.scalar_type() == dtype ? out : out.to(dtype);
}

// ------------------------------------------------------------------- DPB

constexpr const char* kDpb = "dpb_distance_table";

// The options of a module over `params` (state-dict order): the variant's
// spelling and the parameter count are checked here (a list has no names),
// dim and heads read from the first and last tensors; every shape, value and
// option is then checked by the core.
DpbOptions dpb_options(at::TensorList params, const std::string& variant, bool log_distance,
                       bool norm, double eps) {
  TORCH_CHECK_VALUE(variant == "zeta" || variant == "x-transformers", "posbias.", kDpb,
                    ": variant must be \"zeta\" or \"x-transformers\", got \"", variant, "\"");
  DpbOptions o;
  o.variant = variant == "zeta" ? DpbVariant::kZeta : DpbVariant::kXTransformers;
  o.log_distance = log_distance;
  o.norm = norm;
  o.layernorm_eps = eps;
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t per_block = norm ? 4 : 2;
  if (o.variant == DpbVariant::kXTransformers) {
    // A list has no names: its length must give a whole number of blocks.
    TORCH_CHECK_VALUE(n >= 2 + per_block && (n - 2) % per_block == 0, "posbias.", kDpb,
                      ": x-transformers with norm=", norm, " takes ", per_block,
                      " tensors per hidden block plus 2 for the output layer, got ", n);
    o.depth = (n - 2) / per_block;
  } else {
    TORCH_CHECK_VALUE(n == 6, "posbias.", kDpb, ": the zeta variant takes 6 parameters (",
                      "mlp.0.weight, mlp.0.bias, mlp.2.weight, mlp.2.bias, mlp.4.weight, ",
                      "mlp.4.bias), got ", n);
  }
  const at::Tensor &first = params.front(), &last = params.back();
  o.dim = first.dim() >= 1 ? first.size(0) : 1;
  o.heads = last.dim() >= 1 ? last.size(0) : 1;
  return o;
}

// The core DynamicPositionBias holding `params` (float32, bfloat16 or
// float16), loaded by the core (its checks and messages).
DynamicPositionBias core_dpb(at::TensorList params, const std::string& variant, bool log_distance,
                             bool norm, double eps) {
  const DpbOptions o = dpb_options(params, variant, log_distance, norm, eps);
  for (const at::Tensor& p : params) {
    torch_bridge::check_cpu(p, kDpb, "a parameter");
    torch_bridge::dtype_of(p, kDpb, "a parameter");  // TypeError for float64
  }
  return core_call([&] {
    DynamicPositionBias m(o);
    const std::vector<std::string> names = m.parameter_names();
    TensorMap state;
    for (std::size_t k = 0; k < names.size(); ++k) {
      state[names[k]] = view_of(params[k], torch_bridge::dtype_of(params[k], kDpb, "a parameter"));
    }
    m.load_state_dict(state);
    return m;
  });
}

class DpbTableFunction : public torch::autograd::Function<DpbTableFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList params, int64_t j,
                            const std::string& variant, bool log_distance, bool norm, double eps) {
    DynamicPositionBias m = core_dpb(params, variant, log_distance, norm, eps);
    at::Tensor out =
        core_call([&] { return result_as(m.distance_table(j), params[0].scalar_type()); });
    std::vector<int64_t> dtypes;
    for (const at::Tensor& p : params) dtypes.push_back(static_cast<int64_t>(p.scalar_type()));
    ctx->saved_data["module"] = keep(std::move(m));
    ctx->saved_data["j"] = j;
    ctx->saved_data["dtypes"] = dtypes;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const DynamicPositionBias& m = kept<DynamicPositionBias>(ctx->saved_data["module"]);
    const int64_t j = ctx->saved_data["j"].toInt();
    const std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    const at::Tensor& g = grads[0];
    const TensorMap pg = core_call([&] {
      return m.backward_distance_table(
          j, view_of(g, torch_bridge::dtype_of(g, kDpb, "the table's gradient")));
    });
    const std::vector<std::string> names = m.parameter_names();
    variable_list out;
    for (std::size_t k = 0; k < names.size(); ++k) {
      out.push_back(result_as(pg.at(names[k]), static_cast<at::ScalarType>(dtypes[k])));
    }
    for (int k = 0; k < 5; ++k) out.emplace_back();  // j, variant, log_distance, norm, eps
    return out;
  }
};

// -------------------------------------------------------------------- T5

constexpr const char* kT5 = "t5_distance_table";

// The core RelativePositionBias over a view of `embedding` (no copy); the
// core checks the bucket arguments, the scale, the heads and the shape.
RelativePositionBias core_t5(const at::Tensor& embedding, bool causal, int64_t num_buckets,
                             int64_t max_distance, double scale) {
  torch_bridge::check_cpu(embedding, kT5, "embedding");
  const DType dt = torch_bridge::dtype_of(embedding, kT5, "embedding");
  const int64_t heads = embedding.dim() == 2 ? embedding.size(1) : 1;
  return core_call([&] {
    RelativePositionBias m(static_cast<float>(scale), causal, num_buckets, max_distance, heads);
    m.mutable_embedding() = view_of(embedding, dt);
    return m;
  });
}

class T5TableFunction : public torch::autograd::Function<T5TableFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& embedding, int64_t j,
                            bool causal, int64_t num_buckets, int64_t max_distance, double scale) {
    RelativePositionBias m = core_t5(embedding, causal, num_buckets, max_distance, scale);
    at::Tensor out =
        core_call([&] { return result_as(m.distance_table(j), embedding.scalar_type()); });
    ctx->saved_data["module"] = keep(std::move(m));
    ctx->saved_data["j"] = j;
    ctx->saved_data["dtype"] = embedding.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const RelativePositionBias& m = kept<RelativePositionBias>(ctx->saved_data["module"]);
    const int64_t j = ctx->saved_data["j"].toInt();
    const at::Tensor& g = grads[0];
    at::Tensor ge = core_call([&] {
      return result_as(m.backward_distance_table(
                           j, view_of(g, torch_bridge::dtype_of(g, kT5, "the table's gradient"))),
                       ctx->saved_data["dtype"].toScalarType());
    });
    return {ge, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ------------------------------------------------- float64 reference path
//
// float64 parameters: the core's float64 references (dpb_distance_table_f64,
// t5_distance_table_f64 and their backwards), one core call each way.

bool all_f64(at::TensorList params) {
  return !params.empty() && std::all_of(params.begin(), params.end(), [](const at::Tensor& p) {
    return p.defined() && p.scalar_type() == at::kDouble;
  });
}

// A float64 module's arguments for the core: its options, its parameter
// names in state-dict order (the list's order) and the parameters by name
// (views of the tensors). The core's constructor names the parameters and
// checks the options; the reference checks the parameters.
struct DpbF64Args {
  DpbOptions options;
  std::vector<std::string> names;
  TensorMap state;
};

DpbF64Args dpb_f64_args(at::TensorList params, const std::string& variant, bool log_distance,
                        bool norm, double eps) {
  for (const at::Tensor& p : params) torch_bridge::check_cpu(p, kDpb, "a parameter");
  DpbF64Args a;
  a.options = dpb_options(params, variant, log_distance, norm, eps);
  a.names = core_call([&] { return DynamicPositionBias(a.options).parameter_names(); });
  for (std::size_t k = 0; k < a.names.size(); ++k) {
    a.state[a.names[k]] = view_of(params[k], DType::kFloat64);
  }
  return a;
}

class DpbTableF64Function : public torch::autograd::Function<DpbTableF64Function> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList params, int64_t j,
                            const std::string& variant, bool log_distance, bool norm, double eps) {
    const DpbF64Args a = dpb_f64_args(params, variant, log_distance, norm, eps);
    at::Tensor out =
        core_call([&] { return to_torch(dpb_distance_table_f64(a.options, a.state, j)); });
    ctx->save_for_backward(params.vec());
    ctx->saved_data["j"] = j;
    ctx->saved_data["variant"] = variant;
    ctx->saved_data["log_distance"] = log_distance;
    ctx->saved_data["norm"] = norm;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list params = ctx->get_saved_variables();
    const int64_t j = ctx->saved_data["j"].toInt();
    const DpbF64Args a = dpb_f64_args(
        params, ctx->saved_data["variant"].toStringRef(), ctx->saved_data["log_distance"].toBool(),
        ctx->saved_data["norm"].toBool(), ctx->saved_data["eps"].toDouble());
    const at::Tensor g = grads[0].to(at::kDouble);
    const TensorMap pg = core_call([&] {
      return dpb_backward_distance_table_f64(a.options, a.state, j, view_of(g, DType::kFloat64));
    });
    variable_list out;
    for (const std::string& name : a.names) out.push_back(to_torch(pg.at(name)));
    for (int k = 0; k < 5; ++k) out.emplace_back();  // j, variant, log_distance, norm, eps
    return out;
  }
};

at::Tensor t5_f64_forward(const at::Tensor& embedding, int64_t j, bool causal, int64_t num_buckets,
                          int64_t max_distance, double scale) {
  torch_bridge::check_cpu(embedding, kT5, "embedding");
  const Tensor e = view_of(embedding, DType::kFloat64);
  return core_call([&] {
    return to_torch(t5_distance_table_f64(e, scale, causal, num_buckets, max_distance, j));
  });
}

class T5TableF64Function : public torch::autograd::Function<T5TableF64Function> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& embedding, int64_t j,
                            bool causal, int64_t num_buckets, int64_t max_distance, double scale) {
    at::Tensor out = t5_f64_forward(embedding, j, causal, num_buckets, max_distance, scale);
    ctx->saved_data["j"] = j;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["num_buckets"] = num_buckets;
    ctx->saved_data["max_distance"] = max_distance;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0].to(at::kDouble);
    at::Tensor ge = core_call([&] {
      return to_torch(t5_backward_distance_table_f64(
          view_of(g, DType::kFloat64), ctx->saved_data["scale"].toDouble(),
          ctx->saved_data["causal"].toBool(), ctx->saved_data["num_buckets"].toInt(),
          ctx->saved_data["max_distance"].toInt(), ctx->saved_data["j"].toInt()));
    });
    return {ge, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace ops {

at::Tensor dpb_distance_table_cpu(at::TensorList params, int64_t j, c10::string_view variant,
                                  bool log_distance, bool norm, double eps) {
  if (all_f64(params)) {
    const DpbF64Args a = dpb_f64_args(params, std::string(variant), log_distance, norm, eps);
    return core_call([&] { return to_torch(dpb_distance_table_f64(a.options, a.state, j)); });
  }
  const DynamicPositionBias m = core_dpb(params, std::string(variant), log_distance, norm, eps);
  return core_call([&] { return result_as(m.distance_table(j), params[0].scalar_type()); });
}

at::Tensor dpb_distance_table(at::TensorList params, int64_t j, c10::string_view variant,
                              bool log_distance, bool norm, double eps) {
  // float64: the core's reference, forward and backward.
  if (all_f64(params)) {
    return DpbTableF64Function::apply(params, j, std::string(variant), log_distance, norm, eps);
  }
  return DpbTableFunction::apply(params, j, std::string(variant), log_distance, norm, eps);
}

at::Tensor t5_distance_table_cpu(const at::Tensor& embedding, int64_t j, bool causal,
                                 int64_t num_buckets, int64_t max_distance, double scale) {
  if (embedding.defined() && embedding.scalar_type() == at::kDouble) {
    return t5_f64_forward(embedding, j, causal, num_buckets, max_distance, scale);
  }
  const RelativePositionBias m = core_t5(embedding, causal, num_buckets, max_distance, scale);
  return core_call([&] { return result_as(m.distance_table(j), embedding.scalar_type()); });
}

at::Tensor t5_distance_table(const at::Tensor& embedding, int64_t j, bool causal,
                             int64_t num_buckets, int64_t max_distance, double scale) {
  if (embedding.defined() && embedding.scalar_type() == at::kDouble) {
    return T5TableF64Function::apply(embedding, j, causal, num_buckets, max_distance, scale);
  }
  return T5TableFunction::apply(embedding, j, causal, num_buckets, max_distance, scale);
}

}  // namespace ops
}  // namespace posbias
