// Internal, per instruction set: the register-tiled GEMM of the Dynamic
// Position Bias MLP (dpb_mlp.cc), forward and backward. Every output is
// `init + sum_k a_k w_k` with fused multiply-adds in increasing k, whatever
// tile its row falls in (Tile4 or Tile1), which is what makes a row's value
// independent of its neighbours. Everything here is inline; only dpb_mlp.cc
// includes it. Names are unique across src/kernels (every kernel file shares
// HWY_NAMESPACE; a clash of inline members is an ODR violation).

// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_DPB_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_DPB_GEMM_INL_H_
#undef POSBIAS_SRC_KERNELS_DPB_GEMM_INL_H_
#else
#define POSBIAS_SRC_KERNELS_DPB_GEMM_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;  // the kernels of dpb_mlp.cc use these too
using VF = hn::Vec<DF>;

enum class Init { kZero, kBias, kAccumulate };

HWY_INLINE VF InitVec(DF d, Init init, const float* HWY_RESTRICT bias,
                      const float* HWY_RESTRICT c_row) {
  switch (init) {
    case Init::kBias:
      return hn::Load(d, bias);
    case Init::kAccumulate:
      return hn::Load(d, c_row);
    case Init::kZero:
      break;
  }
  return hn::Zero(d);
}

// A 4-row x 2-vector tile of C at column c (see Gemm).
HWY_INLINE void Tile4(DF d, const float* HWY_RESTRICT a, std::int64_t sar, std::int64_t sak,
                      std::int64_t kk, const float* HWY_RESTRICT b, std::int64_t ldb,
                      const float* HWY_RESTRICT bias, Init init, float* HWY_RESTRICT c,
                      std::int64_t ldc, std::int64_t col) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  const float* bias0 = bias ? bias + col : nullptr;
  const float* bias1 = bias ? bias + col + n : nullptr;
  VF c00 = InitVec(d, init, bias0, c + col);
  VF c01 = InitVec(d, init, bias1, c + col + n);
  VF c10 = InitVec(d, init, bias0, c + ldc + col);
  VF c11 = InitVec(d, init, bias1, c + ldc + col + n);
  VF c20 = InitVec(d, init, bias0, c + 2 * ldc + col);
  VF c21 = InitVec(d, init, bias1, c + 2 * ldc + col + n);
  VF c30 = InitVec(d, init, bias0, c + 3 * ldc + col);
  VF c31 = InitVec(d, init, bias1, c + 3 * ldc + col + n);
  for (std::int64_t k = 0; k < kk; ++k) {
    const VF b0 = hn::Load(d, b + k * ldb + col);
    const VF b1 = hn::Load(d, b + k * ldb + col + n);
    const float* ak = a + k * sak;
    const VF a0 = hn::Set(d, ak[0]);
    c00 = hn::MulAdd(a0, b0, c00);
    c01 = hn::MulAdd(a0, b1, c01);
    const VF a1 = hn::Set(d, ak[sar]);
    c10 = hn::MulAdd(a1, b0, c10);
    c11 = hn::MulAdd(a1, b1, c11);
    const VF a2 = hn::Set(d, ak[2 * sar]);
    c20 = hn::MulAdd(a2, b0, c20);
    c21 = hn::MulAdd(a2, b1, c21);
    const VF a3 = hn::Set(d, ak[3 * sar]);
    c30 = hn::MulAdd(a3, b0, c30);
    c31 = hn::MulAdd(a3, b1, c31);
  }
  hn::Store(c00, d, c + col);
  hn::Store(c01, d, c + col + n);
  hn::Store(c10, d, c + ldc + col);
  hn::Store(c11, d, c + ldc + col + n);
  hn::Store(c20, d, c + 2 * ldc + col);
  hn::Store(c21, d, c + 2 * ldc + col + n);
  hn::Store(c30, d, c + 3 * ldc + col);
  hn::Store(c31, d, c + 3 * ldc + col + n);
}

// One row of the same: the same operations in the same order as each row of
// Tile4, so a value never depends on which tile its row fell into.
HWY_INLINE void Tile1(DF d, const float* HWY_RESTRICT a, std::int64_t sak, std::int64_t kk,
                      const float* HWY_RESTRICT b, std::int64_t ldb, const float* HWY_RESTRICT bias,
                      Init init, float* HWY_RESTRICT c, std::int64_t col) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  VF c0 = InitVec(d, init, bias ? bias + col : nullptr, c + col);
  VF c1 = InitVec(d, init, bias ? bias + col + n : nullptr, c + col + n);
  for (std::int64_t k = 0; k < kk; ++k) {
    const VF b0 = hn::Load(d, b + k * ldb + col);
    const VF b1 = hn::Load(d, b + k * ldb + col + n);
    const VF a0 = hn::Set(d, a[k * sak]);
    c0 = hn::MulAdd(a0, b0, c0);
    c1 = hn::MulAdd(a0, b1, c1);
  }
  hn::Store(c0, d, c + col);
  hn::Store(c1, d, c + col + n);
}

// C[r][c] = init + sum_{k < kk} A(r, k) * B[k][c] for r < rows, c < cols,
// where A(r, k) = a[r * sar + k * sak] (strides let one routine take A or
// A^T), B rows are ldb apart, init is bias[c], zero or C's own value. cols,
// ldb and ldc are multiples of two vectors; B, C and bias vector-aligned.
HWY_INLINE void Gemm(const float* a, std::int64_t sar, std::int64_t sak, std::int64_t rows, std::int64_t kk,
          const float* b, std::int64_t ldb, const float* bias, Init init, float* c,
          std::int64_t ldc, std::int64_t cols) {
  const DF d;
  const std::int64_t pair = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t col = 0; col < cols; col += pair) {
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      Tile4(d, a + r * sar, sar, sak, kk, b, ldb, bias, init, c + r * ldc, ldc, col);
    }
    for (; r < rows; ++r) {
      Tile1(d, a + r * sar, sak, kk, b, ldb, bias, init, c + r * ldc, col);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_DPB_GEMM_INL_H_ toggle
