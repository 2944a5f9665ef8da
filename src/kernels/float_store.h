// Internal: float32 -> dtype stores, the one copy for every kernel (the
// attention output and gradients, the expanded bias tables, the ALiBi
// fill's row ends). Each value is rounded once, to nearest even.
#ifndef POSBIAS_SRC_KERNELS_FLOAT_STORE_H_
#define POSBIAS_SRC_KERNELS_FLOAT_STORE_H_

#include <cstddef>
#include <cstring>

#include "checks.h"
#include "dtype_dispatch.h"
#include "kernels/float_to.h"
#include "posbias/dtype.h"

namespace posbias::detail {

template <typename T>
inline void store_floats_as(const float* src, std::size_t n, float mul, T* dst) {
  for (std::size_t x = 0; x < n; ++x) dst[x] = float_to<T>(src[x] * mul);
}

// dst[x] = mul * src[x] as dtype for x in [0, n) (mul == 1: the values
// themselves, copied bit for bit when dtype is float32). The callers check
// dtypes first; any other dtype throws std::invalid_argument.
inline void store_floats(const float* src, std::size_t n, float mul, DType dtype, void* dst) {
  if (dtype == DType::kFloat32 && mul == 1.0f) {
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  with_float_type(dtype, "float store", [&](auto tag) {
    store_floats_as(src, n, mul, static_cast<decltype(tag)*>(dst));
  });
}

// The same at element `offset` of a dtype array (a row of a larger tensor).
inline void store_floats_at(const float* src, std::size_t n, float mul, DType dtype, void* base,
                            std::size_t offset) {
  store_floats(src, n, mul, dtype, static_cast<char*>(base) + offset * dtype_size(dtype));
}

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_FLOAT_STORE_H_
