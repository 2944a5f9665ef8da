// Internal: the fused attention kernel (FlashAttention-2 style online
// softmax over query blocks x key blocks). Not installed; the contract and
// argument checks live in include/posbias/attention.h and src/attention.cc.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_

#include <cstdint>

#include "posbias/dtype.h"

namespace posbias::detail {

enum class FusedBias : std::uint8_t { kNone, kAlibi, kTable, kDense };

// Everything is checked by the caller. Strides are in elements.
struct FusedAttentionParams {
  DType dtype = DType::kFloat32;  // of q, k, v and out
  const void* q = nullptr;        // [b, h, i, d]
  const void* k = nullptr;        // [b, hk, j, d]
  const void* v = nullptr;        // [b, hk, j, d]
  std::int64_t q_stride[4] = {};
  std::int64_t k_stride[4] = {};
  std::int64_t v_stride[4] = {};
  std::int64_t b = 0, h = 0, hk = 0, i = 0, j = 0, d = 0;
  float scale = 1.0f;
  bool causal = false;
  FusedBias bias = FusedBias::kNone;
  const float* slopes = nullptr;  // kAlibi: [h]
  // kTable: per head, 2j - 1 contiguous floats in *increasing key* order:
  // entry (c - q_r) + (j - 1) is the bias of row r, column c (the user's
  // table reversed once, so that a row's window is read forwards).
  const float* rtable = nullptr;
  std::int64_t rtable_stride = 0;     // between heads
  const float* dense = nullptr;       // kDense: element [b, h, r, c] at the strides
  std::int64_t dense_stride[4] = {};  // 0 along broadcast dimensions
  void* out = nullptr;                // contiguous [b, h, i, d] of dtype
  // Optional: the natural log of each row's softmax denominator, including
  // its max (the true scores, also for ALiBi rows before the first key);
  // -inf for a row without a finite score. Contiguous [b, h, i].
  float* lse = nullptr;
};

// The whole computation, threaded with OpenMP (best instruction set of this
// CPU).
void fused_attention(const FusedAttentionParams& p);

// Same with explicit block sizes and key split (for tests: small blocks
// exercise every boundary on small shapes). block_q and block_k >= 1;
// splits >= 1 (0 = choose from the thread count).
void fused_attention_blocked(const FusedAttentionParams& p, std::int64_t block_q,
                             std::int64_t block_k, std::int64_t splits);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_
