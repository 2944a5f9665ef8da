// T5 relative position bias (see posbias/t5.h): the bucket function, the
// module's embedding and its two outputs. The dense bias is a Toeplitz
// expansion (kernels/toeplitz.h): the bias depends on c - q_r only, so each
// head needs a table of i + j - 1 values, one bucket lookup each, and every
// row of the output is a window of that table.
#include "posbias/t5.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "checks.h"
#include "kernels/toeplitz.h"

namespace posbias {
namespace {

constexpr const char* kWeightName = "relative_attention_bias.weight";

// The checked constants of the bucket function.
struct BucketRule {
  bool causal;
  std::int64_t nb;         // buckets per side
  std::int64_t max_exact;  // distances below this have their own bucket
  float log_ratio;         // float(ln(max_distance / max_exact))
  float log_buckets;       // float(nb - max_exact)
};

BucketRule make_bucket_rule(const char* who, bool causal, std::int64_t num_buckets,
                            std::int64_t max_distance) {
  const std::int64_t min_buckets = causal ? 2 : 4;
  if (num_buckets < min_buckets) {
    throw std::invalid_argument(
        std::string(who) + ": num_buckets must be >= " + std::to_string(min_buckets) +
        (causal ? " (causal)" : " (two-sided: half per direction, at least 2 each)") + ", got " +
        std::to_string(num_buckets));
  }
  BucketRule rule;
  rule.causal = causal;
  rule.nb = causal ? num_buckets : num_buckets / 2;
  rule.max_exact = rule.nb / 2;
  if (max_distance <= rule.max_exact) {
    throw std::invalid_argument(
        std::string(who) +
        ": max_distance must be > max_exact = " + std::to_string(rule.max_exact) + " (half of " +
        std::to_string(rule.nb) + " buckets per direction), got " + std::to_string(max_distance));
  }
  // As the reference: math.log(max_distance / max_exact) in double (Python's
  // true division), used as a float32 scalar.
  rule.log_ratio = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(rule.max_exact)));
  rule.log_buckets = static_cast<float>(rule.nb - rule.max_exact);
  return rule;
}

// x-transformers' _relative_position_bucket for one rel = k_pos - q_pos, in
// the reference's float32 arithmetic. |rel| is formed unsigned so that every
// int64 is accepted.
std::int64_t bucket_of(const BucketRule& rule, std::int64_t rel) {
  // n = -rel: n < 0 exactly when rel > 0 (a future key).
  const std::uint64_t past = rel < 0 ? static_cast<std::uint64_t>(-(rel + 1)) + 1 : 0;  // max(n, 0)
  std::int64_t ret = 0;
  std::uint64_t n = past;
  if (!rule.causal) {
    if (rel > 0) {
      ret = rule.nb;
      n = static_cast<std::uint64_t>(rel);
    }
  }
  if (n < static_cast<std::uint64_t>(rule.max_exact)) return ret + static_cast<std::int64_t>(n);
  // max_exact + long(log(float(n) / max_exact) / log_ratio * (nb - max_exact)),
  // then at most nb - 1. n >= max_exact makes the quotient >= 1, so v >= 0;
  // values too large for int64 (or infinite) are past the last bucket anyway.
  const float quotient = static_cast<float>(n) / static_cast<float>(rule.max_exact);
  const float v = std::log(quotient) / rule.log_ratio * rule.log_buckets;
  if (!(v < 0x1p62f)) return ret + rule.nb - 1;
  const auto large = rule.max_exact + static_cast<std::int64_t>(v);
  return ret + std::min(large, rule.nb - 1);
}

// Platform-independent N(0, 1): the standard-specified
// mt19937_64 stream turned into normals by the Box-Muller transform written
// out (std::normal_distribution's algorithm differs between standard
// libraries).
class NormalGenerator {
 public:
  explicit NormalGenerator(std::uint64_t seed) : engine_(seed) {}

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1] (log(0) must not happen), u2 in [0, 1), 53 bits each.
    const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1p-53;
    const double u2 = static_cast<double>(engine_() >> 11) * 0x1p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace

std::int64_t t5_relative_position_bucket(std::int64_t rel, bool causal, std::int64_t num_buckets,
                                         std::int64_t max_distance) {
  return bucket_of(
      make_bucket_rule("t5_relative_position_bucket", causal, num_buckets, max_distance), rel);
}

RelativePositionBias::RelativePositionBias(float scale, bool causal, std::int64_t num_buckets,
                                           std::int64_t max_distance, std::int64_t heads,
                                           std::uint64_t seed)
    : scale_(scale),
      causal_(causal),
      num_buckets_(num_buckets),
      max_distance_(max_distance),
      heads_(heads) {
  make_bucket_rule("RelativePositionBias", causal, num_buckets, max_distance);
  detail::check_at_least("RelativePositionBias: heads", heads, 1);
  if (!std::isfinite(scale)) {
    std::ostringstream msg;
    msg << "RelativePositionBias: scale must be finite, got " << scale;
    throw std::invalid_argument(msg.str());
  }
  embedding_ = Tensor::empty({num_buckets, heads}, DType::kFloat32);
  NormalGenerator normal(seed);
  float* e = embedding_.mutable_data<float>();
  for (std::int64_t k = 0; k < embedding_.numel(); ++k) {
    e[k] = static_cast<float>(normal.next());
  }
}

namespace {

// The embedding as contiguous float32 [num_buckets, heads], after checking
// that mutable_embedding() has not been given another shape.
Tensor checked_embedding(const Tensor& e, std::int64_t num_buckets, std::int64_t heads) {
  const std::vector<std::int64_t> want = {num_buckets, heads};
  if (e.shape() != want) {
    throw std::invalid_argument("RelativePositionBias: the embedding has shape " +
                                detail::shape_string(e.shape()) + ", expected " +
                                detail::shape_string(want) + " [num_buckets, heads]");
  }
  if (e.dtype() == DType::kFloat32 && e.is_contiguous()) return e;
  return e.to(DType::kFloat32);
}

void check_lengths(const char* who, std::int64_t i, std::int64_t j) {
  if (i < 0 || j < 0) {
    throw std::invalid_argument(std::string(who) + ": lengths must be >= 0, got i = " +
                                std::to_string(i) + ", j = " + std::to_string(j));
  }
}

}  // namespace

Tensor RelativePositionBias::forward(std::int64_t i, std::int64_t j, DType dtype) const {
  check_lengths("RelativePositionBias::forward", i, j);
  check_output_dtype(dtype, "RelativePositionBias::forward");
  const Tensor e = checked_embedding(embedding_, num_buckets_, heads_);
  Tensor out = Tensor::empty({heads_, i, j}, dtype);
  if (i == 0 || j == 0) return out;
  const BucketRule rule =
      make_bucket_rule("RelativePositionBias", causal_, num_buckets_, max_distance_);

  // Entry k of a head's table is the value at c - q_r = k - (j - 1): row r
  // reads the window starting at (i - 1) - r, so element c reads entry
  // i - 1 - r + c, and c - (j - i + r) is that minus (j - 1). The table
  // (i + j - 1 entries per head) is produced whole, or tile by tile when it
  // would be about as large as the output (i >> j, e.g. i = 2e7, j = 1).
  const float* weight = e.data<float>();
  const detail::TableFill fill = [&](std::int64_t k0, std::int64_t n, float* dst) {
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t b = bucket_of(rule, k0 + k - (j - 1));
      for (std::int64_t h = 0; h < heads_; ++h) dst[h * n + k] = weight[b * heads_ + h] * scale_;
    }
  };
  const std::size_t bytes = static_cast<std::size_t>(out.numel()) * dtype_size(dtype);
  detail::expand_generated_table(heads_, i, j, dtype, out.raw_mutable_data(),
                                 bytes >= detail::stream_threshold_bytes(), fill);
  return out;
}

Tensor RelativePositionBias::distance_table(std::int64_t j) const {
  if (j < 1) {
    throw std::invalid_argument("RelativePositionBias::distance_table: j must be >= 1, got " +
                                std::to_string(j));
  }
  const Tensor e = checked_embedding(embedding_, num_buckets_, heads_);
  // 2j - 1 cannot overflow once [heads, j] is known to fit in memory.
  detail::checked_numel({heads_, j}, DType::kFloat32);
  const std::int64_t len = 2 * j - 1;
  Tensor out = Tensor::empty({heads_, len}, DType::kFloat32);
  const BucketRule rule =
      make_bucket_rule("RelativePositionBias", causal_, num_buckets_, max_distance_);
  const float* weight = e.data<float>();
  float* o = out.mutable_data<float>();
  for (std::int64_t k = 0; k < len; ++k) {
    // Entry k holds q_r - c = k - (j - 1), i.e. rel = c - q_r = (j - 1) - k.
    const std::int64_t b = bucket_of(rule, (j - 1) - k);
    for (std::int64_t h = 0; h < heads_; ++h) o[h * len + k] = weight[b * heads_ + h] * scale_;
  }
  return out;
}

Tensor RelativePositionBias::backward_distance_table(std::int64_t j, const Tensor& grad) const {
  if (j < 1) {
    throw std::invalid_argument(
        "RelativePositionBias::backward_distance_table: j must be >= 1, got " + std::to_string(j));
  }
  detail::checked_numel({heads_, j}, DType::kFloat32);
  const std::int64_t len = 2 * j - 1;
  const std::vector<std::int64_t> want = {heads_, len};
  if (grad.shape() != want) {
    throw std::invalid_argument("RelativePositionBias::backward_distance_table: grad has shape " +
                                detail::shape_string(grad.shape()) + ", expected " +
                                detail::shape_string(want) +
                                " [heads, 2j - 1] for j = " + std::to_string(j));
  }
  const Tensor g =
      grad.dtype() == DType::kFloat32 && grad.is_contiguous() ? grad : grad.to(DType::kFloat32);
  const BucketRule rule =
      make_bucket_rule("RelativePositionBias", causal_, num_buckets_, max_distance_);
  Tensor out = Tensor::empty({num_buckets_, heads_}, DType::kFloat32);
  float* o = out.mutable_data<float>();
  std::fill(o, o + out.numel(), 0.0f);
  const float* gp = g.data<float>();
  // Summed per bucket first, scaled once: scale * sum equals the gradient of
  // the forward's weight * scale.
  for (std::int64_t k = 0; k < len; ++k) {
    const std::int64_t b = bucket_of(rule, (j - 1) - k);
    for (std::int64_t h = 0; h < heads_; ++h) o[b * heads_ + h] += gp[h * len + k];
  }
  for (std::int64_t e = 0; e < out.numel(); ++e) o[e] *= scale_;
  return out;
}

TensorMap RelativePositionBias::state_dict() const { return {{kWeightName, embedding_}}; }

void RelativePositionBias::load_state_dict(const TensorMap& state) {
  const std::string who = "RelativePositionBias::load_state_dict: ";
  const auto it = state.find(kWeightName);
  if (it == state.end()) {
    throw std::invalid_argument(who + "missing \"" + kWeightName + "\"" +
                                (state.empty()
                                     ? std::string(" (the state dict is empty)")
                                     : " (got " + detail::quoted_name(state.begin()->first) + ")"));
  }
  for (const auto& [name, t] : state) {
    if (name != kWeightName) {
      throw std::invalid_argument(who + "unexpected " + detail::quoted_name(name) +
                                  " (expected only \"" + kWeightName + "\")");
    }
  }
  const Tensor& t = it->second;
  const std::vector<std::int64_t> want = {num_buckets_, heads_};
  if (t.shape() != want) {
    throw std::invalid_argument(who + "\"" + kWeightName + "\" has shape " +
                                detail::shape_string(t.shape()) + ", expected " +
                                detail::shape_string(want) + " [num_buckets, heads]");
  }
  Tensor copy = t.to(DType::kFloat32);  // a fresh contiguous float32 copy
  const float* v = copy.data<float>();
  for (std::int64_t k = 0; k < copy.numel(); ++k) {
    if (!std::isfinite(v[k])) {
      std::ostringstream msg;
      msg << who << "\"" << kWeightName << "\" has a non-finite value " << v[k] << " at ["
          << k / heads_ << ", " << k % heads_ << "]";
      throw std::invalid_argument(msg.str());
    }
  }
  embedding_ = std::move(copy);
}

// ------------------------------------------------------- float64 reference

namespace {

// Checks scale and j, and that float64 [heads, 2j - 1] fits; returns 2j - 1.
std::int64_t checked_f64_length(const char* who, double scale, std::int64_t heads, std::int64_t j) {
  if (!std::isfinite(scale)) {
    std::ostringstream msg;
    msg << who << ": scale must be finite, got " << scale;
    throw std::invalid_argument(msg.str());
  }
  return detail::checked_table_length(who, heads, j);
}

}  // namespace

Tensor t5_distance_table_f64(const Tensor& embedding, double scale, bool causal,
                             std::int64_t num_buckets, std::int64_t max_distance, std::int64_t j) {
  constexpr const char* kWho = "t5_distance_table_f64";
  const BucketRule rule = make_bucket_rule(kWho, causal, num_buckets, max_distance);
  if (embedding.dtype() != DType::kFloat64 || embedding.dim() != 2 ||
      embedding.size(0) != num_buckets || embedding.size(1) < 1) {
    throw std::invalid_argument(std::string(kWho) + ": embedding must be float64 [num_buckets = " +
                                std::to_string(num_buckets) + ", heads >= 1], got " +
                                dtype_name(embedding.dtype()) + " " +
                                detail::shape_string(embedding.shape()));
  }
  const std::int64_t heads = embedding.size(1);
  const std::int64_t len = checked_f64_length(kWho, scale, heads, j);
  const Tensor e = embedding.is_contiguous() ? embedding : embedding.contiguous_copy();
  const double* w = e.data<double>();
  for (std::int64_t k = 0; k < e.numel(); ++k) {
    if (!std::isfinite(w[k])) {
      throw std::invalid_argument(std::string(kWho) + ": embedding has a non-finite value at [" +
                                  std::to_string(k / heads) + ", " + std::to_string(k % heads) +
                                  "]");
    }
  }
  Tensor out = Tensor::empty({heads, len}, DType::kFloat64);
  double* o = out.mutable_data<double>();
  for (std::int64_t k = 0; k < len; ++k) {
    const std::int64_t b = bucket_of(rule, (j - 1) - k);  // rel = c - q_r = (j - 1) - k
    for (std::int64_t h = 0; h < heads; ++h) o[h * len + k] = w[b * heads + h] * scale;
  }
  return out;
}

Tensor t5_backward_distance_table_f64(const Tensor& grad, double scale, bool causal,
                                      std::int64_t num_buckets, std::int64_t max_distance,
                                      std::int64_t j) {
  constexpr const char* kWho = "t5_backward_distance_table_f64";
  const BucketRule rule = make_bucket_rule(kWho, causal, num_buckets, max_distance);
  const std::int64_t heads = grad.dim() == 2 ? grad.size(0) : 0;
  const std::int64_t len = checked_f64_length(kWho, scale, heads, j);
  if (grad.dtype() != DType::kFloat64 || grad.dim() != 2 || heads < 1 || grad.size(1) != len) {
    throw std::invalid_argument(
        std::string(kWho) + ": grad must be float64 [heads, 2j - 1 = " + std::to_string(len) +
        "] for j = " + std::to_string(j) + ", got " + dtype_name(grad.dtype()) + " " +
        detail::shape_string(grad.shape()));
  }
  const Tensor g = grad.is_contiguous() ? grad : grad.contiguous_copy();
  const double* gp = g.data<double>();
  Tensor out = Tensor::empty({num_buckets, heads}, DType::kFloat64);
  double* o = out.mutable_data<double>();
  std::fill(o, o + out.numel(), 0.0);
  for (std::int64_t k = 0; k < len; ++k) {
    const std::int64_t b = bucket_of(rule, (j - 1) - k);
    for (std::int64_t h = 0; h < heads; ++h) o[b * heads + h] += gp[h * len + k];
  }
  for (std::int64_t e = 0; e < out.numel(); ++e) o[e] *= scale;
  return out;
}

}  // namespace posbias
