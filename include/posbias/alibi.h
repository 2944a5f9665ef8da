// ALiBi bias matrices: free functions that write them, the cached module of
// zeta / x-transformers (AlibiPositionalBias), and the generic builder of the
// "ALiBi" seed document (AlibiBias).
//
// Position convention (AlibiPositionalBias and the free functions): queries
// are the LAST i of the j key positions (bottom-right alignment, as in
// x-transformers and FlashAttention-2). The query of row r sits at position
// q_r = j - i + r, the key of column c at position c, and
//
//     bias[h][r][c] = -slope[h] * |c - q_r|
//
// so a decode step (i = 1) against j cached keys sees the right distances.
// i > j is allowed (query positions then start below zero). Outputs are
// contiguous row-major [heads, i, j] unless documented otherwise.
//
// Numerics: slope * distance is computed in float32 (one rounding, the
// distance itself converted exactly from an integer while below 2^24) and, for
// a 16-bit output dtype, rounded once more to nearest even. Zero distance
// gives +0.0, as in the PyTorch references. float16 holds integer distances
// exactly only up to 2048 and nothing past 65504: a bias whose magnitude
// rounds past 65504 (slope * distance >= 65520) is -inf, exactly what
// PyTorch's `bias.to(torch.float16)` gives, on every path (the module's
// cache included). Such a key gets softmax weight 0, as the float32 value
// would; keep the bias float32 (or bfloat16) if a row can have no key within
// 65504 / slope of its query (docs/hardening.md).
//
// float64 output (every call that takes a dtype, the modules included): the
// reference path, slope * distance in double, exact (a float32 slope times
// an integer distance below 2^29), one plain threaded pass, not fast; the
// slopes stay float32.
//
// Errors: std::invalid_argument (bad heads, lengths, slopes, positions) and
// std::length_error (an element count that overflows or needs more memory
// than the machine has), always with the values in the message and before
// anything is allocated.
#ifndef POSBIAS_ALIBI_H_
#define POSBIAS_ALIBI_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias {

/// The bias of `slopes.size()` heads followed by `total_heads -
/// slopes.size()` all-zero heads: shape [total_heads, i, j],
/// bias[h][r][c] = -slopes[h] * |c - (j - i + r)|.
/// Requires 1 <= slopes.size() <= total_heads, finite slopes, i, j >= 0.
/// One pass over the output, threaded (OpenMP over rows), vectorised
/// (Highway, run-time dispatch), with streaming stores once the output is
/// larger than the last-level cache can usefully hold.
Tensor alibi_bias(const std::vector<float>& slopes, std::int64_t total_heads, std::int64_t i,
                  std::int64_t j, DType dtype = DType::kFloat32);

/// As alibi_bias, written into caller-owned memory: `out` must hold
/// total_heads * i * j contiguous elements of `dtype`, aligned to the element
/// size (4 or 2 bytes; no further alignment needed). std::invalid_argument
/// for a null or misaligned `out` (unless there are no elements). For
/// inference engines that own their buffers; allocates nothing.
void alibi_bias_into(const std::vector<float>& slopes, std::int64_t total_heads, std::int64_t i,
                     std::int64_t j, DType dtype, void* out);

/// Arbitrary positions (packed sequences, chunked prefill, context
/// parallelism): shape [total_heads, q_pos.size(), k_pos.size()],
/// bias[h][r][c] = -slopes[h] * |k_pos[c] - q_pos[r]|, zero heads appended.
/// Positions are any int64 values whose differences fit in int64.
Tensor alibi_bias_custom_pos(const std::vector<float>& slopes, std::int64_t total_heads,
                             const std::vector<std::int64_t>& q_pos,
                             const std::vector<std::int64_t>& k_pos, DType dtype = DType::kFloat32);

/// The ALiBi bias as a distance table (docs/spec.md "Distance tables"), the
/// form AttentionBias::distance_table and expand_distance_table read: float32
/// [slopes.size(), 2j - 1], entry e holding distance d = q - c = e - (j - 1)
/// (entry j - 1 is d = 0, entries above it past keys, below it future keys):
///
///     signed_distances = true:   table[h][e] = -slopes[h] * |d|
///     signed_distances = false:  table[h][e] = -slopes[h] * max(d, 0)
///
/// The first is the bias of alibi_bias() (expanding the table at (i, j),
/// i <= j, gives the values of alibi_bias(slopes, h, i, j)); the second biases past keys
/// only (future keys get 0, as in AlibiBias's causal form). Each entry is
/// one float32 product of -slope and the integer distance converted to
/// float (exact below 2^24); d = 0, and the future keys of the second form,
/// are +0.0 exactly (any other entry keeps the sign IEEE gives the product,
/// so a +0 slope gives -0.0). Not differentiable (no backward).
///
///   posbias::Tensor t = posbias::alibi_distance_table({0.5f}, 3);
///   // t[0] = {-1, -0.5, 0, -0.5, -1}  (d = -2 .. 2)
///
/// Throws std::invalid_argument, with the values, for an empty slope list,
/// j < 1 or a non-finite slope; std::length_error when [h, 2j - 1] float32
/// overflows or exceeds physical memory (checked before allocating). Cost:
/// one pass over the h * (2j - 1) entries.
Tensor alibi_distance_table(const std::vector<float>& slopes, std::int64_t j,
                            bool signed_distances = true);

/// The module of zeta's AlibiPositionalBias documentation, with
/// x-transformers' behaviour and a corrected cache.
///
///   posbias::AlibiPositionalBias bias_module(/*heads=*/4, /*total_heads=*/8);
///   posbias::Tensor bias = bias_module.forward(10, 10);  // [8, 10, 10]
///   bias = bias_module.forward(5, 5);   // served from the stored bias
///   bias = bias_module.forward(8, 15);  // computed, and now stored
///
/// Cache: the module keeps one stored bias (rows x cols). A request with
/// i <= rows and j <= cols is its bottom-right block [:, rows-i:, cols-j:],
/// returned as a view in O(1) with no copy; by the position convention this
/// equals a fresh build exactly. (zeta's transformer.py returns the top-left
/// block, which is wrong whenever j - i differs from cols - rows, e.g. decode
/// after prefill.) Any other request is computed fresh, at exactly [T, i, j],
/// and replaces the stored bias when it has at least as many elements, so the
/// module keeps its largest result. The stored bias is bounded by
/// cache_limit_bytes() (default 1 GiB per module; larger results are
/// returned but not stored).
///
/// Thread safety: every const and non-const member may be called from many
/// threads at once. Computation happens outside the lock; a result handed out
/// shares ownership of its storage and stays valid when the cache is replaced
/// or cleared.
class AlibiPositionalBias {
 public:
  /// `heads` heads with alibi_slopes(heads), `total_heads - heads` zero heads
  /// appended (total_heads defaults to heads). Requires heads >= 1 and
  /// total_heads >= heads.
  explicit AlibiPositionalBias(std::int64_t heads,
                               std::optional<std::int64_t> total_heads = std::nullopt,
                               DType dtype = DType::kFloat32);

  /// Custom slopes, one per biased head: `slopes.size()` must equal `heads`
  /// (a custom list sets the number of biased heads). Slopes must be finite;
  /// they are used as given (positive slopes penalise distance).
  AlibiPositionalBias(std::int64_t heads, std::optional<std::int64_t> total_heads,
                      std::vector<float> slopes, DType dtype = DType::kFloat32);

  /// The bias [total_heads, i, j] in dtype(); see the class comment for the
  /// cache. i, j >= 0.
  Tensor forward(std::int64_t i, std::int64_t j) const;

  /// The slope-free distance matrix -|c - q_r|, shape [1, i, j], in dtype().
  /// Not cached.
  Tensor get_bias(std::int64_t i, std::int64_t j) const;

  /// bias[h][r][c] = -slope[h] * |k_pos[c] - q_pos[r]| with zero heads, shape
  /// [total_heads, q_pos.size(), k_pos.size()]. Not cached.
  Tensor forward_custom_pos(const std::vector<std::int64_t>& q_pos,
                            const std::vector<std::int64_t>& k_pos) const;

  /// Biased heads, and all heads (biased + appended zero heads).
  std::int64_t heads() const { return heads_; }
  std::int64_t total_heads() const { return total_heads_; }
  /// The float32 slopes of the biased heads (never cast to dtype()).
  const std::vector<float>& slopes() const { return slopes_; }
  /// The output dtype of forward() and get_bias().
  DType dtype() const;

  /// Changes the output dtype (like `module.to(torch.float16)`, except that
  /// the slopes stay float32). Drops the stored bias.
  void set_dtype(DType dtype);

  /// The shape {total_heads, rows, cols} of the stored bias, or {} if none.
  std::vector<std::int64_t> cached_shape() const;
  /// Drops the stored bias (results already handed out stay valid).
  void clear_cache();
  /// Largest stored bias in bytes; 0 disables storing.
  std::size_t cache_limit_bytes() const;
  void set_cache_limit_bytes(std::size_t bytes);

 private:
  std::int64_t heads_;
  std::int64_t total_heads_;
  std::vector<float> slopes_;
  mutable std::mutex mutex_;  // guards the members below
  DType dtype_;
  std::size_t cache_limit_bytes_ = std::size_t{1} << 30;
  mutable Tensor cache_;  // [total_heads, rows, cols] or empty
  mutable bool has_cache_ = false;
};

/// The generic builder of the "ALiBi" seed document, with its own top-left
/// convention: query q = r, key k = c, and
///
///     causal:     bias[0][h][r][c] = slope[h] * max(r - c, 0)
///     non-causal: bias[0][h][r][c] = slope[h] * |r - c|
///
/// (future keys get 0 in the causal form; masking them is separate). Slopes
/// are used with their sign as given; the default is the seed's
/// linspace(-0.05, -0.5, n_heads), negative, in float32 with the serial
/// formula of PyTorch's CPU kernel (start + step * k for the first half,
/// end - step * (n - 1 - k) for the second; n_heads = 1 gives {-0.05}). That
/// is within 2 ulp of torch.linspace(-0.05, -0.5, n) but not always equal
/// to it for n > 8: torch's own bits depend on its vector width and FMA
/// contraction (tests/unit checks the 2 ulp bound for n = 1..200).
///
///   posbias::AlibiBias alibi(/*n_heads=*/1, /*causal=*/false, {-0.2f});
///   posbias::Tensor b = alibi.build(3, 3);  // [1, 1, 3, 3]
///   // b[0][0] = {{0, -0.2, -0.4}, {-0.2, 0, -0.2}, {-0.4, -0.2, 0}}
///
/// build() caches its last result keyed by everything that changes it
/// (q_len, k_len, dtype), returning the same storage on a repeat call.
/// Thread-safe like AlibiPositionalBias.
class AlibiBias {
 public:
  /// n_heads >= 1 heads with the seed's default slopes (n_heads <= 2^24, as
  /// for alibi_slopes).
  explicit AlibiBias(std::int64_t n_heads, bool causal = true);

  /// Custom slopes: exactly n_heads finite values (an empty list is an
  /// error, not the default).
  AlibiBias(std::int64_t n_heads, bool causal, std::vector<float> slopes);

  /// The bias [1, n_heads, q_len, k_len]; q_len, k_len >= 0.
  Tensor build(std::int64_t q_len, std::int64_t k_len, DType dtype = DType::kFloat32) const;

  /// The constructor arguments (slopes() as used: the default if none given).
  std::int64_t n_heads() const { return n_heads_; }
  bool causal() const { return causal_; }
  const std::vector<float>& slopes() const { return slopes_; }

  /// torch.linspace(-0.05, -0.5, n) in float32, the seed's default slopes.
  static std::vector<float> default_slopes(std::int64_t n_heads);

 private:
  std::int64_t n_heads_;
  bool causal_;
  std::vector<float> slopes_;
  mutable std::mutex mutex_;
  mutable Tensor cache_;
  mutable bool has_cache_ = false;
  mutable std::int64_t cached_q_ = -1, cached_k_ = -1;
  mutable DType cached_dtype_ = DType::kFloat32;
};

}  // namespace posbias

#endif  // POSBIAS_ALIBI_H_
