#include "posbias/dtype.h"

#include <stdexcept>

namespace posbias {

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "float") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float16" || name == "f16" || name == "half") return DType::kFloat16;
  throw std::invalid_argument("unknown dtype '" + name +
                              "' (expected float32, bfloat16 or float16)");
}

}  // namespace posbias
