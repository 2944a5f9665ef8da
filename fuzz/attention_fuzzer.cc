// Fuzzes attention_forward() (the fused kernel) against attention_reference()
// (the plain path): random shapes (b, h, hk, i, j, d kept small), layouts
// (contiguous, a [b, len, h, d] buffer seen through transpose(1, 2), a slice
// of a wider last dimension), dtypes, causal or not, scale, and bias kinds
// (none, ALiBi, a distance table possibly transposed, a dense bias of any
// broadcastable rank possibly holding -inf). Both must throw
// std::invalid_argument for the same inputs or both return; outputs must
// agree within the documented tolerance (1e-5 + 1e-4 |ref|, relative to the
// magnitude of v, plus one unit in the last place of a 16-bit dtype), and a
// row whose keys are all masked must be zeros in both. Anything else aborts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/attention.h"
#include "posbias/slopes.h"

namespace {

// Reads the input bytes in order; zeros after the end.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::int64_t range(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(u8() % static_cast<unsigned>(hi - lo + 1));
  }
  bool flag() { return (u8() & 1) != 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = (v << 8) | u8();
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// A small deterministic generator for the values (splitmix64).
class Values {
 public:
  explicit Values(std::uint64_t seed, float magnitude) : s_(seed), magnitude_(magnitude) {}
  float next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<float>((2 * u - 1) * magnitude_);
  }

 private:
  std::uint64_t s_;
  float magnitude_;
};

void fill(posbias::Tensor& t, Values& values) {
  const std::int64_t n = t.numel();
  switch (t.dtype()) {
    case posbias::DType::kFloat32: {
      float* p = t.mutable_data<float>();
      for (std::int64_t k = 0; k < n; ++k) p[k] = values.next();
      break;
    }
    case posbias::DType::kBFloat16: {
      auto* p = t.mutable_data<posbias::bfloat16>();
      for (std::int64_t k = 0; k < n; ++k) p[k] = posbias::to_bfloat16(values.next());
      break;
    }
    case posbias::DType::kFloat16: {
      auto* p = t.mutable_data<posbias::float16>();
      for (std::int64_t k = 0; k < n; ++k) p[k] = posbias::to_float16(values.next());
      break;
    }
    default:  // the fuzzer builds only the three float dtypes
      break;
  }
}

// A [b, heads, len, d] operand in one of three layouts.
posbias::Tensor make_operand(std::int64_t b, std::int64_t heads, std::int64_t len, std::int64_t d,
                             posbias::DType dtype, int layout, Values& values) {
  if (layout == 1) {  // [b, len, heads, d] seen as [b, heads, len, d]
    posbias::Tensor t = posbias::Tensor::empty({b, len, heads, d}, dtype);
    fill(t, values);
    return t.transpose(1, 2);
  }
  if (layout == 2) {  // a slice of a wider last dimension: gaps between rows
    posbias::Tensor t = posbias::Tensor::empty({b, heads, len, d + 3}, dtype);
    fill(t, values);
    return t.slice(3, 1, 1 + d);
  }
  posbias::Tensor t = posbias::Tensor::empty({b, heads, len, d}, dtype);
  fill(t, values);
  return t;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "attention fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::int64_t b = in.range(0, 2);
  const std::int64_t hk = in.range(1, 3);
  const std::int64_t group = in.range(1, 3);
  // Sometimes a head count that does not divide (an error both must raise).
  const std::int64_t h = hk * group + (in.u8() == 0xFF ? 1 : 0);
  const std::int64_t i = in.range(0, 40);
  // An input of 64 bytes or more that ends in 0xA5 has 160 keys more:
  // several key blocks, so that the blocked path's flushed tiles (a steep
  // ALiBi head far from the diagonal) skip some (seeds long_keys_*).
  const bool long_keys = size >= 64 && data[size - 1] == 0xA5;
  const std::int64_t j = in.range(0, 40) + (long_keys ? 160 : 0);
  const std::int64_t d = in.range(1, 20);
  const auto dtype = static_cast<posbias::DType>(in.range(0, 2));
  const bool causal = in.flag();
  const int layout_q = static_cast<int>(in.range(0, 2));
  const int layout_kv = static_cast<int>(in.range(0, 2));
  const int kind = static_cast<int>(in.range(0, 3));
  const int magnitude_code = static_cast<int>(in.range(0, 3));
  const float magnitude = magnitude_code == 0   ? 0.5f
                          : magnitude_code == 1 ? 2.f
                          : magnitude_code == 2 ? 4.f
                                                : 8.f;
  std::optional<float> scale;
  const std::uint8_t scale_code = in.u8();
  if (scale_code < 64) scale = static_cast<float>(scale_code) / 16.f - 2.f;
  const std::uint64_t seed = in.u64();

  Values values(seed, magnitude);
  const posbias::Tensor q = make_operand(b, h, i, d, dtype, layout_q, values);
  const posbias::Tensor k = make_operand(b, hk, j, d, dtype, layout_kv, values);
  const posbias::Tensor v = make_operand(b, hk, j, d, dtype, layout_kv, values);

  posbias::AttentionBias bias;
  Values bias_values(seed ^ 0x5555, 2.f);
  if (kind == 1) {
    std::vector<float> slopes = posbias::alibi_slopes(h);
    if (in.flag()) slopes[0] *= 1024.f;  // a steep head
    bias = posbias::AttentionBias::alibi(slopes);
  } else if (kind == 2) {
    const std::int64_t n = std::max<std::int64_t>(2 * j - 1, 1) + in.range(0, 2);
    posbias::Tensor table;
    if (in.flag()) {
      table = posbias::Tensor::empty({n, h}, posbias::DType::kFloat32).transpose(0, 1);
    } else {
      table = posbias::Tensor::empty({h, n}, posbias::DType::kFloat32);
    }
    float* p = table.mutable_data<float>();
    for (std::int64_t e = 0; e < h * n; ++e) p[e] = bias_values.next();
    bias = posbias::AttentionBias::distance_table(table);
  } else if (kind == 3) {
    const std::int64_t full[4] = {b, h, i, j};
    const int rank = static_cast<int>(in.range(1, 4));
    const std::uint8_t broadcast = in.u8();
    std::vector<std::int64_t> shape;
    for (int a = 4 - rank; a < 4; ++a) shape.push_back(((broadcast >> a) & 1) ? 1 : full[a]);
    posbias::Tensor dense = posbias::Tensor::empty(shape, posbias::DType::kFloat32);
    const std::uint8_t mask_rate = in.u8();
    float* p = dense.mutable_data<float>();
    for (std::int64_t e = 0; e < dense.numel(); ++e) {
      const float x = bias_values.next();
      // mask_rate / 256 of the entries are -inf (padding masks; whole rows
      // masked when it is high).
      p[e] = (x + 2.f) * 64.f < static_cast<float>(mask_rate) ? -INFINITY : x;
    }
    bias = posbias::AttentionBias::dense_bias(dense);
  }
  posbias::AttentionOptions options;
  options.causal = causal;
  options.scale = scale;

  posbias::Tensor got, want;
  std::string got_error, want_error;
  try {
    got = posbias::attention_forward(q, k, v, bias, options);
  } catch (const std::invalid_argument& e) {
    got_error = e.what();
  }
  try {
    want = posbias::attention_reference(q, k, v, bias, options);
  } catch (const std::invalid_argument& e) {
    want_error = e.what();
  }
  // The same check must fail in both; the messages differ only in the
  // function name before the first ": ".
  const auto after_name = [](const std::string& m) {
    const std::size_t colon = m.find(": ");
    return colon == std::string::npos ? m : m.substr(colon + 2);
  };
  if (after_name(got_error) != after_name(want_error)) {
    fail("the paths disagree on the error: fused [" + got_error + "], reference [" + want_error +
         "]");
  }
  if (!got_error.empty()) return 0;
  if (got.shape() != want.shape() || got.dtype() != want.dtype() ||
      got.shape() != std::vector<std::int64_t>{b, h, i, d}) {
    fail("shapes or dtypes differ");
  }
  const std::vector<float> g = got.to_float_vector();
  const std::vector<float> w = want.to_float_vector();
  // Float32 rounding of the scores alone moves the output by about
  // |score| 2^-24 |v| (attention.h): allow a few ulps of the largest score.
  float max_bias = 0.f;
  if (kind == 1) {
    for (float m : bias.slopes) {
      max_bias = std::fmax(max_bias, std::fabs(m) * static_cast<float>(i + j));
    }
  } else if (kind == 2) {
    max_bias = 2.f;
  } else if (kind == 3) {
    max_bias = 2.f;
  }
  const float score_bound = std::fabs(scale.value_or(1.f / std::sqrt(static_cast<float>(d)))) *
                                static_cast<float>(d) * magnitude * magnitude +
                            max_bias;
  const float ulp = dtype == posbias::DType::kFloat32   ? 0.f
                    : dtype == posbias::DType::kFloat16 ? 0x1.0p-10f
                                                        : 0x1.0p-7f;
  for (std::size_t e = 0; e < g.size(); ++e) {
    if (!std::isfinite(g[e]) || !std::isfinite(w[e])) {
      fail("a non-finite output from finite inputs at element " + std::to_string(e));
    }
    const float tol = 1e-5f * magnitude + 1e-4f * std::fabs(w[e]) +
                      score_bound * 0x1.0p-21f * magnitude +
                      ulp * std::fmax(std::fabs(w[e]), std::fabs(g[e]));
    if (std::fabs(g[e] - w[e]) > tol) {
      fail("element " + std::to_string(e) + ": fused " + std::to_string(g[e]) + ", reference " +
           std::to_string(w[e]) + " (b " + std::to_string(b) + " h " + std::to_string(h) + " hk " +
           std::to_string(hk) + " i " + std::to_string(i) + " j " + std::to_string(j) + " d " +
           std::to_string(d) + " kind " + std::to_string(kind) + " causal " +
           std::to_string(causal) + ")");
    }
  }
  return 0;
}
