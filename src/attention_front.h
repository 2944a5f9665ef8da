// Internal: the argument checks and the description of attention calls
// (detail::AttentionParams) shared by the front files src/attention.cc
// (dense calls, their backward) and src/attention_kvcache.cc (packed
// varlen and KV-cache calls, kvcache_append). Every check throws
// std::invalid_argument with the values; none allocates.
#ifndef POSBIAS_SRC_ATTENTION_FRONT_H_
#define POSBIAS_SRC_ATTENTION_FRONT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "kernels/attention_params.h"
#include "posbias/attention.h"
#include "posbias/tensor.h"

namespace posbias::detail {

// A call being described: the parameters and the buffers they point into.
struct AttentionCall {
  const char* who = "";
  const Tensor* q = nullptr;  // for messages
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  AttentionParams p;
  std::vector<float> rtable;             // kTable: reversed, padded, p.rtable points inside
  std::vector<std::int32_t> cu_q, cu_k;  // varlen offsets (contiguous copies)
  std::vector<std::int32_t> seqlen_k;    // KV cache lengths
  std::vector<std::int32_t> blocks;      // KV cache block table, contiguous [b, max_blocks]
  // float64 calls (p.dtype kFloat64): the double description (scale,
  // softcap, bias; the lse and gradient buffers set by the caller) and the
  // double copies it points into. Such calls take the reference path.
  AttentionDouble dbl;
  std::vector<double> slopes64, rtable64;

  // How fail() names the three tensors (kvcache_append: k_new and the caches).
  const char* names[3] = {"q", "k", "v"};

  AttentionCall(const char* who_, const Tensor& q_, const Tensor& k_, const Tensor& v_)
      : who(who_), q(&q_), k(&k_), v(&v_) {}
  AttentionCall(const AttentionCall&) = delete;
  AttentionCall& operator=(const AttentionCall&) = delete;

  // std::invalid_argument "<who>: <what> (q [..], k [..], v [..])", with
  // the tensors called by `names`.
  [[noreturn]] void fail(const std::string& what) const;
};

// The dtype rule: q, k, v of one float dtype (float64 included), or q
// float32 with k and v both bfloat16 or both float16. Sets p.dtype and
// p.kv_dtype.
void check_attention_dtypes(AttentionCall& call);

// d >= 1, h a multiple of hk; the scale (finite); causal, window, softcap
// and, for dense calls, q_offset (default j - i) and the key mask [b, j].
// Ragged calls (varlen, KV cache) refuse q_offset and key_mask. Needs p.b,
// p.h, p.hk, p.i, p.j, p.d set.
void check_attention_options(AttentionCall& call, const AttentionOptions& options, bool ragged);

// The bias against p.b, p.h (and for a dense bias p.i, p.j): slopes h or
// b * h and finite, a float32 table [h, n] with n odd, a broadcastable
// float32 dense bias (refused by ragged calls); in a float64 call the slopes
// may be slopes_f64, the table float64 and the dense bias must be float64.
// Sets the bias fields of p (and of call.dbl) but not the table
// (finish_attention_table).
void check_attention_bias(AttentionCall& call, const AttentionBias& bias, bool ragged);

// The longest |q_pos - k_pos| among the visible (row, key) pairs of the
// call (the causal limit and the window; the key mask is not consulted),
// -1 when no pair is visible. O(rows).
std::int64_t longest_visible_distance(const AttentionParams& p);

// kTable: checks that (n - 1) / 2 covers longest_visible_distance() and
// builds the reversed table p.rtable (call.dbl.rtable in a float64 call; padded so that a kernel
// reading any |rel| <= max(j - 1, centre) plus a vector stays inside). Call after every check of
// the call: it allocates.
void finish_attention_table(AttentionCall& call, const AttentionBias& bias);

// A float64 call's lse is float64, every other call's float32.
DType lse_dtype(const AttentionParams& p);
// Points the call at its forward lse output, or at the backward's saved lse
// (p.lse / p.saved_lse, or call.dbl's in a float64 call).
void set_forward_lse(AttentionCall& call, Tensor& lse);
void set_saved_lse(AttentionCall& call, const Tensor& lse);

// Runs a described forward: the fused kernel, or the reference path when
// `reference` (always for a float64 call, in double).
void run_attention_forward(AttentionCall& call, bool reference);

// The backward of a described call: allocates the bias gradient buffers,
// runs the kernel (the double reference backward for a float64 call) and
// maps the table gradient back to the user's [h, n].
// The caller sets p.saved_out, p.saved_lse, p.dout and their strides, and
// sizes g.grad_q, g.grad_k, g.grad_v.
void run_attention_backward(AttentionCall& call, const AttentionBias& bias, AttentionGradients& g);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_ATTENTION_FRONT_H_
