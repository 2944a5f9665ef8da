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

/// Output element type. Slopes and every intermediate stay float32 whatever
/// the output dtype (FlashAttention #846: casting a module must not cast its
/// slopes).
enum class DType : std::uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

/// Bytes per element: 4 for kFloat32, 2 for the 16-bit types.
constexpr std::size_t dtype_size(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 2;
}

/// "float32", "bfloat16" or "float16" (PyTorch's names without `torch.`).
std::string dtype_name(DType dtype);

/// Parses "float32"/"f32"/"float", "bfloat16"/"bf16", "float16"/"f16"/"half".
/// Throws std::invalid_argument naming the bad string and the accepted ones.
DType parse_dtype(const std::string& name);

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
inline float to_float(bfloat16 x) {
  return bits_float(static_cast<std::uint32_t>(x.bits) << 16);
}

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
