#include "posbias/dtype.h"

#include <stdexcept>

#include "posbias/limits.h"

namespace posbias {

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kUInt8:
      return "uint8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "float") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float16" || name == "f16" || name == "half") return DType::kFloat16;
  throw std::invalid_argument("unknown dtype " + quoted_name(name) +
                              " (expected float32, bfloat16 or float16)");
}

void check_output_dtype(DType dtype, const std::string& what) {
  if (is_output_dtype(dtype)) return;
  throw std::invalid_argument(what + ": dtype " + dtype_name(dtype) +
                              " is not an output dtype (expected float32, bfloat16 or float16)");
}

void check_float_dtype(DType dtype, const std::string& what) {
  if (is_output_dtype(dtype) || dtype == DType::kFloat64) return;
  throw std::invalid_argument(
      what + ": dtype " + dtype_name(dtype) +
      " is not a float dtype (expected float32, bfloat16, float16 or float64)");
}

}  // namespace posbias
