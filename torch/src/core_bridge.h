// Internal to the LibTorch front end (not installed): how torch tensors and
// errors cross into the posbias core and back.
//
// Tensors cross without copies: view_of() makes a posbias::Tensor view of
// torch memory (keeping the torch tensor alive), and to_torch() a torch
// tensor sharing a core tensor's storage (a deleter owns the core tensor).
//
// Errors: arguments are validated once, in the core. core_call() runs a core
// call and translates its exceptions into c10 errors with the core's message,
// so Python sees ValueError for bad values, shapes and sizes
// (std::invalid_argument, std::length_error, std::out_of_range: every
// std::logic_error) and RuntimeError for anything else. What the core cannot
// see (a torch dtype it has no name for, a tensor on another device) is
// checked here: TypeError for a dtype, ValueError for a device.
//
// Threads: core_call() first makes the calling thread's OpenMP thread count
// torch's (follow_torch_threads), so the core's parallel regions use what
// torch.set_num_threads set, or torch's default, on every thread that calls
// an op (a fresh thread's OpenMP default is every CPU, not torch's count).
#ifndef POSBIAS_TORCH_SRC_CORE_BRIDGE_H_
#define POSBIAS_TORCH_SRC_CORE_BRIDGE_H_

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <exception>
#include <stdexcept>
#include <vector>

#include "posbias/attention.h"
#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::torch_bridge {

// Sets this thread's OpenMP thread count (omp_get_max_threads) to torch's
// intra-op thread count (at::get_num_threads); returns the count the core's
// parallel regions now get (omp_get_max_threads).
int follow_torch_threads();

// Runs f() with torch's thread count, turning the core's exceptions into c10 errors (see the file
// comment) whose message is the core's own.
template <typename F>
auto core_call(F&& f) -> decltype(f()) {
  follow_torch_threads();
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::logic_error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The core dtype of a float32 / bfloat16 / float16 tensor; c10::TypeError
// ("posbias.<who>: <name> must be float32, bfloat16 or float16, got ...")
// for any other.
DType dtype_of(const at::Tensor& t, const char* who, const char* name);

// The same for a requested output dtype.
DType dtype_from_scalar(at::ScalarType s, const char* who);

// As dtype_of(), also accepting float64 (kFloat64: the core's reference
// path, in double): for attention's inputs and the distance-table ops.
DType float_dtype_of(const at::Tensor& t, const char* who, const char* name);

at::ScalarType scalar_of(DType dt);

// c10::ValueError unless t is a defined CPU tensor.
void check_cpu(const at::Tensor& t, const char* who, const char* name);

// A core view of a torch tensor (no copy; the torch tensor is kept alive).
Tensor view_of(const at::Tensor& t, DType dt);

// A torch tensor sharing a core tensor's storage (no copy).
at::Tensor to_torch(const Tensor& t);

// A float32 CPU tensor of a floating tensor (a view when it already is one).
at::Tensor as_float32(const at::Tensor& t, const char* who, const char* name);

// The values of a 1-d floating CPU tensor as float32.
std::vector<float> slope_vector(const at::Tensor& slopes, const char* who);

// A float32 1-d tensor holding v.
at::Tensor vector_tensor(const std::vector<float>& v);

// ---------------------------------------------------------------------------
// Attention's float64 path (the core's double reference): what crosses when q
// is float64. Every other call keeps the float32 forms above.

// A table or dense bias for the core: float64 in a float64 call (f64), float32
// otherwise; a converted copy is kept in *keep (the view points into it).
Tensor attention_bias_tensor(const at::Tensor& t, bool f64, const char* who, const char* name,
                             at::Tensor* keep);

// AttentionBias::alibi of [h] or [b, h] slopes (b * h values row-major), or
// alibi_f64 with the slopes in double in a float64 call.
AttentionBias attention_slopes_bias(const at::Tensor& slopes, bool f64, const char* who);

// The forward's lse for a backward: float64 in a float64 call, float32
// otherwise (a converted copy kept in *keep).
Tensor attention_lse_view(const at::Tensor& lse, bool f64, const char* who, at::Tensor* keep);

// The core's slope gradient: float64 (grad_slopes_f64) in a float64 call,
// float32 otherwise; 1-d, one per slope.
at::Tensor attention_slope_grad(const AttentionGradients& g, bool f64);

}  // namespace posbias::torch_bridge

#endif  // POSBIAS_TORCH_SRC_CORE_BRIDGE_H_
