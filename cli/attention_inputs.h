// The seeded random inputs of `posbias attention`, in a header of their own
// so that tests can build exactly the tensors the tool uses.
//
// Values are N(0, 1) float32 from std::mt19937_64 (whose output sequence the
// C++ standard fixes) through the Box-Muller transform, written out here so
// that no standard-library distribution (whose algorithm is unspecified)
// decides the numbers. One stream per seed fills, in this order, q, k, v and,
// when asked for, the dense bias, each row-major.
//
//   posbias::cli::AttentionShape s{2, 8, 2, 16, 64, 32};  // b, h, hk, i, j, d
//   posbias::cli::AttentionInputs in = posbias::cli::random_attention_inputs(s, false, 7);
//   // in.q [2, 8, 16, 32], in.k and in.v [2, 2, 64, 32]
#ifndef POSBIAS_CLI_ATTENTION_INPUTS_H_
#define POSBIAS_CLI_ATTENTION_INPUTS_H_

#include <cmath>
#include <cstdint>
#include <random>

#include "posbias/tensor.h"

namespace posbias::cli {

/// Standard normal float32 values, deterministic for a seed.
class NormalGenerator {
 public:
  explicit NormalGenerator(std::uint64_t seed) : engine_(seed) {}

  /// The next N(0, 1) value (Box-Muller: two uniforms give two normals).
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1] so that log(u1) is finite, u2 in [0, 1); 53 random bits each.
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    spare_ = static_cast<float>(radius * std::sin(kTwoPi * u2));
    has_spare_ = true;
    return static_cast<float>(radius * std::cos(kTwoPi * u2));
  }

  /// Fills a contiguous float32 tensor row-major.
  void fill(Tensor& t) {
    float* data = t.mutable_data<float>();
    const std::int64_t n = t.numel();
    for (std::int64_t k = 0; k < n; ++k) data[k] = next();
  }

 private:
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  std::mt19937_64 engine_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

/// The sizes of an attention call: q [b, h, i, d], k and v [b, hk, j, d].
struct AttentionShape {
  std::int64_t b = 1;
  std::int64_t h = 1;
  std::int64_t hk = 1;
  std::int64_t i = 1;
  std::int64_t j = 1;
  std::int64_t d = 1;
};

/// float32 inputs; `dense` is empty unless asked for ([1, h, i, j]).
struct AttentionInputs {
  Tensor q;
  Tensor k;
  Tensor v;
  Tensor dense;
};

/// Every tensor is allocated first (so a size that cannot be allocated throws
/// the library's std::length_error, a negative extent its
/// std::invalid_argument, before any value is drawn), then filled from one
/// NormalGenerator(seed): q, k, v, then the dense bias.
inline AttentionInputs random_attention_inputs(const AttentionShape& s, bool dense,
                                               std::uint64_t seed) {
  AttentionInputs in;
  in.q = Tensor::empty({s.b, s.h, s.i, s.d}, DType::kFloat32);
  in.k = Tensor::empty({s.b, s.hk, s.j, s.d}, DType::kFloat32);
  in.v = Tensor::empty({s.b, s.hk, s.j, s.d}, DType::kFloat32);
  if (dense) in.dense = Tensor::empty({1, s.h, s.i, s.j}, DType::kFloat32);
  NormalGenerator gen(seed);
  gen.fill(in.q);
  gen.fill(in.k);
  gen.fill(in.v);
  if (dense) gen.fill(in.dense);
  return in;
}

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_ATTENTION_INPUTS_H_
