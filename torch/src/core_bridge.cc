#include "core_bridge.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <memory>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace posbias::torch_bridge {

namespace {

// The core dtype of a torch scalar type the core computes in, if any.
c10::optional<DType> core_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kHalf:
      return DType::kFloat16;
    default:
      return c10::nullopt;
  }
}

}  // namespace

int follow_torch_threads() {
  // at::get_num_threads() first gives this thread torch's count if it has
  // not yet (lazy per-thread init); with torch's OpenMP backend that is
  // already omp_get_max_threads(), with another backend it is not.
  const int n = at::get_num_threads();
#ifdef _OPENMP
  if (n >= 1 && omp_get_max_threads() != n) omp_set_num_threads(n);
  return omp_get_max_threads();
#else
  return n;
#endif
}

DType dtype_of(const at::Tensor& t, const char* who, const char* name) {
  const c10::optional<DType> dt = core_dtype(t.scalar_type());
  TORCH_CHECK_TYPE(dt.has_value(), "posbias.", who, ": ", name,
                   " must be float32, bfloat16 or float16, got ", t.scalar_type());
  return *dt;
}

DType dtype_from_scalar(at::ScalarType s, const char* who) {
  const c10::optional<DType> dt = core_dtype(s);
  TORCH_CHECK_TYPE(dt.has_value(), "posbias.", who,
                   ": dtype must be float32, bfloat16 or float16, got ", s);
  return *dt;
}

at::ScalarType scalar_of(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kInt32:
      return at::kInt;
    case DType::kUInt8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

void check_cpu(const at::Tensor& t, const char* who, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), "posbias.", who, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "posbias.", who, ": ", name,
                    " must be a CPU tensor, got one on ", t.device(),
                    " (posbias is CPU-only: move it with .cpu())");
}

Tensor view_of(const at::Tensor& t, DType dt) {
  auto owner = std::make_shared<at::Tensor>(t);
  return Tensor::from_blob(t.numel() == 0 ? nullptr : t.data_ptr(), t.sizes().vec(),
                           t.strides().vec(), dt, owner);
}

at::Tensor to_torch(const Tensor& t) {
  const at::TensorOptions opt = at::TensorOptions().dtype(scalar_of(t.dtype()));
  if (t.numel() == 0) return at::empty(t.shape(), opt);
  auto* holder = new Tensor(t);
  return torch::from_blob(
      holder->raw_mutable_data(), t.shape(), t.strides(), [holder](void*) { delete holder; }, opt);
}

at::Tensor as_float32(const at::Tensor& t, const char* who, const char* name) {
  check_cpu(t, who, name);
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "posbias.", who, ": ", name,
                   " must be a floating tensor, got ", t.scalar_type());
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

std::vector<float> slope_vector(const at::Tensor& slopes, const char* who) {
  const at::Tensor s = as_float32(slopes, who, "slopes");
  TORCH_CHECK_VALUE(s.dim() == 1, "posbias.", who, ": slopes must be 1-d, got shape ", s.sizes());
  const at::Tensor c = s.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

at::Tensor vector_tensor(const std::vector<float>& v) {
  return torch::tensor(at::ArrayRef<float>(v), at::TensorOptions().dtype(at::kFloat));
}

DType float_dtype_of(const at::Tensor& t, const char* who, const char* name) {
  if (t.scalar_type() == at::kDouble) return DType::kFloat64;
  const c10::optional<DType> dt = core_dtype(t.scalar_type());
  TORCH_CHECK_TYPE(dt.has_value(), "posbias.", who, ": ", name,
                   " must be float32, bfloat16, float16 or float64, got ", t.scalar_type());
  return *dt;
}

Tensor attention_bias_tensor(const at::Tensor& t, bool f64, const char* who, const char* name,
                             at::Tensor* keep) {
  if (!f64) {
    *keep = as_float32(t, who, name);
    return view_of(*keep, DType::kFloat32);
  }
  check_cpu(t, who, name);
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "posbias.", who, ": ", name,
                   " must be a floating tensor, got ", t.scalar_type());
  *keep = t.scalar_type() == at::kDouble ? t : t.to(at::kDouble);
  return view_of(*keep, DType::kFloat64);
}

AttentionBias attention_slopes_bias(const at::Tensor& slopes, bool f64, const char* who) {
  check_cpu(slopes, who, "slopes");
  TORCH_CHECK_TYPE(at::isFloatingType(slopes.scalar_type()), "posbias.", who,
                   ": slopes must be a floating tensor, got ", slopes.scalar_type());
  TORCH_CHECK_VALUE(slopes.dim() == 1 || slopes.dim() == 2, "posbias.", who,
                    ": slopes must be [h] or [b, h], got shape ", slopes.sizes());
  if (!f64) return AttentionBias::alibi(slope_vector(slopes.reshape({-1}), who));
  const at::Tensor s = slopes.to(at::kDouble).contiguous();
  return AttentionBias::alibi_f64(
      std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + s.numel()));
}

Tensor attention_lse_view(const at::Tensor& lse, bool f64, const char* who, at::Tensor* keep) {
  if (!f64) {
    *keep = as_float32(lse, who, "lse");
    return view_of(*keep, DType::kFloat32);
  }
  check_cpu(lse, who, "lse");
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kDouble, "posbias.", who,
                   ": lse must be float64 in a float64 call, got ", lse.scalar_type());
  *keep = lse;
  return view_of(lse, DType::kFloat64);
}

at::Tensor attention_slope_grad(const AttentionGradients& g, bool f64) {
  if (!f64) return vector_tensor(g.grad_slopes);
  return torch::tensor(at::ArrayRef<double>(g.grad_slopes_f64),
                       at::TensorOptions().dtype(at::kDouble));
}

}  // namespace posbias::torch_bridge
