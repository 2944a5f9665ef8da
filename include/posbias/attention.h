// Attention with a positional bias, fused: the bias is computed inside the
// kernel and the [h, i, j] score matrix is never materialised.
//
//   out = softmax(scale * q k^T + bias, mask) v      (softmax over keys)
//
// Shapes: q [b, h, i, d], k and v [b, hk, j, d] with h % hk == 0
// (grouped-query: query head x reads kv head x / (h / hk)); out [b, h, i, d].
// Any strides (Tensor views), so a [b, len, h, d] buffer is passed without a
// copy as `x.transpose(1, 2)`.
//
// Positions (bottom-right alignment, as in x-transformers and
// FlashAttention-2): the query of row r sits at q_r = j - i + r, the key of
// column c at c. So a decode step (i = 1) against j cached keys is the last
// position, and a chunk of i queries (chunked prefill) is the last i.
//
// Causal: key c is visible to row r iff c <= q_r. A row that sees no key
// (i > j makes q_r < 0 for the first i - j rows) outputs zeros.
//
//   posbias::Tensor q = ..., k = ..., v = ...;   // [1, 8, 128, 64] each
//   posbias::AttentionOptions opt;
//   opt.causal = true;
//   posbias::Tensor out = posbias::attention_forward(
//       q, k, v, posbias::AttentionBias::alibi(posbias::alibi_slopes(8)), opt);
#ifndef POSBIAS_ATTENTION_H_
#define POSBIAS_ATTENTION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "posbias/tensor.h"

namespace posbias {

/// Which additive bias AttentionBias holds.
enum class AttentionBiasKind : std::uint8_t {
  kNone,           ///< no bias
  kAlibi,          ///< -slope[h] * |c - q_r|
  kDistanceTable,  ///< table[h][(q_r - c) + (j - 1)] (DPB, T5 buckets, any Toeplitz bias)
  kDense,          ///< any tensor broadcastable to [b, h, i, j]
};

/// The additive positional bias of attention_forward(). Build it with one of
/// the static functions; only the member of its kind is read.
struct AttentionBias {
  AttentionBiasKind kind = AttentionBiasKind::kNone;
  /// kAlibi: h finite float32 slopes (never cast to a 16-bit input dtype);
  /// bias[h][r][c] = -slopes[h] * |c - q_r|.
  std::vector<float> slopes;
  /// kDistanceTable: float32 [h, n] with n >= 2j - 1 (any strides);
  /// bias[h][r][c] = table[h][(q_r - c) + (j - 1)], entries past 2j - 2 unused.
  /// Non-causal attention then needs i <= j (otherwise rows with q_r < 0 would
  /// read before the table).
  Tensor table;
  /// kDense: float32, at most 4 dimensions, broadcastable to [b, h, i, j]
  /// (right-aligned like PyTorch; size-1 or missing dimensions broadcast);
  /// any strides. Use it for padding masks (-inf) or learned biases.
  Tensor dense;

  /// No bias.
  static AttentionBias none();
  /// ALiBi with the given per-head slopes (e.g. alibi_slopes(h)).
  static AttentionBias alibi(std::vector<float> slopes);
  /// A per-head table indexed by relative distance (see `table`).
  static AttentionBias distance_table(Tensor table);
  /// A dense additive bias (see `dense`).
  static AttentionBias dense_bias(Tensor bias);
};

/// Options of attention_forward() and attention_reference().
struct AttentionOptions {
  /// Multiplies q k^T; must be finite. Default 1 / sqrt(d).
  std::optional<float> scale;
  /// Mask key c for row r when c > q_r = j - i + r.
  bool causal = false;
};

/// Fused attention with a positional bias (FlashAttention-2 style).
///
/// q [b, h, i, d], k and v [b, hk, j, d] (h % hk == 0), any strides; all
/// three float32, bfloat16 or float16 (the same dtype). Returns
/// out [b, h, i, d], contiguous, in q's dtype. d >= 1; b, h, i, j >= 0.
///
/// Algorithm: query blocks x key blocks with an online softmax (running
/// max, running sum, rescaled float32 accumulator); ALiBi is added as the
/// block product q k^T is stored (no pass of its own), a distance table or
/// dense bias in the pass that masks and takes the row max. ALiBi is computed
/// from the integer
/// distance of each element (exact in float32 up to 2^24 positions; the
/// cheaper "+slope * c" form of causal ALiBi is not used because at long j
/// it rounds the scores to the ulp of slope * j). Causal key blocks
/// entirely above the diagonal are skipped; only blocks that cross it are
/// masked element by element. Masked keys are never read for a row, so a
/// NaN in a masked key or value does not reach it.
///
/// Numerics: inputs are converted to float32 (exactly) and everything is
/// accumulated in float32; a 16-bit output is rounded once. Agrees with
/// attention_reference() to about 1e-5 + 1e-4 |out|. NaN or inf in q, k, v
/// or the bias propagates to the rows whose visible keys it touches.
///
/// A row whose visible keys all score -inf (e.g. a dense -inf padding mask)
/// outputs zeros, like a row that sees no key (PyTorch would give NaN).
/// A -inf bias entry is a score, not a mask: the key is still read, so a NaN
/// in its k or v row still reaches the row (as in PyTorch; ggml's CPU path
/// skips such keys). Only causal masking leaves keys unread; a KV
/// cache with uninitialised slots should pass j up to the filled length.
///
/// Threads: OpenMP over (b, h, query block); when there are fewer of those
/// than threads (decode, i small), the keys are split across threads and
/// the partial softmax states merged. Grouped-query decode (i <= 4,
/// hk < h): one task serves up to 32 rows (query heads of one kv head x
/// query rows), so each key and value row is read once for all of them. The block sizes and that split follow
/// omp_get_max_threads(), so results may differ in the last bits between
/// thread counts (always within the tolerance above); for a given thread
/// count they are deterministic. Safe to call from many threads at once.
///
/// Cost: O(b h i j d) flops (about half for causal i = j); memory
/// O(b h i d) for the output, O(h j) for a distance table, and per thread
/// the float32 packing of one kv head's K^T and V (skipped above 32 MiB)
/// plus small block buffers: never O(i j).
///
/// Errors: std::invalid_argument with the shapes in the message for
/// mismatched ranks, batch, head or length extents or d, h % hk != 0,
/// d = 0, mixed dtypes, a non-finite scale, a slope count other than h,
/// non-finite slopes, a table shorter than 2j - 1 or with a head count other
/// than h, a dense bias that does not broadcast or is not float32.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionBias& bias = AttentionBias::none(),
                         const AttentionOptions& options = {});

/// attention_forward() and the per-row log-sum-exp of the softmax.
struct AttentionForwardResult {
  Tensor out;  ///< [b, h, i, d] in q's dtype, as attention_forward()
  /// float32 [b, h, i]: lse[b][h][r] = ln(sum over visible c of
  /// exp(scale q_r.k_c + bias[r][c])), the natural log of the softmax
  /// denominator including the row max; -inf for a row that sees no key or
  /// whose visible scores are all -inf. What a FlashAttention-style backward
  /// (attention_backward) and a merge of key-split softmax states need:
  /// lse = logaddexp(lse1, lse2), out = out1 e^(lse1 - lse) + out2 e^(lse2 - lse).
  Tensor lse;
};

/// As attention_forward() (same contract, checks, cost and numerics), also
/// returning the log-sum-exp of every row. The lse is that of the true
/// scores for every bias kind (including ALiBi rows before the first key);
/// accurate to float32 rounding of the max plus about 1e-6 relative.
AttentionForwardResult attention_forward_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionBias& bias = AttentionBias::none(),
                                             const AttentionOptions& options = {});

/// Gradients of attention with respect to its inputs (see attention_backward).
struct AttentionGradients {
  Tensor grad_q;  ///< [b, h, i, d] in q's dtype
  Tensor grad_k;  ///< [b, hk, j, d] in k's dtype (summed over the query heads of a kv head)
  Tensor grad_v;  ///< [b, hk, j, d] in v's dtype (likewise)
  /// kDistanceTable: float32 [h, n] with the table's n (entries past 2j - 2
  /// and those no visible (row, key) pair reads are zero): the sum over the
  /// batch and over each diagonal (q_r - c constant) of dS = dL/dscore.
  /// Empty for the other kinds.
  Tensor grad_table;
  /// kDense: float32 in the dense bias's shape: dS summed over the
  /// broadcast dimensions. Empty for the other kinds.
  Tensor grad_dense;
  /// kAlibi: float32 [h], dL/dslope[h] = sum of dS * -|c - q_r|. Empty
  /// otherwise.
  std::vector<float> grad_slopes;
};

/// The backward of attention_forward(): gradients of a loss L given
/// grad_out = dL/dout, from the forward's inputs, its output `out` and its
/// `lse` (attention_forward_lse()). Recomputes the scores block by block
/// (FlashAttention-2 backward): per key block and query block,
///   S = scale q k^T + bias, P = exp(S - lse), dV += P^T dO,
///   dP = dO V^T, dS = P (dP - rowsum(dO * out)), dQ += scale dS K,
///   dK += scale dS^T Q,
/// and the table gradient is the sum of dS along each diagonal; never an
/// [i, j] matrix (except grad_dense itself, which is [b, h, i, j] before the
/// reduction to the dense bias's shape).
///
/// Arguments: q, k, v, bias and options exactly as given to the forward;
/// out [b, h, i, d] and grad_out [b, h, i, d] in q's dtype (any strides);
/// lse float32 [b, h, i] (any strides). Masked keys and rows with lse = -inf
/// get zero gradient. Numerics: float32 accumulation; agrees with a double
/// reference to about 1e-5 + 1e-4 |g| (relative to the largest gradients of
/// a tensor for long rows).
///
/// Threads: OpenMP over (b, h) (one task owns a head; fewer heads than
/// threads leaves threads idle); results do not depend on the thread count
/// (each head is one task; the GQA and batch sums run in a fixed order).
/// Memory: float32 dK and dV per query head ([b, h, j, d] each, summed into
/// [b, hk, j, d] at the end) plus per thread the packed q, dO, K, K^T, V^T
/// and dQ of one head.
///
/// Errors: those of attention_forward(), plus std::invalid_argument with the
/// shapes for an out, grad_out or lse of the wrong shape or dtype.
AttentionGradients attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionBias& bias, const AttentionOptions& options,
                                      const Tensor& out, const Tensor& lse, const Tensor& grad_out);

/// The plain path, same contract and checks as attention_forward(): for each
/// (b, h) and row, the materialised row of scale * q k^T + bias (double
/// accumulation), softmax over the visible keys, product with v. O(j) extra
/// memory per thread, O(b h i j d) time without blocking: for reference and
/// small shapes.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionBias& bias = AttentionBias::none(),
                           const AttentionOptions& options = {});

}  // namespace posbias

#endif  // POSBIAS_ATTENTION_H_
