// Internal: the recomputing backward of the fused attention (FlashAttention-2
// style). Not installed; the contract and checks live in
// include/posbias/attention.h and src/attention.cc.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_

#include <cstdint>

#include "kernels/attention_params.h"

namespace posbias::detail {

// The whole backward: reads q, k, v, the bias, saved_out, saved_lse and dout
// of p; writes dq, dk, dv and the wanted bias gradients. Threaded with
// OpenMP over (b, h).
void attention_backward_kernel(const AttentionParams& p);

// Same with explicit block sizes (tests: small blocks exercise every
// boundary on small shapes). block_q >= 1, block_k >= 1.
void attention_backward_blocked(const AttentionParams& p, std::int64_t block_q,
                                std::int64_t block_k);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
