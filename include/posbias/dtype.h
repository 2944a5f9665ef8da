// Element types of posbias outputs, and exact float32 <-> bfloat16/float16
// conversions.
//
// Every posbias result is computed in float32 and, for a 16-bit output dtype,
// rounded once, to nearest with ties to even (the IEEE default, and what
// PyTorch's `tensor.to(torch.bfloat16 / torch.float16)` does). Values beyond
// the range of float16 (|x| >= 65520) become +-infinity, as in PyTorch;
// bfloat16 has float32's range and never overflows from a finite value.
#ifndef POSBIAS_DTYPE_H_
#define POSBIAS_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

namespace posbias {

/// Element type of a Tensor.
///
/// The three float types kFloat32, kBFloat16 and kFloat16 are the output
/// dtypes of posbias: every result is computed in float32 and rounded once.
/// Slopes and every intermediate stay float32 whatever the output dtype
/// (FlashAttention #846: casting a module must not cast its slopes).
/// kFloat64 is accepted where a call says so (the reference paths compute in
/// double). The integer types are for index and mask inputs: kInt32 for
/// cu_seqlens, cache_seqlens and block tables, kUInt8 and kBool (one byte,
/// 0 or 1, PyTorch's torch.bool) for key masks; they are never outputs.
enum class DType : std::uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kUInt8 = 5,
  kBool = 6,
};

/// Bytes per element: 8 for kFloat64, 4 for kFloat32 and kInt32, 2 for the
/// 16-bit types, 1 for kUInt8 and kBool.
constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 4;
}

/// True for the output dtypes: float32, bfloat16 and float16.
constexpr bool is_output_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

/// PyTorch's name without `torch.`: "float32", "bfloat16", "float16",
/// "float64", "int32", "uint8" or "bool".
std::string dtype_name(DType dtype);

/// Parses an output dtype: "float32"/"f32"/"float", "bfloat16"/"bf16",
/// "float16"/"f16"/"half". Throws std::invalid_argument naming the bad string
/// and the accepted ones (the other dtypes are not output dtypes).
DType parse_dtype(const std::string& name);

/// Throws std::invalid_argument "<what>: dtype <name> is not an output dtype
/// (expected float32, bfloat16 or float16)" unless is_output_dtype(dtype).
void check_output_dtype(DType dtype, const std::string& what);

/// As check_output_dtype(), also accepting kFloat64 (the calls whose float64
/// output is computed on the reference path, in double): "<what>: dtype
/// <name> is not a float dtype (expected float32, bfloat16, float16 or
/// float64)".
void check_float_dtype(DType dtype, const std::string& what);

/// A bfloat16 value stored as its 16 bits (the top half of a float32).
struct bfloat16 {
  std::uint16_t bits;
};

/// An IEEE 754 binary16 value stored as its 16 bits.
struct float16 {
  std::uint16_t bits;
};

/// The bits of a float32.
inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// The float32 with the given bits.
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline bfloat16 to_bfloat16(float x) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  u += 0x7FFFu + ((u >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>(u >> 16)};
}

/// bfloat16 -> float32 (exact).
inline float to_float(bfloat16 x) { return bits_float(static_cast<std::uint32_t>(x.bits) << 16); }

/// float32 -> float16, round to nearest even, overflow to +-inf, subnormals
/// rounded correctly, NaN stays a (quiet) NaN.
inline float16 to_float16(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7FFFFFFFu;
  std::uint32_t h;
  if (a > 0x7F800000u) {
    h = 0x7E00u;  // NaN
  } else if (a >= 0x477FF000u) {
    h = 0x7C00u;  // rounds to a value >= 65520: infinity
  } else if (a < 0x38800000u) {
    // Below 2^-14: float16 subnormal (or zero). Adding 0.5 aligns the
    // mantissa so that the float32 adder performs the round-to-nearest-even.
    const float f = bits_float(a) + 0.5f;
    h = float_bits(f) - 0x3F000000u;
  } else {
    const std::uint32_t odd = (a >> 13) & 1u;
    a += 0xC8000FFFu + odd;  // rebias exponent (-112 << 23) and round
    h = a >> 13;
  }
  return float16{static_cast<std::uint16_t>(h | sign)};
}

/// float16 -> float32 (exact).
inline float to_float(float16 x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exp = (x.bits >> 10) & 0x1Fu;
  const std::uint32_t mant = x.bits & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24, exact in float32.
    const float v = static_cast<float>(mant) * bits_float(0x33800000u);
    return bits_float(sign | float_bits(v));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace posbias

#endif  // POSBIAS_DTYPE_H_
