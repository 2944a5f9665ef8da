// Internal: the recomputing backward of the fused attention (FlashAttention-2
// style). Not installed; the contract and checks live in
// include/posbias/attention.h and src/attention.cc.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_

#include <cstdint>

#include "kernels/attention_fused.h"
#include "posbias/dtype.h"

namespace posbias::detail {

// Everything is checked by the caller. Strides are in elements.
struct AttentionBackwardParams {
  DType dtype = DType::kFloat32;  // of q, k, v, out, dout and dq, dk, dv
  const void* q = nullptr;        // [b, h, i, d]
  const void* k = nullptr;        // [b, hk, j, d]
  const void* v = nullptr;        // [b, hk, j, d]
  const void* out = nullptr;      // [b, h, i, d]
  const void* dout = nullptr;     // [b, h, i, d]
  std::int64_t q_stride[4] = {};
  std::int64_t k_stride[4] = {};
  std::int64_t v_stride[4] = {};
  std::int64_t out_stride[4] = {};
  std::int64_t dout_stride[4] = {};
  const float* lse = nullptr;  // [b, h, i] at lse_stride
  std::int64_t lse_stride[3] = {};
  std::int64_t b = 0, h = 0, hk = 0, i = 0, j = 0, d = 0;
  float scale = 1.0f;
  bool causal = false;
  FusedBias bias = FusedBias::kNone;
  const float* slopes = nullptr;  // kAlibi: [h]
  // kTable: as FusedAttentionParams::rtable (reversed, increasing key order,
  // padded by at least 16 floats per head).
  const float* rtable = nullptr;
  std::int64_t rtable_stride = 0;
  const float* dense = nullptr;  // kDense: element [b, h, r, c] at the strides
  std::int64_t dense_stride[4] = {};
  // Outputs: dq [b, h, i, d], dk and dv [b, hk, j, d], contiguous, dtype.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dtable = nullptr;   // kTable: [h, 2j - 1] contiguous (table order), or null
  float* dslopes = nullptr;  // kAlibi: [h], or null
  float* ddense = nullptr;   // kDense: [b, h, i, j] contiguous, or null
};

// The whole backward, threaded with OpenMP over (b, h).
void attention_backward_kernel(const AttentionBackwardParams& p);

// Same with explicit block sizes (tests: small blocks exercise every
// boundary on small shapes). block_q >= 1; block_k >= 1 and a multiple of 16.
void attention_backward_blocked(const AttentionBackwardParams& p, std::int64_t block_q,
                                std::int64_t block_k);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
