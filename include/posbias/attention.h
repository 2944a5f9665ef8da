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
  kDistanceTable,  ///< table[h][(q_r - c) + (n - 1) / 2] (DPB, T5 buckets, any Toeplitz bias)
  kDense,          ///< any tensor broadcastable to [b, h, i, j]
};

/// The additive positional bias of attention_forward(). Build it with one of
/// the static functions; only the member of its kind is read.
struct AttentionBias {
  AttentionBiasKind kind = AttentionBiasKind::kNone;
  /// kAlibi: finite float32 slopes (never cast to a 16-bit input dtype),
  /// either h of them (one per query head) or b * h ([b, h] row-major: one
  /// set per sequence, as FlashAttention-2's alibi_slopes [b, h]; b is the
  /// number of sequences, also for packed and paged calls);
  /// bias[s][h][r][c] = -slopes[s][h] * |c - q_r|.
  std::vector<float> slopes;
  /// kAlibi in a float64 call only: the slopes in double (same count rule),
  /// instead of `slopes` (give one of the two; float32 `slopes` are widened
  /// exactly). A non-float64 call with slopes_f64 is refused.
  std::vector<double> slopes_f64;
  /// kDistanceTable: float32 [h, n], n odd (any strides), read at its centre
  /// (float32 or float64 in a float64 call, read in double):
  /// bias[h][r][c] = table[h][(q_r - c) + (n - 1) / 2]. One table built for
  /// the longest sequence therefore serves every shorter one. n must cover
  /// every visible (row, key) pair: (n - 1) / 2 >= |q_r - c| for each of them
  /// (with causal attention only q_r - c >= 0 is read, but the table is still
  /// centred). A table of n = 2j - 1 reads exactly as before this rule
  /// (centre j - 1); a longer one used to be read at j - 1.
  Tensor table;
  /// kDense: float32 (float64 in a float64 call), at most 4 dimensions,
  /// broadcastable to [b, h, i, j] (right-aligned like PyTorch; size-1 or
  /// missing dimensions broadcast); any strides. Use it for padding masks
  /// (-inf) or learned biases.
  Tensor dense;

  /// No bias.
  static AttentionBias none();
  /// ALiBi with the given per-head slopes (e.g. alibi_slopes(h)).
  static AttentionBias alibi(std::vector<float> slopes);
  /// ALiBi with float64 slopes (slopes_f64), for float64 calls.
  static AttentionBias alibi_f64(std::vector<double> slopes);
  /// A per-head table indexed by relative distance (see `table`).
  static AttentionBias distance_table(Tensor table);
  /// A dense additive bias (see `dense`).
  static AttentionBias dense_bias(Tensor bias);
};

/// A sliding window around each query position: key c is visible to the
/// query at position q_r iff q_r - left <= c <= q_r + right; -1 leaves that
/// side unbounded (both -1: no window). With causal attention `right` is 0 in
/// effect. Entries below -1 are refused.
struct AttentionWindow {
  std::int64_t left = -1;
  std::int64_t right = -1;
};

/// Options of every attention call (dense, packed, paged; forward, backward,
/// reference). All compose with each other, with every bias kind, with
/// grouped-query heads and with every dtype.
struct AttentionOptions {
  /// Multiplies q k^T; must be finite (and finite as a float32 for the
  /// float32 and 16-bit calls, which use its float32 rounding). Default
  /// 1 / sqrt(d). A double so that float64 calls take it as given.
  std::optional<double> scale;
  /// Mask key c for row r when c > q_r (the row's position).
  bool causal = false;
  /// Position of query row 0 minus that of key 0 (signed): row r sits at
  /// q_r = q_offset + r, key c at c. Default j - i (bottom-right). A
  /// context-parallel shard or a chunk of a longer prefill passes its global
  /// offset. Dense calls only: packed and paged calls put each sequence's
  /// queries at its last positions (j_s - i_s) and refuse an explicit offset.
  std::optional<std::int64_t> q_offset;
  /// Sliding window (see AttentionWindow); default none.
  AttentionWindow window;
  /// Logit soft-capping (Gemma 2, Grok): the score becomes
  /// softcap * tanh(scale q.k / softcap), then the bias is added. 0: off;
  /// otherwise finite and > 0 (float32 and 16-bit calls use its float32
  /// rounding, which must stay finite and > 0). A double, as scale.
  double softcap = 0.0;
  /// Key padding mask [b, j] of kBool or kUInt8 (any strides), 1 = attend,
  /// 0 = masked (Hugging Face's attention_mask). Empty (numel 0 and dim != 2):
  /// none. A masked key is never read. Dense calls only.
  Tensor key_mask;
};

/// Fused attention with a positional bias (FlashAttention-2 style).
///
/// float64 (every attention call: forward, forward_lse, varlen, KV cache,
/// the backwards and the references): q, k and v all float64 take the
/// reference path, exact in double (scores, softmax, sums, the bias and every
/// gradient in double; the default scale is 1 / sqrt(d) in double; an
/// explicit scale and softcap are taken as given, in double). Not fast: one row
/// at a time, no blocking and no SIMD, for gradcheck and reference work. The
/// output, the lse (float64 [b, h, i] or [h, total_q]) and every gradient are
/// float64 (grad_slopes_f64 in double, grad_slopes its float32 rounding);
/// slopes may be float32 (`slopes`) or double (`slopes_f64`), a table float32
/// or float64, a dense bias must be float64. float64 mixed with any other
/// dtype among q, k, v is refused (std::invalid_argument naming the three).
///
/// q [b, h, i, d], k and v [b, hk, j, d] (h % hk == 0), any strides. Dtypes:
/// all three float32, bfloat16 or float16 (the same dtype), or q float32 with
/// k and v both bfloat16 or both float16 (a 16-bit KV cache with float32
/// queries, llama.cpp's arrangement: K and V are read as 16 bits and widened
/// in registers). Returns out [b, h, i, d], contiguous, in q's dtype.
/// d >= 1; b, h, i, j >= 0.
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
/// NaN in a masked key or value does not reach it. With ALiBi or no bias
/// (soft-capped or not), a tile of query rows also skips a key block where
/// a bound (|q| max|k|, or the cap, plus the block's largest bias) proves
/// every score more than 40 below the row's running maximum, where the
/// kernel's exp is exactly 0: the far blocks of ALiBi's steep heads. The
/// results keep every bit, and a block whose values hold a NaN or an
/// infinity is never skipped.
/// POSBIAS_FLUSHED_TILES=0 in the environment turns the skip off (read at
/// each call).
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
/// query rows), so each key and value row is read once for all of them. The block sizes and that
/// split follow omp_get_max_threads(), so results may differ in the last bits between thread counts
/// (always within the tolerance above); for a given thread count they are deterministic. Safe to
/// call from many threads at once.
///
/// Cost: O(b h i j d) flops (about half for causal i = j); memory
/// O(b h i d) for the output, O(h j) for a distance table, and per thread
/// the float32 packing of one kv head's K^T and V (skipped above 32 MiB)
/// plus small block buffers: never O(i j). Each thread keeps its block
/// buffers (at most 4 MB) from call to call: a repeated call does not
/// allocate them again.
///
/// Errors: std::invalid_argument with the shapes in the message for
/// mismatched ranks, batch, head or length extents or d, h % hk != 0,
/// d = 0, a dtype combination other than the above, a non-finite scale, a
/// slope count other than h or b * h, non-finite slopes, a table of even
/// length, too short for the longest visible distance or with a head count
/// other than h, a dense bias that does not broadcast or is not float32, a
/// window entry below -1, a negative or non-finite softcap, a key mask whose
/// shape is not [b, j] or whose dtype is not bool or uint8. Nothing is
/// allocated before the arguments are checked.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionBias& bias = AttentionBias::none(),
                         const AttentionOptions& options = {});

/// attention_forward() and the per-row log-sum-exp of the softmax.
struct AttentionForwardResult {
  Tensor out;  ///< [b, h, i, d] in q's dtype, as attention_forward()
  /// float32 [b, h, i] (float64 in a float64 call): lse[b][h][r] = ln(sum over visible c of
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
  /// kDistanceTable: float32 (float64 in a float64 call) [h, n] with the
  /// table's n (entries past 2j - 2 and those no visible (row, key) pair
  /// reads are zero): the sum over the batch and over each diagonal
  /// (q_r - c constant) of dS = dL/dscore. Empty for the other kinds.
  Tensor grad_table;
  /// kDense: float32 (float64 in a float64 call) in the dense bias's shape:
  /// dS summed over the broadcast dimensions. Empty for the other kinds.
  Tensor grad_dense;
  /// kAlibi: float32, one per slope given (h, or b * h for per-sequence
  /// slopes): dL/dslope = sum of dS * -|c - q_r| over the rows and keys the
  /// slope applies to. Empty otherwise.
  std::vector<float> grad_slopes;
  /// kAlibi in a float64 call: dL/dslope in double (grad_slopes is then its
  /// float32 rounding). Empty otherwise.
  std::vector<double> grad_slopes_f64;
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
/// reduction to the dense bias's shape). With ALiBi or no bias, as the
/// forward's flushed tiles, a (query block, key block) pair is skipped where
/// the same bound, against each row's lse, proves every P exactly 0 and the
/// values it would read (the block's V rows, the rows' grad_out and
/// rowsum(dO * out)) are finite: it would add only zeros. The gradients
/// keep every bit; POSBIAS_FLUSHED_TILES=0 turns the skip off here too.
///
/// Arguments: q, k, v, bias and options exactly as given to the forward;
/// out [b, h, i, d] and grad_out [b, h, i, d] in q's dtype (any strides);
/// lse float32 [b, h, i] (float64 in a float64 call; any strides). Masked
/// keys and rows with lse = -inf get zero gradient. Numerics: float32
/// accumulation; agrees with a double reference to about 1e-5 + 1e-4 |g|
/// (relative to the largest gradients of a tensor for long rows). A float64
/// call runs the double reference backward instead (exact in double; threads
/// over (sequence, kv head) tasks, each owning its dK and dV rows; results do
/// not depend on the thread count; O(j + d) memory per thread).
///
/// Threads: OpenMP over (sequence, head) tasks, longest sequences first (one
/// task owns a head; fewer tasks than threads leaves threads idle); results
/// do not depend on the thread count (the GQA and batch sums run in a fixed
/// order). Memory: with grouped-query heads (hk < h), each query head's
/// float32 dK and dV ([j, d] each, j the longest sequence's in a packed
/// call) until they are added into their kv head's sum, which happens in
/// head order as the heads end: about (threads + 1) * (h / hk) such pairs
/// at once, not b * h; without, each task stores its own dK and dV. Plus
/// per thread the packed q, dO, K, K^T, V^T and dQ of one head.
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

// ---------------------------------------------------------------------------
// Packed variable-length batches (FlashAttention-2's varlen layout)
// ---------------------------------------------------------------------------

/// Attention over b sequences packed along one token dimension, without
/// padding: q [total_q, h, d], k and v [total_k, hk, d] (any strides, dtypes as
/// attention_forward()), cu_seqlens_q and cu_seqlens_k int32 [b + 1]
/// (kInt32, any stride): sequence s has queries q[cu_seqlens_q[s] ..
/// cu_seqlens_q[s + 1]) and keys k[cu_seqlens_k[s] .. cu_seqlens_k[s + 1]).
/// Positions restart at 0 in every sequence and are bottom-right within it:
/// with i_s queries and j_s keys, query row r sits at j_s - i_s + r. Empty
/// sequences are allowed; a row that sees no key (i_s > j_s, causal) outputs
/// zeros. Returns out [total_q, h, d], contiguous, in q's dtype.
///
/// The bias is any kind: ALiBi slopes [h] or per sequence [b, h]; a distance
/// table [h, n] read at its centre (one table serves every sequence); a dense
/// bias is refused (it has no packed layout). Options: scale, causal, window,
/// softcap; q_offset and key_mask are refused (positions are per sequence,
/// and packing has no padding to mask).
///
/// Work: tasks (sequence, head, query block), scheduled longest first over
/// the threads with no barrier per sequence; no work or memory for padding.
///
/// Errors: those of attention_forward(), plus std::invalid_argument naming
/// the values for cu_seqlens that are not int32, not 1-d of the same length
/// b + 1 >= 1, do not start at 0, decrease, or do not end at total_q (total_k).
Tensor attention_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                const AttentionBias& bias = AttentionBias::none(),
                                const AttentionOptions& options = {});

/// attention_varlen_forward() and the log-sum-exp of every row, float32
/// [h, total_q] (float64 in a float64 call; FlashAttention-2's varlen
/// softmax_lse layout); -inf for a row that sees no key.
AttentionForwardResult attention_varlen_forward_lse(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
    const Tensor& cu_seqlens_k, const AttentionBias& bias = AttentionBias::none(),
    const AttentionOptions& options = {});

/// The backward of attention_varlen_forward(), as attention_backward() for
/// the packed layout: out and grad_out [total_q, h, d], lse float32
/// [h, total_q] (from attention_varlen_forward_lse()). grad_q [total_q, h, d],
/// grad_k and grad_v [total_k, hk, d]; grad_table [h, n]; grad_slopes with as
/// many values as the slopes given (h or b * h). No [i, j] buffer.
AttentionGradients attention_varlen_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                             const AttentionBias& bias,
                                             const AttentionOptions& options, const Tensor& out,
                                             const Tensor& lse, const Tensor& grad_out);

/// The plain path of attention_varlen_forward() (same contract and checks),
/// one double-accumulated row at a time: for reference and small shapes.
Tensor attention_varlen_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                  const AttentionBias& bias = AttentionBias::none(),
                                  const AttentionOptions& options = {});

// ---------------------------------------------------------------------------
// KV caches: paged (vLLM / FlashAttention block_table) or one slab per
// sequence (flash_attn_with_kvcache without a block table)
// ---------------------------------------------------------------------------

/// Attention of new queries against a KV cache, FlashAttention-2's
/// flash_attn_with_kvcache layout:
///   q [b, i, h, d] (i = 1: decode; i > 1: chunked append or speculative
///   verification), any strides;
///   cache_seqlens int32 [b]: sequence s has j_s = cache_seqlens[s] keys, and
///   its i queries are its last i positions (row r at j_s - i + r);
///   block_table int32 [b, max_blocks] (any strides), or empty:
///   - paged: k_cache and v_cache [num_blocks, block_size, hk, d] (any
///     block_size >= 1, any strides); key c of sequence s is row
///     c % block_size of block block_table[s][c / block_size]; the entries a
///     sequence does not use (past ceil(j_s / block_size)) are not read;
///   - empty block_table: k_cache and v_cache [b, max_len, hk, d], one slab
///     per sequence, keys [0, j_s) of slab s.
///   A cache of more slabs than sequences, sequence s in slab idx[s]
///   (flash_attn_with_kvcache's cache_batch_idx), is the paged layout with
///   block_size = max_len: pass it with block_table [b, 1] = idx (no copy).
/// Dtypes as attention_forward() (q float32 with a 16-bit cache included).
/// Every bias kind but dense (ALiBi [h] or per sequence [b, h], a centred
/// distance table), causal, window, softcap; q_offset and key_mask refused.
/// Returns out [b, i, h, d], contiguous, in q's dtype. Only the cache rows
/// of keys [0, j_s) are read, each once for all the query heads of its kv
/// head.
///
/// Errors: std::invalid_argument with the values for a block_table or
/// cache_seqlens that is not int32 or has the wrong shape, a cache_seqlens
/// entry that is negative or above max_blocks * block_size (max_len without
/// a block table), a block index outside [0, num_blocks) among the entries a
/// sequence uses, k_cache and v_cache of different shapes or dtypes, and
/// those of attention_forward().
Tensor attention_kvcache_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const Tensor& cache_seqlens, const Tensor& block_table,
                                 const AttentionBias& bias = AttentionBias::none(),
                                 const AttentionOptions& options = {});

/// attention_kvcache_forward() and the log-sum-exp of every query row, as
/// flash_attn_with_kvcache's return_softmax_lse: lse float32 [b, h, i]
/// (float64 in a float64 call), lse[s][x][r] = ln(sum over the keys row r of
/// sequence s sees of exp(its score)), -inf for a row that sees no key. out
/// is the same as attention_kvcache_forward()'s (the same bits). With it,
/// results over disjoint parts of a query's keys merge as
/// AttentionForwardResult says (with a position bias, each part must score
/// its keys at their true distances from the query). Same contract and
/// errors as attention_kvcache_forward().
AttentionForwardResult attention_kvcache_forward_lse(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cache_seqlens,
    const Tensor& block_table, const AttentionBias& bias = AttentionBias::none(),
    const AttentionOptions& options = {});

/// The plain path of attention_kvcache_forward() (same contract and checks).
Tensor attention_kvcache_reference(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const Tensor& cache_seqlens, const Tensor& block_table,
                                   const AttentionBias& bias = AttentionBias::none(),
                                   const AttentionOptions& options = {});

/// Writes new keys and values into their cache slots, as flash_attn_with_kvcache
/// does with k= and v=: k_new and v_new [b, n, hk, d] (any strides, any dtype
/// of the float three; converted to the cache's dtype, rounded once) go to
/// positions cache_seqlens[s] .. cache_seqlens[s] + n - 1 of sequence s, in
/// the cache layout of attention_kvcache_forward() (paged with block_table,
/// or slabs when it is empty). cache_seqlens is not changed: attend with
/// cache_seqlens + n afterwards. Errors: std::invalid_argument with the values
/// for an append past the cache's end (cache_seqlens[s] + n above
/// max_blocks * block_size, or max_len), a block index outside
/// [0, num_blocks), shapes or dtypes that do not match the cache. float64 is
/// appended (copied exactly) when k_new, v_new and both caches are all
/// float64, and refused by name when mixed with any other dtype.
void kvcache_append(Tensor& k_cache, Tensor& v_cache, const Tensor& cache_seqlens,
                    const Tensor& block_table, const Tensor& k_new, const Tensor& v_new);

}  // namespace posbias

#endif  // POSBIAS_ATTENTION_H_
