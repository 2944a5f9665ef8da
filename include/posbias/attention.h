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
/// max, running sum, rescaled float32 accumulator); the bias is added in the
/// same pass that scales the scores. ALiBi is computed from the integer
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
///
/// Threads: OpenMP over (b, h, query block); when there are fewer of those
/// than threads (decode, i small), the keys are split across threads and
/// the partial softmax states merged. The block sizes and that split follow
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
