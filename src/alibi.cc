// Front functions of the ALiBi part: argument checks, output sizing, the
// modules' caches, and dispatch to the kernel in kernels/alibi_fill.cc.
#include "posbias/alibi.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "checks.h"
#include "kernels/alibi_fill.h"
#include "kernels/toeplitz.h"
#include "posbias/slopes.h"

namespace posbias {
namespace {

void check_lengths(const char* who, std::int64_t i, std::int64_t j) {
  if (i < 0 || j < 0) {
    throw std::invalid_argument(std::string(who) + ": lengths must be >= 0, got i = " +
                                std::to_string(i) + ", j = " + std::to_string(j));
  }
}

void check_slopes_and_total(const char* who, const std::vector<float>& slopes,
                            std::int64_t total_heads) {
  if (slopes.empty()) {
    throw std::invalid_argument(std::string(who) + ": need at least one slope, got 0");
  }
  const auto heads = static_cast<std::int64_t>(slopes.size());
  if (total_heads < heads) {
    throw std::invalid_argument(std::string(who) +
                                ": total_heads must be >= heads, got total_heads = " +
                                std::to_string(total_heads) + ", heads = " + std::to_string(heads));
  }
  detail::check_finite_slopes(who, slopes);
}

// Per-head multipliers of the bottom-right ALiBi form: -slope, then zeros.
std::vector<float> negated_with_zero_heads(const std::vector<float>& slopes,
                                           std::int64_t total_heads) {
  std::vector<float> scale(static_cast<std::size_t>(total_heads), 0.0f);
  for (std::size_t h = 0; h < slopes.size(); ++h) scale[h] = -slopes[h];
  return scale;
}

// float64 (the reference path): scale * dist in double, exact (a float32
// slope times an integer distance below 2^29 fits in 53 bits).
void fill_f64(const detail::AlibiFillParams& p) {
  auto* out = static_cast<double*>(p.out);
  const std::int64_t rows = p.heads * p.rows;
#pragma omp parallel for schedule(static) if (rows * p.cols >= (1 << 16))
  for (std::int64_t flat = 0; flat < rows; ++flat) {
    const std::int64_t h = flat / p.rows, q = p.q0 + flat % p.rows;
    const double s = p.scale[h];
    for (std::int64_t c = 0; c < p.cols; ++c) {
      const std::int64_t diff = c - q;
      const std::int64_t dist =
          p.kind == detail::DistanceKind::kAbs ? std::llabs(diff) : (diff < 0 ? -diff : 0);
      double v = s * static_cast<double>(dist);
      if (p.canonical_zero) v += 0.0;
      out[flat * p.cols + c] = v;
    }
  }
}

void fill(const detail::AlibiFillParams& p) {
  if (p.dtype == DType::kFloat64) {
    fill_f64(p);
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(p.heads) * static_cast<std::size_t>(p.rows) *
                            static_cast<std::size_t>(p.cols) * dtype_size(p.dtype);
  detail::alibi_fill(p, bytes >= detail::stream_threshold_bytes());
}

void fill_bottom_right(const std::vector<float>& scale, std::int64_t i, std::int64_t j, DType dtype,
                       void* out) {
  detail::AlibiFillParams p;
  p.scale = scale.data();
  p.heads = static_cast<std::int64_t>(scale.size());
  p.rows = i;
  p.cols = j;
  p.q0 = j - i;
  p.kind = detail::DistanceKind::kAbs;
  p.canonical_zero = true;
  p.dtype = dtype;
  p.out = out;
  fill(p);
}

}  // namespace

Tensor alibi_bias(const std::vector<float>& slopes, std::int64_t total_heads, std::int64_t i,
                  std::int64_t j, DType dtype) {
  check_slopes_and_total("alibi_bias", slopes, total_heads);
  check_float_dtype(dtype, "alibi_bias");
  check_lengths("alibi_bias", i, j);
  Tensor out = Tensor::empty({total_heads, i, j}, dtype);
  // Nothing to write: return before the per-head multipliers (total_heads of
  // them) are built, and before any product of the extents is formed.
  if (out.numel() == 0) return out;
  fill_bottom_right(negated_with_zero_heads(slopes, total_heads), i, j, dtype,
                    out.raw_mutable_data());
  return out;
}

void alibi_bias_into(const std::vector<float>& slopes, std::int64_t total_heads, std::int64_t i,
                     std::int64_t j, DType dtype, void* out) {
  check_slopes_and_total("alibi_bias_into", slopes, total_heads);
  check_float_dtype(dtype, "alibi_bias_into");
  check_lengths("alibi_bias_into", i, j);
  const std::int64_t n = detail::checked_numel({total_heads, i, j}, dtype);
  if (out == nullptr && n > 0) {
    throw std::invalid_argument("alibi_bias_into: out is null for " + std::to_string(n) +
                                " elements");
  }
  if (n == 0) return;
  if (reinterpret_cast<std::uintptr_t>(out) % dtype_size(dtype) != 0) {
    std::ostringstream msg;
    msg << "alibi_bias_into: out (" << out << ") is not aligned to the " << dtype_size(dtype)
        << "-byte elements of " << dtype_name(dtype);
    throw std::invalid_argument(msg.str());
  }
  fill_bottom_right(negated_with_zero_heads(slopes, total_heads), i, j, dtype, out);
}

Tensor alibi_bias_custom_pos(const std::vector<float>& slopes, std::int64_t total_heads,
                             const std::vector<std::int64_t>& q_pos,
                             const std::vector<std::int64_t>& k_pos, DType dtype) {
  check_slopes_and_total("alibi_bias_custom_pos", slopes, total_heads);
  check_float_dtype(dtype, "alibi_bias_custom_pos");
  const auto i = static_cast<std::int64_t>(q_pos.size());
  const auto j = static_cast<std::int64_t>(k_pos.size());
  if (i > 0 && j > 0) {
    // Every difference k - q must be representable.
    const auto [qmin, qmax] = std::minmax_element(q_pos.begin(), q_pos.end());
    const auto [kmin, kmax] = std::minmax_element(k_pos.begin(), k_pos.end());
    std::int64_t unused;
    if (__builtin_sub_overflow(*kmax, *qmin, &unused) ||
        __builtin_sub_overflow(*kmin, *qmax, &unused) ||
        __builtin_sub_overflow(*qmax, *kmin, &unused) ||
        __builtin_sub_overflow(*qmin, *kmax, &unused)) {
      throw std::invalid_argument(
          "alibi_bias_custom_pos: position differences overflow int64 (q in [" +
          std::to_string(*qmin) + ", " + std::to_string(*qmax) + "], k in [" +
          std::to_string(*kmin) + ", " + std::to_string(*kmax) + "])");
    }
  }
  Tensor out = Tensor::empty({total_heads, i, j}, dtype);
  if (out.numel() == 0) return out;
  const std::vector<float> scale = negated_with_zero_heads(slopes, total_heads);
  const std::int64_t rows = total_heads * i;
  auto* base = static_cast<unsigned char*>(out.raw_mutable_data());
  const std::size_t row_bytes = static_cast<std::size_t>(j) * dtype_size(dtype);
  const bool f64 = dtype == DType::kFloat64;  // the reference path: in double
#pragma omp parallel if (rows * j >= (1 << 16))
  {
    std::vector<float> values(static_cast<std::size_t>(j));  // one row, float32
#pragma omp for schedule(static)
    for (std::int64_t flat = 0; flat < rows; ++flat) {
      const std::int64_t h = flat / i;
      const std::int64_t q = q_pos[static_cast<std::size_t>(flat - h * i)];
      const float s = scale[static_cast<std::size_t>(h)];
      auto* row = base + static_cast<std::size_t>(flat) * row_bytes;
      for (std::int64_t c = 0; c < j; ++c) {
        const std::int64_t diff = k_pos[static_cast<std::size_t>(c)] - q;
        const std::int64_t dist = diff < 0 ? -diff : diff;
        if (f64) {
          reinterpret_cast<double*>(row)[c] =
              static_cast<double>(s) * static_cast<double>(dist) + 0.0;
        } else {
          values[static_cast<std::size_t>(c)] = s * static_cast<float>(dist) + 0.0f;
        }
      }
      if (!f64) detail::convert_floats(values.data(), values.size(), dtype, row);
    }
  }
  return out;
}

Tensor alibi_distance_table(const std::vector<float>& slopes, std::int64_t j,
                            bool signed_distances) {
  const char* who = "alibi_distance_table";
  if (slopes.empty()) {
    throw std::invalid_argument(std::string(who) + ": need at least one slope, got 0");
  }
  detail::check_at_least("alibi_distance_table: j", j, 1);
  detail::check_finite_slopes(who, slopes);
  std::int64_t len = 0;
  if (__builtin_mul_overflow(j, std::int64_t{2}, &len)) {
    throw std::length_error(
        std::string(who) +
        ": the table length 2j - 1 overflows int64 for j = " + std::to_string(j));
  }
  len -= 1;
  const auto heads = static_cast<std::int64_t>(slopes.size());
  // Tensor::empty checks the size (std::length_error) before allocating.
  Tensor out = Tensor::empty({heads, len}, DType::kFloat32);
  float* o = out.mutable_data<float>();
  for (std::int64_t h = 0; h < heads; ++h) {
    const float neg = -slopes[static_cast<std::size_t>(h)];
    float* row = o + h * len;
    for (std::int64_t e = 0; e < len; ++e) {
      const std::int64_t d = e - (j - 1);  // q - c
      const std::int64_t used = signed_distances ? (d < 0 ? -d : d) : (d > 0 ? d : 0);
      row[e] = used == 0 ? 0.0f : neg * static_cast<float>(used);
    }
  }
  return out;
}

// ------------------------------------------------------- AlibiPositionalBias

AlibiPositionalBias::AlibiPositionalBias(std::int64_t heads,
                                         std::optional<std::int64_t> total_heads, DType dtype)
    : AlibiPositionalBias(
          heads, total_heads,
          (detail::check_at_least("AlibiPositionalBias: heads", heads, 1), alibi_slopes(heads)),
          dtype) {}

AlibiPositionalBias::AlibiPositionalBias(std::int64_t heads,
                                         std::optional<std::int64_t> total_heads,
                                         std::vector<float> slopes, DType dtype)
    : heads_(heads),
      total_heads_(total_heads.value_or(heads)),
      slopes_(std::move(slopes)),
      dtype_(dtype) {
  check_float_dtype(dtype_, "AlibiPositionalBias");
  detail::check_at_least("AlibiPositionalBias: heads", heads_, 1);
  if (static_cast<std::int64_t>(slopes_.size()) != heads_) {
    throw std::invalid_argument("AlibiPositionalBias: expected " + std::to_string(heads_) +
                                " slopes (one per head), got " + std::to_string(slopes_.size()));
  }
  if (total_heads_ < heads_) {
    throw std::invalid_argument(
        "AlibiPositionalBias: total_heads must be >= heads, got total_heads = " +
        std::to_string(total_heads_) + ", heads = " + std::to_string(heads_));
  }
  detail::check_finite_slopes("AlibiPositionalBias", slopes_);
}

Tensor AlibiPositionalBias::forward(std::int64_t i, std::int64_t j) const {
  check_lengths("AlibiPositionalBias::forward", i, j);
  DType dtype;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dtype = dtype_;
    if (has_cache_) {
      const std::int64_t rows = cache_.size(1);
      const std::int64_t cols = cache_.size(2);
      if (i <= rows && j <= cols) {
        // Bottom-right block: row r of the block is cached row rows - i + r,
        // at position (cols - rows) + (rows - i + r) = cols - i + r; column
        // c is cached column cols - j + c. Their distance equals that of a
        // fresh [i, j] build, so the view is exact.
        return cache_.slice(1, rows - i, rows).slice(2, cols - j, cols);
      }
    }
  }
  Tensor result = alibi_bias(slopes_, total_heads_, i, j, dtype);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t bytes = static_cast<std::size_t>(result.numel()) * dtype_size(dtype);
    const bool larger = !has_cache_ || result.numel() >= cache_.numel();
    if (dtype == dtype_ && larger && bytes <= cache_limit_bytes_) {
      cache_ = result;
      has_cache_ = true;
    }
  }
  return result;
}

Tensor AlibiPositionalBias::get_bias(std::int64_t i, std::int64_t j) const {
  check_lengths("AlibiPositionalBias::get_bias", i, j);
  return alibi_bias({1.0f}, 1, i, j, dtype());
}

Tensor AlibiPositionalBias::forward_custom_pos(const std::vector<std::int64_t>& q_pos,
                                               const std::vector<std::int64_t>& k_pos) const {
  return alibi_bias_custom_pos(slopes_, total_heads_, q_pos, k_pos, dtype());
}

DType AlibiPositionalBias::dtype() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dtype_;
}

void AlibiPositionalBias::set_dtype(DType dtype) {
  check_float_dtype(dtype, "AlibiPositionalBias::set_dtype");
  std::lock_guard<std::mutex> lock(mutex_);
  if (dtype != dtype_) {
    dtype_ = dtype;
    cache_ = Tensor();
    has_cache_ = false;
  }
}

std::vector<std::int64_t> AlibiPositionalBias::cached_shape() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!has_cache_) return {};
  return cache_.shape();
}

void AlibiPositionalBias::clear_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_ = Tensor();
  has_cache_ = false;
}

std::size_t AlibiPositionalBias::cache_limit_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_limit_bytes_;
}

void AlibiPositionalBias::set_cache_limit_bytes(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_limit_bytes_ = bytes;
  if (has_cache_ && static_cast<std::size_t>(cache_.numel()) * dtype_size(dtype_) > bytes) {
    cache_ = Tensor();
    has_cache_ = false;
  }
}

// ------------------------------------------------------------------ AlibiBias

std::vector<float> AlibiBias::default_slopes(std::int64_t n_heads) {
  detail::check_at_least("AlibiBias: n_heads", n_heads, 1);
  detail::check_at_most("AlibiBias: n_heads", n_heads, detail::kMaxHeads);
  // torch.linspace(start, end, steps) for float32 (aten/src/ATen/native/cpu/
  // RangeFactoriesKernel.cpp): step = (end - start) / (steps - 1) in float;
  // the first half counts up from start, the second half down from end.
  const float start = -0.05f;
  const float end = -0.5f;
  std::vector<float> out(static_cast<std::size_t>(n_heads));
  if (n_heads == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(n_heads - 1);
  const std::int64_t halfway = n_heads / 2;
  for (std::int64_t k = 0; k < n_heads; ++k) {
    out[static_cast<std::size_t>(k)] = k < halfway
                                           ? start + step * static_cast<float>(k)
                                           : end - step * static_cast<float>(n_heads - k - 1);
  }
  return out;
}

AlibiBias::AlibiBias(std::int64_t n_heads, bool causal)
    : AlibiBias(n_heads, causal, default_slopes(n_heads)) {}

AlibiBias::AlibiBias(std::int64_t n_heads, bool causal, std::vector<float> slopes)
    : n_heads_(n_heads), causal_(causal), slopes_(std::move(slopes)) {
  detail::check_at_least("AlibiBias: n_heads", n_heads_, 1);
  if (static_cast<std::int64_t>(slopes_.size()) != n_heads_) {
    throw std::invalid_argument(
        "AlibiBias: slopes must have n_heads = " + std::to_string(n_heads_) + " entries, got " +
        std::to_string(slopes_.size()));
  }
  detail::check_finite_slopes("AlibiBias", slopes_);
}

Tensor AlibiBias::build(std::int64_t q_len, std::int64_t k_len, DType dtype) const {
  check_lengths("AlibiBias::build", q_len, k_len);
  check_float_dtype(dtype, "AlibiBias::build");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (has_cache_ && cached_q_ == q_len && cached_k_ == k_len && cached_dtype_ == dtype) {
      return cache_;
    }
  }
  Tensor out = Tensor::empty({1, n_heads_, q_len, k_len}, dtype);
  if (out.numel() > 0) {
    detail::AlibiFillParams p;
    p.scale = slopes_.data();
    p.heads = n_heads_;
    p.rows = q_len;
    p.cols = k_len;
    p.q0 = 0;
    p.kind = causal_ ? detail::DistanceKind::kCausalClamp : detail::DistanceKind::kAbs;
    p.canonical_zero = false;  // slope * 0 keeps its sign, as in the seed's code
    p.dtype = dtype;
    p.out = out.raw_mutable_data();
    fill(p);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_ = out;
    has_cache_ = true;
    cached_q_ = q_len;
    cached_k_ = k_len;
    cached_dtype_ = dtype;
  }
  return out;
}

}  // namespace posbias
