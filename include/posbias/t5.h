// T5 relative position bias (x-transformers' RelativePositionBias): each
// relative distance falls into one of `num_buckets` buckets (exact for small
// distances, logarithmic up to `max_distance`), and a learned embedding
// [num_buckets, heads] gives each bucket's bias per head, times `scale`.
//
// Positions follow the library convention (see alibi.h): q_r = j - i + r,
// key c at c; bias[h][r][c] = E[bucket(c - q_r)][h] * scale. i > j is
// allowed (query positions then start below zero).
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
/// evaluated in float32 like the PyTorch reference. Requires num_buckets >= 2
/// (>= 4 two-sided, so that max_exact >= 1) and max_distance > max_exact;
/// std::invalid_argument otherwise.
std::int64_t t5_relative_position_bucket(std::int64_t rel, bool causal,
                                         std::int64_t num_buckets = 32,
                                         std::int64_t max_distance = 128);

class RelativePositionBias {
 public:
  /// The embedding starts N(0, 1) from `seed` (PyTorch's nn.Embedding
  /// default distribution; not torch's numbers). heads >= 1, finite scale.
  RelativePositionBias(float scale, bool causal = false, std::int64_t num_buckets = 32,
                       std::int64_t max_distance = 128, std::int64_t heads = 8,
                       std::uint64_t seed = 0);

  /// The bias [heads, i, j] in `dtype`; i, j >= 0.
  Tensor forward(std::int64_t i, std::int64_t j, DType dtype = DType::kFloat32) const;

  /// [heads, 2j-1], entry (q_r - c) + (j - 1) = E[bucket(c - q_r)][h] * scale:
  /// the table the fused attention reads. j >= 1.
  Tensor distance_table(std::int64_t j) const;

  float scale() const { return scale_; }
  bool causal() const { return causal_; }
  std::int64_t num_buckets() const { return num_buckets_; }
  std::int64_t max_distance() const { return max_distance_; }
  std::int64_t heads() const { return heads_; }

  /// The embedding [num_buckets, heads], float32; state-dict name
  /// "relative_attention_bias.weight".
  const Tensor& embedding() const { return embedding_; }
  Tensor& mutable_embedding() { return embedding_; }

  /// {"relative_attention_bias.weight": embedding}.
  TensorMap state_dict() const;
  /// Strict load: exactly that name, shape [num_buckets, heads], finite.
  void load_state_dict(const TensorMap& state);

 private:
  float scale_;
  bool causal_;
  std::int64_t num_buckets_;
  std::int64_t max_distance_;
  std::int64_t heads_;
  Tensor embedding_;
};

}  // namespace posbias

#endif  // POSBIAS_T5_H_
