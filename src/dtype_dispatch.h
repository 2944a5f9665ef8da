// Internal: one place for what the library does with a dtype it holds as a
// value: an element read or written as double, and a call templated on the
// element type of a float dtype. (The vector kernels compiled per
// instruction set have their own VisitKvType in attention_blocks-inl.h: a
// lambda compiled for AVX-512 is not inlined into a template compiled for
// the baseline, which this one is.)
#ifndef POSBIAS_SRC_DTYPE_DISPATCH_H_
#define POSBIAS_SRC_DTYPE_DISPATCH_H_

#include <cstdint>

#include "checks.h"
#include "posbias/dtype.h"

namespace posbias::detail {

// Element `index` of an array of `dtype` as double: float32, bfloat16 and
// float16 widened exactly, int32 and uint8 / bool as their values.
double load_element(const void* base, DType dtype, std::int64_t index);

// Element `index` of an array of `dtype` set to v: float32, bfloat16 and
// float16 through float32 (each conversion to nearest even), float64 as it
// is, int32 and uint8 rounded to nearest and clamped to their range (NaN as
// 0), bool as v != 0.
void store_element(void* base, DType dtype, std::int64_t index, double v);

// f(T()) with T the element type of a float dtype: float for float32,
// bfloat16, float16. Any other dtype (float64 included) throws
// unsupported_dtype(what, dtype) (the callers check dtypes first).
template <class F>
inline decltype(auto) with_float_type(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float());
    case DType::kBFloat16:
      return f(bfloat16());
    case DType::kFloat16:
      return f(float16());
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kBool:
      break;
  }
  unsupported_dtype(what, dtype);
}

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_DTYPE_DISPATCH_H_
