// Internal: the plain, double-accumulated reference path of every attention
// call (dense, packed varlen, KV cache), behind attention_reference(),
// attention_varlen_reference() and attention_kvcache_reference(). Defined in
// src/attention_reference.cc; src/attention.cc checks the arguments and
// describes the call (detail::AttentionParams) before calling it.
#ifndef POSBIAS_SRC_ATTENTION_REFERENCE_H_
#define POSBIAS_SRC_ATTENTION_REFERENCE_H_

#include "kernels/attention_params.h"

namespace posbias::detail {

// Computes the call p describes, one row at a time in double: for each
// sequence s (sequence(p, s)), query head x and row r, the scores of the
// visible keys (visible_keys, the key mask), softcap then bias (slope_of,
// table_index into p.rtable, p.dense), softmax, product with v. Reads q, k, v
// in their dtypes (p.dtype, p.kv_dtype) at their strides and layout
// (p.key_layout: dense or paged through p.block_table). Writes p.out at
// p.out_stride in p.dtype (rounded once) and, when p.lse is not null, the
// row's natural-log softmax denominator at p.lse_stride (-inf for a row that
// sees no key, whose out row is zeros). Rows of a sequence are placed at
// q_row0 + r of the token dimension (dimension 2 of the strides), sequence
// s at dimension 0. Threads: OpenMP over rows; no allocation above O(j + d)
// per thread.
void attention_reference_run(const AttentionParams& p);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_ATTENTION_REFERENCE_H_
