// `posbias attention`: attention_forward (the fused kernel) on seeded random
// or given inputs, with any of its bias kinds; a summary (checksum, time) or
// the output tensor, and optionally a check against attention_reference.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "posbias/limits.h"
#include "posbias/limits.h"
#include "commands.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

struct AttentionArgs {
  std::optional<std::int64_t> batch;
  std::optional<std::int64_t> heads;
  std::optional<std::int64_t> kv_heads;
  std::optional<std::int64_t> i;
  std::optional<std::int64_t> j;
  std::optional<std::int64_t> d;
  bool causal = false;
  std::optional<float> scale;
  std::string bias = "none";
  std::string table_from = "dpb";
  std::vector<float> slopes;
  CLI::Option* slopes_option = nullptr;
  CLI::Option* table_from_option = nullptr;
  CLI::Option* dtype_option = nullptr;
  std::string seed = "0";
  std::string dtype = "float32";
  std::string format = "summary";
  std::string inputs;
  bool check = false;
};

// The DynamicPositionBias width used for --bias table --table-from dpb.
constexpr std::int64_t kDpbDim = 16;

std::string shape_list(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t x = 0; x < shape.size(); ++x) s += (x ? ", " : "") + std::to_string(shape[x]);
  return s + "]";
}

std::string number(double v, const char* format = "%.9g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

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

CheckResult compare_outputs(const Tensor& fused, const Tensor& reference) {
  const std::vector<float> a = fused.to_float_vector();
  const std::vector<float> b = reference.to_float_vector();
  const double rtol = check_rtol(reference.dtype());
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

std::string check_line(const CheckResult& r, const Tensor& fused, const Tensor& reference) {
  std::string s = "max |fused - reference| " + number(r.max_abs_diff, "%.3g") + ", tolerance " +
                  number(kCheckAtol, "%g") + " + " + number(check_rtol(reference.dtype()), "%.6g") +
                  " |reference|";
  if (r.outside == 0) return "ok, " + s;
  const std::vector<float> a = fused.to_float_vector();
  const std::vector<float> b = reference.to_float_vector();
  const auto k = static_cast<std::size_t>(r.first);
  return "FAILED, " + s + ": " + std::to_string(r.outside) + " of " + std::to_string(a.size()) +
         " elements outside it, the first at flat index " + std::to_string(r.first) + ": fused " +
         format_float_roundtrip(a[k]) + ", reference " + format_float_roundtrip(b[k]);
}

void require_nonnegative(const char* name, std::int64_t value) {
  if (value < 0) {
    throw std::invalid_argument(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
}

// "q [b, h, i, d], k [...], v [...]", as the library's messages name them.
std::string shapes_text(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                        const std::vector<std::int64_t>& v) {
  return "q " + shape_list(q) + ", k " + shape_list(k) + ", v " + shape_list(v);
}

// The library ends its argument errors with the shapes it was given,
// " (q [...], k [...], v [...])". Rethrows `e` ending with the run's
// `shapes` instead of the library's (the probe's b = 0 are not the run's)
// or, should a message name none, added, so that every attention error
// names the shapes.
[[noreturn]] void throw_with_shapes(const std::invalid_argument& e, const std::string& shapes) {
  std::string message = e.what();
  const std::size_t at = message.rfind(" (q [");
  if (at != std::string::npos && message.back() == ')') message.resize(at);
  throw std::invalid_argument(message + " (" + shapes + ")");
}

// The library's argument checks of attention_forward, run on empty (b = 0)
// tensors of the shapes and dtypes of q, k and v (4-d), before anything
// large is built or drawn; an error names the run's shapes.
void probe_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBias& bias,
                     const AttentionOptions& options) {
  const auto empty_like = [](const Tensor& t) {
    return Tensor::empty({0, t.size(1), t.size(2), t.size(3)}, t.dtype());
  };
  try {
    attention_forward(empty_like(q), empty_like(k), empty_like(v), bias, options);
  } catch (const std::invalid_argument& e) {
    throw_with_shapes(e, shapes_text(q.shape(), k.shape(), v.shape()));
  }
}

// q, k, v (and "bias" for --bias dense) from a safetensors file.
struct GivenInputs {
  Tensor q, k, v, dense;
};

GivenInputs load_inputs(const AttentionArgs& a) {
  TensorMap tensors;
  file_argument("--inputs", a.inputs, [&] { tensors = load_safetensors(a.inputs); });
  const auto get = [&](const char* name) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw std::invalid_argument("--inputs: " + posbias::quoted_name(a.inputs) +
                                  " has no tensor '" + name + "' (it needs q, k, v" +
                                  (a.bias == "dense" ? std::string(" and bias") : "") + ")");
    }
    return it->second;
  };
  GivenInputs in{get("q"), get("k"), get("v"), Tensor()};
  if (in.q.dim() != 4 || in.k.dim() != 4 || in.v.dim() != 4) {
    throw std::invalid_argument("--inputs: q must be [b, h, i, d] and k, v [b, hk, j, d], got q " +
                                shape_list(in.q.shape()) + ", k " + shape_list(in.k.shape()) +
                                ", v " + shape_list(in.v.shape()));
  }
  if (a.bias == "dense") in.dense = get("bias").to(DType::kFloat32);
  if (a.dtype_option->count() > 0) {
    const DType dtype = parse_dtype(a.dtype);
    in.q = in.q.to(dtype);
    in.k = in.k.to(dtype);
    in.v = in.v.to(dtype);
  }
  return in;
}

// The bias of --bias none|alibi|table (dense is built with the inputs).
AttentionBias make_bias(const AttentionArgs& a, std::int64_t h, std::int64_t j,
                        std::uint64_t seed) {
  if (a.bias == "alibi") {
    return AttentionBias::alibi(a.slopes_option->count() > 0 ? a.slopes : alibi_slopes(h));
  }
  if (a.bias == "table") {
    if (j == 0) return AttentionBias::distance_table(Tensor::empty({h, 0}, DType::kFloat32));
    if (a.table_from == "t5") {
      return AttentionBias::distance_table(
          RelativePositionBias(1.0f, a.causal, 32, 128, h, seed).distance_table(j));
    }
    return AttentionBias::distance_table(DynamicPositionBias(kDpbDim, h, seed).distance_table(j));
  }
  return AttentionBias::none();
}

std::string shape_text_summary(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                               std::int64_t j, std::int64_t d) {
  return "b " + std::to_string(b) + ", h " + std::to_string(h) + ", hk " + std::to_string(hk) +
         ", i " + std::to_string(i) + ", j " + std::to_string(j) + ", d " + std::to_string(d);
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

// The library refuses one tensor larger than the machine's memory, but the
// tool holds several at once: refuse a run whose tensors together exceed it
// (std::length_error, exit 2) before anything is allocated (the distance
// table of --bias table too: issue 19, an 8 GB table was built before the
// 8 TB of k and v were refused), rather than be killed by the OOM killer
// while building them. Counted, by overflow-checked (saturating) integer
// arithmetic on the non-negative extents: q, k, v and the dense bias in
// float32, their 16-bit copies, the distance table [h, 2j - 1] float32, the
// output and, with --check, the reference's float32 copies and output.
void check_total_memory(const AttentionShape& s, const std::string& bias, DType dtype, bool check) {
  const bool dense = bias == "dense";
  const bool table = bias == "table";
  const std::uint64_t qn = product({s.b, s.h, s.i, s.d});
  const std::uint64_t kn = product({s.b, s.hk, s.j, s.d});
  const std::uint64_t dn = dense ? product({s.h, s.i, s.j}) : 0;
  // [h, 2j - 1] (no table for j = 0), in uint64: 2j - 1 fits for any int64 j.
  const std::uint64_t table_columns = s.j > 0 ? 2 * static_cast<std::uint64_t>(s.j) - 1 : 0;
  const std::uint64_t tn = table ? times(static_cast<std::uint64_t>(s.h), table_columns) : 0;
  const std::uint64_t size = dtype_size(dtype);
  const std::uint64_t float32_elements = plus(plus(qn, times(2, kn)), plus(dn, tn));
  std::uint64_t bytes = plus(times(4, float32_elements), times(size, qn));
  if (dtype != DType::kFloat32) bytes = plus(bytes, times(size, plus(qn, times(2, kn))));
  if (check) bytes = plus(bytes, plus(times(4, plus(times(2, qn), times(2, kn))), times(size, qn)));
  const std::uint64_t memory = posbias::physical_memory_bytes();
  if (memory == 0 || bytes <= memory) return;
  throw std::length_error(
      "attention with q " + shape_list({s.b, s.h, s.i, s.d}) + ", k and v " +
      shape_list({s.b, s.hk, s.j, s.d}) +
      (dense ? ", dense bias " + shape_list({1, s.h, s.i, s.j}) : std::string()) +
      (table
           ? ", distance table [" + std::to_string(s.h) + ", " + std::to_string(table_columns) + "]"
           : std::string()) +
      " (" + dtype_name(dtype) + (check ? ", --check" : "") + ") needs " +
      (bytes == kSaturated ? std::string("more than 1.8e+19")
                           : "about " + number(static_cast<double>(bytes), "%.4g")) +
      " bytes, more than this machine's " + number(static_cast<double>(memory), "%.4g") +
      " bytes of memory");
}

int run_attention(const AttentionArgs& a, std::ostream& out) {
  if (a.slopes_option->count() > 0 && a.bias != "alibi") {
    throw std::invalid_argument("--slopes is an option of --bias alibi, got --bias " + a.bias);
  }
  if (a.table_from_option->count() > 0 && a.bias != "table") {
    throw std::invalid_argument("--table-from is an option of --bias table, got --bias " + a.bias);
  }
  const DType dtype = parse_dtype(a.dtype);
  const std::uint64_t seed = parse_seed(a.seed);
  AttentionOptions options;
  options.causal = a.causal;
  options.scale = a.scale;

  Tensor q, k, v;
  AttentionBias bias;
  if (!a.inputs.empty()) {
    GivenInputs in = load_inputs(a);
    if (a.bias == "table") {
      // The table is built from the file's lengths: the inputs' own checks
      // (d = 0, ...) and the memory of the run first.
      probe_attention(in.q, in.k, in.v, AttentionBias::none(), options);
      AttentionShape s;
      s.b = in.q.size(0);
      s.h = in.q.size(1);
      s.hk = in.k.size(1);
      s.i = in.q.size(2);
      s.j = in.k.size(2);
      s.d = in.q.size(3);
      check_total_memory(s, a.bias, in.q.dtype(), a.check);
    }
    bias = a.bias == "dense" ? AttentionBias::dense_bias(in.dense)
                             : make_bias(a, in.q.size(1), in.k.size(2), seed);
    q = in.q;
    k = in.k;
    v = in.v;
  } else {
    const auto need = [](const std::optional<std::int64_t>& value, const char* name) {
      if (!value) throw std::invalid_argument(std::string(name) + " is required (or --inputs)");
      return *value;
    };
    AttentionShape s;
    s.h = need(a.heads, "--heads");
    s.i = need(a.i, "-i");
    s.j = need(a.j, "-j");
    s.d = need(a.d, "-d");
    s.b = a.batch.value_or(1);
    s.hk = a.kv_heads.value_or(s.h);
    require_nonnegative("--batch", s.b);
    require_nonnegative("--heads", s.h);
    require_nonnegative("--kv-heads", s.hk);
    require_nonnegative("-i", s.i);
    require_nonnegative("-j", s.j);
    require_nonnegative("-d", s.d);
    // Every argument check of the library, on empty (b = 0) tensors, before
    // anything large is allocated or drawn: first with every bias but the
    // distance table (alibi slopes are at most kMaxHeads floats; a dense
    // bias is probed empty), then, once the memory of the whole run is
    // known to fit, with the table built.
    const Tensor q0 = Tensor::empty({0, s.h, s.i, s.d}, dtype);
    const Tensor kv0 = Tensor::empty({0, s.hk, s.j, s.d}, dtype);
    const auto probe = [&](const AttentionBias& probe_bias) {
      try {
        attention_forward(q0, kv0, kv0, probe_bias, options);
      } catch (const std::invalid_argument& e) {
        throw_with_shapes(
            e, shapes_text({s.b, s.h, s.i, s.d}, {s.b, s.hk, s.j, s.d}, {s.b, s.hk, s.j, s.d}));
      }
    };
    if (a.bias == "dense") {
      probe(AttentionBias::dense_bias(Tensor::empty({0, s.h, s.i, s.j}, DType::kFloat32)));
    } else if (a.bias != "table") {
      bias = make_bias(a, s.h, s.j, seed);
      probe(bias);
    } else {
      probe(AttentionBias::none());
    }
    check_total_memory(s, a.bias, dtype, a.check);
    if (a.bias == "table") {
      bias = make_bias(a, s.h, s.j, seed);
      probe(bias);
    }
    AttentionInputs in = random_attention_inputs(s, a.bias == "dense", seed);
    if (a.bias == "dense") bias = AttentionBias::dense_bias(in.dense);
    q = dtype == DType::kFloat32 ? in.q : in.q.to(dtype);
    k = dtype == DType::kFloat32 ? in.k : in.k.to(dtype);
    v = dtype == DType::kFloat32 ? in.v : in.v.to(dtype);
  }

  const auto start = std::chrono::steady_clock::now();
  Tensor result;
  try {
    result = attention_forward(q, k, v, bias, options);
  } catch (const std::invalid_argument& e) {
    // Given inputs are not probed: their errors surface here.
    throw_with_shapes(e, shapes_text(q.shape(), k.shape(), v.shape()));
  }
  const auto stop = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(stop - start).count();

  std::optional<std::string> check;
  bool check_failed = false;
  if (a.check) {
    const Tensor reference = attention_reference(q, k, v, bias, options);
    const CheckResult r = compare_outputs(result, reference);
    check = check_line(r, result, reference);
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
  for (float x : result.to_float_vector()) {
    sum += x;
    max_abs = std::isnan(x) ? x : std::max(max_abs, static_cast<double>(std::fabs(x)));
  }
  const float scale =
      options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(q.size(3)));
  out << "attention_forward: out " << shape_list(result.shape()) << " "
      << dtype_name(result.dtype()) << "\n"
      << "inputs: "
      << shape_text_summary(q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3))
      << "; " << (a.causal ? "causal" : "not causal") << "; bias " << a.bias
      << (a.bias == "table" ? " (" + a.table_from + ")" : "") << "; scale "
      << format_float_roundtrip(scale) << "; "
      << (a.inputs.empty() ? "seed " + a.seed : "from " + a.inputs) << "\n"
      << "checksum: sum " << number(sum) << ", max |x| " << number(max_abs) << "\n"
      << "time: " << number(ms, "%.3f") << " ms\n";
  if (check) out << "check: " << *check << "\n";
  return check_failed ? 1 : 0;
}

}  // namespace

Command add_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* sub = add_command(
      app, "attention",
      "Fused attention with a positional bias (attention_forward) on random inputs",
      "out = softmax(scale * q k^T + bias, mask) v with q [b, h, i, d], k and v\n"
      "[b, hk, j, d] (grouped-query when hk < h); the queries are the last i of the\n"
      "j positions (i = 1: a decode step; i < j: a chunk). Inputs: N(0, 1) from\n"
      "--seed (std::mt19937_64 and Box-Muller; q, k, v, then a dense bias, in\n"
      "that order: cli/attention_inputs.h), or q, k, v from a safetensors file.\n"
      "Biases: alibi: -slope[h] |c - q_r| with alibi_slopes(h) or --slopes;\n"
      "table: a per-head distance table [h, 2j - 1], by default that of\n"
      "DynamicPositionBias(dim 16, heads h, --seed).distance_table(j) (non-causal\n"
      "needs i <= j), or with --table-from t5 that of RelativePositionBias(scale 1,\n"
      "--causal, 32 buckets, max distance 128, heads h, --seed); dense: an N(0, 1)\n"
      "[1, h, i, j] tensor (or the tensor 'bias' of --inputs).\n"
      "--format summary (the default) prints the shape, a checksum (sum and max |x|)\n"
      "and the time of the fused call; text and json print the output tensor.\n"
      "--check also runs attention_reference (the plain path) and exits 1 unless\n"
      "every element agrees within 1e-5 + 1e-4 |reference| (plus one unit in the\n"
      "last place for a 16-bit dtype). Scores of magnitude in the hundreds (e.g.\n"
      "--scale 20) exceed it by float32 rounding alone: about |score| 2^-24 |v|.\n"
      "Examples:\n"
      "  posbias attention --heads 16 -i 2048 -j 2048 -d 64 --causal --bias alibi\n"
      "  posbias attention --heads 32 --kv-heads 8 -i 1 -j 4096 -d 128 --bias table --check\n"
      "  posbias attention --inputs qkv.safetensors --bias alibi --format json");
  add_int64_option(*sub, "--batch,-b", args->batch, "Batch size b (>= 0, default 1)");
  add_int64_option(*sub, "--heads", args->heads, "Query heads h (>= 0)");
  add_int64_option(*sub, "--kv-heads", args->kv_heads,
                   "Key/value heads hk (h % hk == 0, default h)");
  add_int64_option(*sub, "-i", args->i, "Query length (>= 0)");
  add_int64_option(*sub, "-j", args->j, "Key length (>= 0)");
  add_int64_option(*sub, "-d", args->d, "Head dimension (>= 1)");
  sub->add_flag("--causal", args->causal, "Mask key c for row r when c > q_r = j - i + r");
  sub->add_option("--scale", args->scale, "Multiplies q k^T (finite; default 1 / sqrt(d))");
  sub->add_option("--bias", args->bias, "none (the default), alibi, table or dense")
      ->check(CLI::IsMember({"none", "alibi", "table", "dense"}))
      ->default_str("none");
  args->table_from_option =
      sub->add_option("--table-from", args->table_from,
                      "The module whose distance table --bias table uses: dpb (the default) or t5")
          ->check(CLI::IsMember({"dpb", "t5"}))
          ->default_str("dpb");
  args->slopes_option =
      add_float_list_option(*sub, "--slopes", args->slopes,
                            "--bias alibi: one slope per query head (default alibi_slopes(h))")
          ->type_name("S1,S2,...");
  add_seed_option(*sub, args->seed, "Seed of the random inputs and of the table's module");
  args->dtype_option =
      sub->add_option("--dtype", args->dtype,
                      "Dtype of q, k, v and the output: float32, bfloat16 or float16 (float32 "
                      "accumulation); with --inputs the file's dtype unless given")
          ->default_str("float32");
  sub->add_option("--format", args->format,
                  "summary: shape, checksum, time; text: like print(tensor) in PyTorch; json: "
                  "{\"shape\": [...], \"data\": [...]}, every value, exact")
      ->check(CLI::IsMember({"summary", "text", "json"}))
      ->default_str("summary");
  sub->add_flag("--check", args->check,
                "Compare with attention_reference; exit 1 if an element is outside the "
                "tolerance");
  CLI::Option* inputs =
      sub->add_option("--inputs", args->inputs,
                      "A safetensors file with q [b, h, i, d], k and v [b, hk, j, d] (and, for "
                      "--bias dense, 'bias') instead of random inputs")
          ->type_name("FILE");
  for (const char* name : {"--batch", "--heads", "--kv-heads", "-i", "-j", "-d"}) {
    inputs->excludes(sub->get_option(name));
  }
  return {sub, [args](std::ostream& out) { return run_attention(*args, out); }};
}

}  // namespace posbias::cli
