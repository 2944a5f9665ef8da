// Internal: one float32 value as float, bfloat16 or float16, rounded once
// to nearest even: the element conversion behind float_store.h's row
// stores and kvcache_append's rows.
#ifndef POSBIAS_SRC_KERNELS_FLOAT_TO_H_
#define POSBIAS_SRC_KERNELS_FLOAT_TO_H_

#include "posbias/dtype.h"

namespace posbias::detail {

// v as T (float, bfloat16 or float16).
template <typename T>
inline T float_to(float v);
template <>
inline float float_to<float>(float v) {
  return v;
}
template <>
inline bfloat16 float_to<bfloat16>(float v) {
  return to_bfloat16(v);
}
template <>
inline float16 float_to<float16>(float v) {
  return to_float16(v);
}

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_FLOAT_TO_H_
