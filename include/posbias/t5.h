// T5 relative position bias (x-transformers' RelativePositionBias): each
// relative distance falls into one of `num_buckets` buckets (exact for small
// distances, logarithmic up to `max_distance`, one shared bucket beyond), and
// a learned embedding [num_buckets, heads] gives each bucket's bias per head,
// times `scale`.
//
// Positions follow the library convention (see alibi.h): q_r = j - i + r,
// key c at c; bias[h][r][c] = E[bucket(c - q_r)][h] * scale. i > j is
// allowed (query positions then start below zero).
//
//   posbias::RelativePositionBias t5(/*scale=*/1.0f, /*causal=*/false,
//                                    /*num_buckets=*/32, /*max_distance=*/128,
//                                    /*heads=*/8, /*seed=*/0);
//   posbias::Tensor bias = t5.forward(/*i=*/1, /*j=*/100);  // decode step
//   posbias::Tensor table = t5.distance_table(100);           // [8, 199]
//
// Thread safety: const members may be called concurrently; changing the
// embedding (mutable_embedding, load_state_dict) while another thread runs
// forward() is a data race.
#ifndef POSBIAS_T5_H_
#define POSBIAS_T5_H_

#include <cstdint>
#include <string>

#include "posbias/dtype.h"
#include "posbias/safetensors.h"
#include "posbias/tensor.h"

namespace posbias {

/// The bucket of relative position rel = k_pos - q_pos. With n = -rel:
/// two-sided (causal = false): nb = num_buckets / 2, nb is added when n < 0,
/// then n = |n|; causal: n = max(n, 0), nb = num_buckets. max_exact = nb / 2;
/// n < max_exact is its own bucket, else
///   min(max_exact + trunc(ln(n / max_exact) / ln(max_distance / max_exact)
///                          * (nb - max_exact)), nb - 1),
/// evaluated in float32 like the PyTorch reference: with me = max_exact,
///   me + trunc(logf(float(n) / float(me)) / float(ln(double(max_distance) / me))
///                * float(nb - me)),
/// the log only for n >= me. Buckets are 0..nb-1 for past keys (and the
/// query's own position), nb..2nb-1 for future keys when two-sided; causal
/// maps every future key (rel > 0) to bucket 0. Every int64 rel is accepted.
/// Requires num_buckets >= 2 (>= 4 two-sided, so that max_exact >= 1) and
/// max_distance > max_exact; std::invalid_argument with the values otherwise.
/// Example: t5_relative_position_bucket(-7, false) == 7, (7, false) == 23,
/// (-128, true) == 31.
std::int64_t t5_relative_position_bucket(std::int64_t rel, bool causal,
                                         std::int64_t num_buckets = 32,
                                         std::int64_t max_distance = 128);

/// T5's relative position bias (x-transformers' RelativePositionBias), see the file comment.
class RelativePositionBias {
 public:
  /// The embedding starts N(0, 1) from `seed` (PyTorch's nn.Embedding
  /// default distribution; not torch's numbers): std::mt19937_64(seed) and
  /// the Box-Muller transform, so the same seed gives the same embedding with
  /// every standard library (up to the last bit of libm's log/sin/cos).
  /// Requires heads >= 1, a finite scale and valid bucket arguments (see
  /// t5_relative_position_bucket); std::invalid_argument otherwise.
  RelativePositionBias(float scale, bool causal = false, std::int64_t num_buckets = 32,
                       std::int64_t max_distance = 128, std::int64_t heads = 8,
                       std::uint64_t seed = 0);

  /// The bias [heads, i, j] in `dtype`, contiguous: E[bucket][h] * scale in
  /// float32, rounded once to `dtype`. i, j >= 0 (std::invalid_argument
  /// otherwise; std::length_error, before allocating, when it cannot fit).
  /// Costs i + j - 1 bucket evaluations, then a copy per row of a per-head
  /// table (the Toeplitz expansion), with streaming stores for large outputs.
  /// Memory beyond the result: that table when it is at most 1/8 of the
  /// output, else (few rows or columns, e.g. i = 2e7, j = 1) tiles of it of at
  /// most 2^18 entries per head and thread.
  Tensor forward(std::int64_t i, std::int64_t j, DType dtype = DType::kFloat32) const;

  /// [heads, 2j-1] float32, entry (q_r - c) + (j - 1) = E[bucket(c - q_r)][h]
  /// * scale, i.e. entry k holds rel = c - q = (j - 1) - k: the table the fused
  /// attention reads (valid for any i <= j). j >= 1 (std::invalid_argument).
  Tensor distance_table(std::int64_t j) const;

  /// The embedding gradient of sum(distance_table(j) * grad): [num_buckets,
  /// heads] float32 with g[b][h] = scale * (sum of grad[h][k] over the
  /// entries k whose bucket is b), a scatter-add of the table gradient into
  /// the buckets (what a trainable front end needs; buckets no entry reaches
  /// get 0). grad: [heads, 2j - 1], any dtype and strides (copied to
  /// contiguous float32 first when it is not). j >= 1 and another shape
  /// throw std::invalid_argument naming the values. Cost: one bucket
  /// evaluation per entry plus one pass over grad; sums in float32 in entry
  /// order (independent of the number of threads: there are none).
  Tensor backward_distance_table(std::int64_t j, const Tensor& grad) const;

  /// The constructor arguments.
  float scale() const { return scale_; }
  bool causal() const { return causal_; }
  std::int64_t num_buckets() const { return num_buckets_; }
  std::int64_t max_distance() const { return max_distance_; }
  std::int64_t heads() const { return heads_; }

  /// The embedding [num_buckets, heads], float32; state-dict name
  /// "relative_attention_bias.weight". A replacement through
  /// mutable_embedding() must keep that shape (forward() throws
  /// std::invalid_argument otherwise); any dtype or strides are accepted.
  const Tensor& embedding() const { return embedding_; }
  Tensor& mutable_embedding() { return embedding_; }

  /// {"relative_attention_bias.weight": embedding}: a handle sharing the
  /// module's storage (like PyTorch's state_dict()); save it with
  /// save_safetensors().
  TensorMap state_dict() const;
  /// Strict load: exactly that one name, shape [num_buckets, heads], finite
  /// values; any dtype (converted to float32, copied). Otherwise
  /// std::invalid_argument naming what was expected, and nothing changes.
  void load_state_dict(const TensorMap& state);

 private:
  float scale_;
  bool causal_;
  std::int64_t num_buckets_;
  std::int64_t max_distance_;
  std::int64_t heads_;
  Tensor embedding_;
};

/// float64 reference of RelativePositionBias::distance_table for a float64
/// model: [heads, 2j-1] float64, entry k = embedding[bucket((j - 1) - k)][h]
/// * scale, the product in double (scale as given, not rounded to float).
/// embedding: float64 [num_buckets, heads], any strides, finite. Errors
/// (std::invalid_argument, with the values): the bucket arguments as
/// t5_relative_position_bucket checks them, a non-finite scale, j < 1, an
/// embedding of another dtype or shape or with a non-finite value;
/// std::length_error when the table does not fit in memory.
Tensor t5_distance_table_f64(const Tensor& embedding, double scale, bool causal,
                             std::int64_t num_buckets, std::int64_t max_distance, std::int64_t j);

/// The embedding gradient of sum(t5_distance_table_f64(...) * grad) in double:
/// [num_buckets, heads] float64, g[b][h] = scale * (sum of grad[h][k] over the
/// entries k in bucket b, in entry order). grad: float64 [heads, 2j-1], any
/// strides; heads is read from it. Errors as t5_distance_table_f64, and a
/// grad of another dtype or a rank other than 2 or length other than 2j-1.
Tensor t5_backward_distance_table_f64(const Tensor& grad, double scale, bool causal,
                                      std::int64_t num_buckets, std::int64_t max_distance,
                                      std::int64_t j);

}  // namespace posbias

#endif  // POSBIAS_T5_H_
