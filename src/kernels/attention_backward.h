// Internal: the recomputing backward of the fused attention (FlashAttention-2
// style). Not installed; the contract and checks live in
// include/posbias/attention.h and src/attention.cc.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_

#include <cstdint>

#include "kernels/attention_params.h"

namespace posbias::detail {

// The whole backward: reads q, k, v, the bias, saved_out, saved_lse and dout
// of p; writes dq, dk, dv and the wanted bias gradients. Honours every
// option of AttentionParams: q_offset, causal, the window (key blocks outside
// the band are skipped), softcap, key_mask (masked keys are never read and
// get zero gradient), slopes per head or per sequence, the centred table, and
// packed (varlen) calls. Dense key layout only (no paged backward).
//
// Output layouts, all contiguous in p.dtype (dk, dv in p.kv_dtype):
//   dense:  dq [b, h, i, d], dk and dv [b, hk, j, d], ddense [b, h, i, j];
//   varlen: dq [total_q, h, d], dk and dv [total_k, hk, d] (token-major, as
//           the inputs), where total_q = cu_q[b], total_k = cu_k[b];
//   dslopes as the slopes ([h] with slopes_seq_stride 0, [b, h] with h);
//   dtable [h, 2 table_centre + 1] in the user's table order.
// Inputs saved_out, dout, saved_lse at their strides, dimension 2 being the
// token (row) dimension of varlen calls (dimension 0 then has stride 0; the
// varlen lse [h, total_q] is strides {0, total_q, 1}).
//
// Threaded with OpenMP over (sequence, query head) tasks, the longest
// sequences first; the result does not depend on the thread count.
void attention_backward_kernel(const AttentionParams& p);

// Same with explicit block sizes (tests: small blocks exercise every
// boundary on small shapes). block_q >= 1, block_k >= 1.
void attention_backward_blocked(const AttentionParams& p, std::int64_t block_q,
                                std::int64_t block_k);

// (query block, key block) pairs of the backward skipped because every P
// of the rows that see the block is exactly 0 (attention_backward.cc,
// "Flushed blocks"), counted over the process's calls: the results are the
// same bits either way, so this is how the tests see the skip.
std::int64_t backward_flushed_blocks();
void count_backward_flushed_blocks(std::int64_t blocks);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_BACKWARD_H_
