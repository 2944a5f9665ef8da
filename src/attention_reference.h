// Internal: the plain, double-accumulated reference path of every attention
// call (dense, packed varlen, KV cache), behind attention_reference(),
// attention_varlen_reference() and attention_kvcache_reference(), and the
// whole float64 path (forward and backward). Defined in
// src/attention_reference.cc and src/attention_backward_reference.cc;
// src/attention.cc checks the arguments and describes the call
// (detail::AttentionParams) before calling it.
#ifndef POSBIAS_SRC_ATTENTION_REFERENCE_H_
#define POSBIAS_SRC_ATTENTION_REFERENCE_H_

#include <cstdint>

#include "kernels/attention_params.h"
#include "posbias/dtype.h"

namespace posbias::detail {

// A float64 call (p.dtype == kFloat64): what AttentionParams holds in
// float32 (the kernels' description), here in double. The float pointers of
// p for the bias, the lse and the bias gradients are then unused.
struct AttentionDouble {
  double scale = 1.0;                 // replaces p.scale (1 / sqrt(d) in double by default)
  double softcap = 0.0;               // replaces p.softcap
  const double* slopes = nullptr;     // kAlibi, indexed as p.slopes
  const double* rtable = nullptr;     // kTable, laid out as p.rtable
  const double* dense = nullptr;      // kDense, at p.dense_stride
  double* lse = nullptr;              // forward, at p.lse_stride (null: not wanted)
  const double* saved_lse = nullptr;  // backward, at p.saved_lse_stride
  // Backward outputs (null: not wanted), laid out as p.dslopes, p.dtable
  // ([h, 2 table_centre + 1] in the user's table order) and p.ddense.
  double* dslopes = nullptr;
  double* dtable = nullptr;
  double* ddense = nullptr;
};

// The row helpers shared by the forward and the backward reference.
// An element of q, k, v or an out-like tensor is read as load_element
// (dtype_dispatch.h) reads it: widened exactly to double.
// Offset of key c of sequence s (sq = sequence(p, s)), kv head kvh, element 0
// in a k- or v-like tensor with the given strides (dense or paged layout).
std::int64_t reference_key_offset(const AttentionParams& p, const Sequence& sq, std::int64_t s,
                                  std::int64_t kvh, std::int64_t c, const std::int64_t* stride);
// True when the key mask hides key c of sequence s.
bool reference_key_masked(const AttentionParams& p, std::int64_t s, std::int64_t c);
// The score of row r (position qpos) of sequence s, query head x, against
// key c (softcap, then the bias; dbl's scale, softcap and double bias when
// given, else p's), and dcap = d score / d (scale q.k) (1 without softcap).
struct ReferenceScore {
  double score = 0.0;
  double dcap = 1.0;
};
ReferenceScore reference_score(const AttentionParams& p, const AttentionDouble& dbl,
                               const Sequence& sq, std::int64_t s, std::int64_t x, std::int64_t r,
                               std::int64_t qpos, std::int64_t c);

// Computes the call p describes, one row at a time in double: for each
// sequence s (sequence(p, s)), query head x and row r, the scores of the
// visible keys (visible_keys, the key mask), softcap then bias (slope_of,
// table_index into p.rtable, p.dense; dbl's when dbl is given), softmax,
// product with v. Reads q, k, v in their dtypes (p.dtype, p.kv_dtype, float64
// included) at their strides and layout (p.key_layout: dense or paged through
// p.block_table). Writes p.out at p.out_stride in p.dtype (rounded once; a
// float64 output is the double itself) and, when p.lse (dbl->lse) is not
// null, the row's natural-log softmax denominator at p.lse_stride (-inf for a
// row that sees no key, whose out row is zeros). Rows of a sequence are placed
// at q_row0 + r of the token dimension (dimension 2 of the strides), sequence
// s at dimension 0. Threads: OpenMP over rows; no allocation above O(j + d)
// per thread.
void attention_reference_run(const AttentionParams& p, const AttentionDouble* dbl = nullptr);

// The backward of a float64 call in double (dense or packed varlen; dense key
// layout): reads q, k, v, p.saved_out, p.dout (float64, at their strides) and
// dbl.saved_lse; writes p.dq, p.dk, p.dv (float64, contiguous: dense
// [b, h, i, d] and [b, hk, j, d], varlen [total_q, h, d] and [total_k, hk, d])
// and the wanted bias gradients of dbl. Per row: the scores of the visible
// keys, P = exp(S - lse), dP = dO v, dS = P (dP - dO.out), through softcap's
// derivative to dQ and dK, P dO to dV. Threads: OpenMP over (sequence, kv
// head) tasks, each owning its dK and dV rows and its query heads' dQ; the
// slope and table gradients go through per-sequence partials summed in
// sequence order, so the result does not depend on the thread count. Memory:
// O(j + d) per thread, plus O(b h n) for a table gradient.
void attention_backward_reference(const AttentionParams& p, const AttentionDouble& dbl);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_ATTENTION_REFERENCE_H_
