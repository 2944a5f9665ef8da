#include "attention_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "posbias/dpb.h"
#include "posbias/limits.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"

namespace posbias::cli {
namespace {

// The DynamicPositionBias width used for --bias table --table-from dpb.
constexpr std::int64_t kDpbDim = 16;

// The relative part of the --check tolerance: the kernels' 1e-4, plus for a
// 16-bit output one unit in the last place of |reference| (fused and
// reference agree in float32, then each rounds once to the output dtype).
double check_rtol(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 1e-4 + 0x1.0p-7;
    case DType::kFloat16:
      return 1e-4 + 0x1.0p-10;
    default:  // float32 (the only other dtype attention outputs)
      break;
  }
  return 1e-4;
}
constexpr double kCheckAtol = 1e-5;

struct CheckResult {
  double max_abs_diff = 0.0;
  std::int64_t outside = 0;  // elements outside the tolerance (NaN mismatches count)
  std::int64_t first = -1;   // flat index of the first of them
};

CheckResult compare_outputs(const std::vector<float>& a, const std::vector<float>& b, DType dtype) {
  const double rtol = check_rtol(dtype);
  CheckResult r;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const double x = a[k];
    const double y = b[k];
    bool ok = false;
    if (std::isnan(x) || std::isnan(y)) {
      ok = std::isnan(x) && std::isnan(y);
    } else if (!std::isfinite(x) || !std::isfinite(y)) {
      ok = x == y;
    } else {
      const double diff = std::fabs(x - y);
      r.max_abs_diff = std::max(r.max_abs_diff, diff);
      ok = diff <= kCheckAtol + rtol * std::fabs(y);
    }
    if (!ok) {
      if (r.outside == 0) r.first = static_cast<std::int64_t>(k);
      ++r.outside;
    }
  }
  return r;
}

std::string check_line(const CheckResult& r, const std::vector<float>& a,
                       const std::vector<float>& b, DType dtype) {
  std::string s = "max |fused - reference| " + number(r.max_abs_diff, "%.3g") + ", tolerance " +
                  number(kCheckAtol, "%g") + " + " + number(check_rtol(dtype), "%.6g") +
                  " |reference|";
  if (r.outside == 0) return "ok, " + s;
  const auto k = static_cast<std::size_t>(r.first);
  return "FAILED, " + s + ": " + std::to_string(r.outside) + " of " + std::to_string(a.size()) +
         " elements outside it, the first at flat index " + std::to_string(r.first) + ": fused " +
         format_float_roundtrip(a[k]) + ", reference " + format_float_roundtrip(b[k]);
}

}  // namespace

std::string shape_list(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t x = 0; x < shape.size(); ++x) s += (x ? ", " : "") + std::to_string(shape[x]);
  return s + "]";
}

std::string int_list(const std::vector<std::int64_t>& values) {
  std::string s;
  for (std::size_t x = 0; x < values.size(); ++x) s += (x ? "," : "") + std::to_string(values[x]);
  return s;
}

std::string number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void require_nonnegative(const char* name, std::int64_t value) {
  if (value < 0) {
    throw std::invalid_argument(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
}

DType kv_dtype_of(const AttentionArgs& a, DType q_dtype) {
  return a.kv_dtype_option->count() > 0 ? parse_dtype(a.kv_dtype) : q_dtype;
}

AttentionOptions make_options(const AttentionArgs& a) {
  AttentionOptions options;
  options.causal = a.causal;
  options.scale = a.scale;
  options.q_offset = a.q_offset;
  if (!a.window.empty()) {
    if (a.window.size() != 2) {
      throw std::invalid_argument("--window takes two values L,R (-1: unbounded), got " +
                                  std::to_string(a.window.size()) + ": " + int_list(a.window));
    }
    options.window.left = a.window[0];
    options.window.right = a.window[1];
  }
  if (a.softcap) options.softcap = *a.softcap;
  return options;
}

AttentionBias make_bias(const AttentionArgs& a, std::int64_t h, std::int64_t sequences,
                        std::int64_t length, std::uint64_t seed) {
  if (a.bias == "alibi") {
    if (a.slopes_option->count() > 0) return AttentionBias::alibi(a.slopes);
    std::vector<float> slopes = alibi_slopes(h);
    if (!a.slopes_per_sequence) return AttentionBias::alibi(slopes);
    std::vector<float> all;
    all.reserve(static_cast<std::size_t>(std::max<std::int64_t>(0, sequences * h)));
    for (std::int64_t s = 0; s < sequences; ++s) {
      for (float x : slopes) all.push_back(x * (1.0f + 0.5f * static_cast<float>(s)));
    }
    return AttentionBias::alibi(std::move(all));
  }
  if (a.bias == "table") {
    // No keys: nothing reads the table; the smallest odd one, [h, 1] of zeros.
    if (length == 0) return AttentionBias::distance_table(Tensor::full({h, 1}, 0.0f));
    if (a.table_from == "t5") {
      return AttentionBias::distance_table(
          RelativePositionBias(1.0f, a.causal, 32, 128, h, seed).distance_table(length));
    }
    return AttentionBias::distance_table(
        DynamicPositionBias(kDpbDim, h, seed).distance_table(length));
  }
  return AttentionBias::none();
}

std::string options_text(const AttentionArgs& a, std::int64_t d) {
  const float scale = a.scale ? *a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  std::string s = std::string(a.causal ? "causal" : "not causal") + "; bias " + a.bias +
                  (a.bias == "table" ? " (" + a.table_from + ")" : "") +
                  (a.slopes_per_sequence ? " per sequence" : "") + "; scale " +
                  format_float_roundtrip(scale);
  if (!a.window.empty()) s += "; window " + int_list(a.window);
  if (a.softcap) s += "; softcap " + format_float_roundtrip(*a.softcap);
  return s;
}

// Saturating arithmetic for byte counts: a sum or product past uint64
// becomes kSaturated, which exceeds any machine's memory.
constexpr std::uint64_t kSaturated = ~std::uint64_t{0};

std::uint64_t times(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}

std::uint64_t plus(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}

std::uint64_t product(std::initializer_list<std::int64_t> extents) {
  std::uint64_t n = 1;
  for (std::int64_t e : extents) n = times(n, static_cast<std::uint64_t>(e));
  return n;
}

void check_memory(const std::string& what, std::uint64_t bytes) {
  const std::uint64_t memory = posbias::physical_memory_bytes();
  if (memory == 0 || bytes <= memory) return;
  throw std::length_error(what + " needs " +
                          (bytes == kSaturated
                               ? std::string("more than 1.8e+19")
                               : "about " + number(static_cast<double>(bytes), "%.4g")) +
                          " bytes, more than this machine's " +
                          number(static_cast<double>(memory), "%.4g") + " bytes of memory");
}

int report_attention(const AttentionArgs& a, const std::string& call, const Tensor& result,
                     double ms, const std::optional<Tensor>& reference,
                     const std::string& inputs_line, std::ostream& out) {
  const std::vector<float> values = result.to_float_vector();
  std::optional<std::string> check;
  bool check_failed = false;
  if (reference) {
    const std::vector<float> want = reference->to_float_vector();
    const CheckResult r = compare_outputs(values, want, reference->dtype());
    check = check_line(r, values, want, reference->dtype());
    check_failed = r.outside > 0;
  }
  if (a.format != "summary") {
    print_tensor(out, result, a.format);
    if (check_failed) {
      out.flush();
      std::cerr << "posbias: check failed: " << *check << std::endl;
    }
    return check_failed ? 1 : 0;
  }
  double sum = 0.0;
  double max_abs = 0.0;
  for (float x : values) {
    sum += x;
    max_abs = std::isnan(x) ? x : std::max(max_abs, static_cast<double>(std::fabs(x)));
  }
  out << call << ": out " << shape_list(result.shape()) << " " << dtype_name(result.dtype()) << "\n"
      << "inputs: " << inputs_line << "\n"
      << "checksum: sum " << number(sum) << ", max |x| " << number(max_abs) << "\n"
      << "time: " << number(ms, "%.3f") << " ms\n";
  if (check) out << "check: " << *check << "\n";
  return check_failed ? 1 : 0;
}

}  // namespace posbias::cli
