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
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "attention_run.h"
#include "commands.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/limits.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

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

std::string shape_text_summary(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                               std::int64_t j, std::int64_t d) {
  return "b " + std::to_string(b) + ", h " + std::to_string(h) + ", hk " + std::to_string(hk) +
         ", i " + std::to_string(i) + ", j " + std::to_string(j) + ", d " + std::to_string(d);
}

// The length a distance table needs for i queries at q_offset.. against j
// keys: every |q_pos - k_pos| + 1 (0 without keys), saturated at int64's
// largest value (the memory check then refuses it).
std::int64_t table_length(std::int64_t i, std::int64_t j, std::int64_t q_offset) {
  if (j == 0) return 0;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // Row 0 against the last key, the last row against key 0; |x| + 1 each.
  std::int64_t first = 0;
  std::int64_t last = 0;
  if (__builtin_sub_overflow(q_offset, j - 1, &first) ||
      __builtin_add_overflow(q_offset, i > 0 ? i - 1 : 0, &last)) {
    return kMax;
  }
  const auto reach = [](std::int64_t x) {
    return x == std::numeric_limits<std::int64_t>::min() || x == kMax ? kMax : (x < 0 ? -x : x) + 1;
  };
  return std::max(reach(first), reach(last));
}

// The library refuses one tensor larger than the machine's memory, but the
// tool holds several at once: refuse a run whose tensors together exceed it
// (std::length_error, exit 2) before anything is allocated (the distance
// table of --bias table too: issue 19, an 8 GB table was built before the
// 8 TB of k and v were refused), rather than be killed by the OOM killer
// while building them. Counted, by overflow-checked (saturating) integer
// arithmetic on the non-negative extents: q, k, v and the dense bias in
// float32, their 16-bit copies, the distance table [h, 2L - 1] float32, the
// output and, with --check, the reference's float32 copies and output.
void check_total_memory(const AttentionShape& s, const std::string& bias, DType dtype, bool check,
                        std::int64_t table_len) {
  const bool dense = bias == "dense";
  const bool table = bias == "table";
  const std::uint64_t qn = product({s.b, s.h, s.i, s.d});
  const std::uint64_t kn = product({s.b, s.hk, s.j, s.d});
  const std::uint64_t dn = dense ? product({s.h, s.i, s.j}) : 0;
  // [h, 2L - 1] (no table for L = 0), in uint64: 2L - 1 fits for any int64 L.
  const std::uint64_t table_columns =
      table_len > 0 ? 2 * static_cast<std::uint64_t>(table_len) - 1 : 0;
  const std::uint64_t tn = table ? times(static_cast<std::uint64_t>(s.h), table_columns) : 0;
  const std::uint64_t size = dtype_size(dtype);
  const std::uint64_t float32_elements = plus(plus(qn, times(2, kn)), plus(dn, tn));
  std::uint64_t bytes = plus(times(4, float32_elements), times(size, qn));
  if (dtype != DType::kFloat32) bytes = plus(bytes, times(size, plus(qn, times(2, kn))));
  if (check) bytes = plus(bytes, plus(times(4, plus(times(2, qn), times(2, kn))), times(size, qn)));
  check_memory("attention with q " + shape_list({s.b, s.h, s.i, s.d}) + ", k and v " +
                   shape_list({s.b, s.hk, s.j, s.d}) +
                   (dense ? ", dense bias " + shape_list({1, s.h, s.i, s.j}) : std::string()) +
                   (table ? ", distance table [" + std::to_string(s.h) + ", " +
                                std::to_string(table_columns) + "]"
                          : std::string()) +
                   " (" + dtype_name(dtype) + (check ? ", --check" : "") + ")",
               bytes);
}

// --key-mask: b valid lengths in [0, j] as a uint8 [b, j] mask, the valid keys
// first (right padding) or, with --left-pad, last.
Tensor key_mask_from_lengths(const AttentionArgs& a, std::int64_t b, std::int64_t j) {
  if (static_cast<std::int64_t>(a.key_mask.size()) != b) {
    throw std::invalid_argument(
        "--key-mask needs one valid length per sequence (b = " + std::to_string(b) + "), got " +
        std::to_string(a.key_mask.size()) + ": " + int_list(a.key_mask));
  }
  for (std::int64_t n : a.key_mask) {
    if (n < 0 || n > j) {
      throw std::invalid_argument("--key-mask: length " + std::to_string(n) +
                                  " is outside [0, j] = [0, " + std::to_string(j) + "]");
    }
  }
  Tensor mask = Tensor::empty({b, j}, DType::kUInt8);
  auto* m = mask.mutable_data<std::uint8_t>();
  for (std::int64_t s = 0; s < b; ++s) {
    const std::int64_t n = a.key_mask[static_cast<std::size_t>(s)];
    for (std::int64_t c = 0; c < j; ++c) {
      m[s * j + c] = static_cast<std::uint8_t>(a.left_pad ? c >= j - n : c < n);
    }
  }
  return mask;
}

// Options of the packed and KV-cache forms given to a dense run.
void refuse_batch_options(const AttentionArgs& a) {
  if (!a.seqlens_k.empty()) throw std::invalid_argument("--seqlens-k needs --seqlens");
  if (a.paged) throw std::invalid_argument("--paged needs --cache-seqlens");
  if (a.block_size) throw std::invalid_argument("--block-size needs --paged and --cache-seqlens");
  if (a.left_pad && a.key_mask.empty()) throw std::invalid_argument("--left-pad needs --key-mask");
}

int run_attention(const AttentionArgs& a, std::ostream& out) {
  if (a.slopes_option->count() > 0 && a.bias != "alibi") {
    throw std::invalid_argument("--slopes is an option of --bias alibi, got --bias " + a.bias);
  }
  if (a.slopes_per_sequence && a.bias != "alibi") {
    throw std::invalid_argument("--slopes-per-sequence is an option of --bias alibi, got --bias " +
                                a.bias);
  }
  if (a.table_from_option->count() > 0 && a.bias != "table") {
    throw std::invalid_argument("--table-from is an option of --bias table, got --bias " + a.bias);
  }
  if (!a.seqlens.empty()) return run_attention_varlen(a, out);
  if (!a.cache_seqlens.empty()) return run_attention_kvcache(a, out);
  refuse_batch_options(a);
  const DType dtype = parse_dtype(a.dtype);
  const std::uint64_t seed = parse_seed(a.seed);
  AttentionOptions options = make_options(a);

  Tensor q, k, v;
  AttentionBias bias;
  if (!a.inputs.empty()) {
    GivenInputs in = load_inputs(a);
    if (a.kv_dtype_option->count() > 0) {
      in.k = in.k.to(kv_dtype_of(a, in.k.dtype()));
      in.v = in.v.to(kv_dtype_of(a, in.v.dtype()));
    }
    if (!a.key_mask.empty())
      options.key_mask = key_mask_from_lengths(a, in.q.size(0), in.k.size(2));
    const std::int64_t length = table_length(
        in.q.size(2), in.k.size(2), options.q_offset.value_or(in.k.size(2) - in.q.size(2)));
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
      check_total_memory(s, a.bias, in.q.dtype(), a.check, length);
    }
    bias = a.bias == "dense" ? AttentionBias::dense_bias(in.dense)
                             : make_bias(a, in.q.size(1), in.q.size(0), length, seed);
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
    const DType kv_dtype = kv_dtype_of(a, dtype);
    if (!a.key_mask.empty()) options.key_mask = key_mask_from_lengths(a, s.b, s.j);
    const std::int64_t length = table_length(s.i, s.j, options.q_offset.value_or(s.j - s.i));
    // Every argument check of the library, on empty (b = 0) tensors, before
    // anything large is allocated or drawn: first with every bias but the
    // distance table (alibi slopes are at most kMaxHeads floats; a dense
    // bias is probed empty), then, once the memory of the whole run is
    // known to fit, with the table built. A key mask is probed empty too.
    const Tensor q0 = Tensor::empty({0, s.h, s.i, s.d}, dtype);
    const Tensor kv0 = Tensor::empty({0, s.hk, s.j, s.d}, kv_dtype);
    AttentionOptions probe_options = options;
    if (!a.key_mask.empty()) probe_options.key_mask = Tensor::empty({0, s.j}, DType::kUInt8);
    const auto probe = [&](const AttentionBias& probe_bias) {
      try {
        attention_forward(q0, kv0, kv0, probe_bias, probe_options);
      } catch (const std::invalid_argument& e) {
        throw_with_shapes(
            e, shapes_text({s.b, s.h, s.i, s.d}, {s.b, s.hk, s.j, s.d}, {s.b, s.hk, s.j, s.d}));
      }
    };
    const bool per_sequence = a.slopes_per_sequence || a.bias == "table";
    if (a.bias == "dense") {
      probe(AttentionBias::dense_bias(Tensor::empty({0, s.h, s.i, s.j}, DType::kFloat32)));
    } else if (!per_sequence) {
      bias = make_bias(a, s.h, s.b, length, seed);
      probe(bias);
    } else {
      probe(AttentionBias::none());
    }
    check_total_memory(s, a.bias, dtype, a.check, length);
    if (per_sequence) {
      // A table, or slopes per sequence (b * h floats, within the memory
      // just checked): the probe's b = 0 would refuse b * h slopes, so they
      // are checked with the inputs.
      bias = make_bias(a, s.h, s.b, length, seed);
      if (a.bias == "table") probe(bias);
    }
    AttentionInputs in = random_attention_inputs(s, a.bias == "dense", seed);
    if (a.bias == "dense") bias = AttentionBias::dense_bias(in.dense);
    q = dtype == DType::kFloat32 ? in.q : in.q.to(dtype);
    k = kv_dtype == DType::kFloat32 ? in.k : in.k.to(kv_dtype);
    v = kv_dtype == DType::kFloat32 ? in.v : in.v.to(kv_dtype);
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
  std::optional<Tensor> reference;
  if (a.check) reference = attention_reference(q, k, v, bias, options);
  std::string inputs_line =
      shape_text_summary(q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)) + "; " +
      options_text(a, q.size(3));
  if (options.q_offset) inputs_line += "; q_offset " + std::to_string(*options.q_offset);
  if (!a.key_mask.empty()) {
    inputs_line +=
        "; key lengths " + int_list(a.key_mask) + (a.left_pad ? " (left" : " (right") + "-padded)";
  }
  if (a.kv_dtype_option->count() > 0) inputs_line += "; k, v " + dtype_name(k.dtype());
  inputs_line += "; " + (a.inputs.empty() ? "seed " + a.seed : "from " + a.inputs);
  return report_attention(a, "attention_forward", result, ms, reference, inputs_line, out);
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
      "table: a per-head distance table [h, 2L - 1] read at its centre (L - 1 the\n"
      "longest distance of the run), by default that of\n"
      "DynamicPositionBias(dim 16, heads h, --seed).distance_table(L), or with\n"
      "--table-from t5 that of RelativePositionBias(scale 1,\n"
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
      "  posbias attention --inputs qkv.safetensors --bias alibi --format json\n"
      "Options of issue 16 (any combination): --q-offset, --window L,R, --softcap,\n"
      "--key-mask LENS (valid keys per sequence, right-padded, or --left-pad),\n"
      "--slopes-per-sequence, --kv-dtype (float32 q with a 16-bit k and v).\n"
      "Packed batch: --seqlens 100,7,... [--seqlens-k ...] runs attention_varlen_forward\n"
      "on q [total_q, h, d], k and v [total_k, hk, d] (no -i, -j, --batch).\n"
      "KV cache: --cache-seqlens 37,5,... runs attention_kvcache_forward with -i new\n"
      "queries (default 1) per sequence on one slab per sequence, or with --paged\n"
      "--block-size N on blocks handed out in a seeded random order (a block table).\n"
      "  posbias attention --heads 8 -d 64 --seqlens 100,7,33 --causal --bias alibi --check\n"
      "  posbias attention --heads 8 --kv-heads 2 -d 64 --cache-seqlens 37,5,300 --paged\n"
      "    --block-size 16 --causal --bias table --kv-dtype float16 --check\n"
      "See docs/batches.md.");
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
  sub->add_flag("--slopes-per-sequence", args->slopes_per_sequence,
                "--bias alibi: slopes [b, h], one set per sequence (--slopes then takes b * h "
                "values; default: sequence s uses alibi_slopes(h) times 1 + s / 2)");
  add_int64_option(*sub, "--q-offset", args->q_offset,
                   "Position of query row 0 minus that of key 0 (default j - i; dense only)");
  add_int64_list_option(*sub, "--window", args->window,
                        "Sliding window L,R: key c visible iff q_pos - L <= c <= q_pos + R "
                        "(-1: unbounded side)")
      ->type_name("L,R");
  sub->add_option("--softcap", args->softcap,
                  "Logit soft-capping: score = cap * tanh(scale q.k / cap) (0: off; finite, > 0)");
  add_int64_list_option(*sub, "--key-mask", args->key_mask,
                        "Key padding mask from b valid lengths: the first n keys of each sequence "
                        "attend (right padding), with --left-pad the last n (dense only)")
      ->type_name("N1,N2,...");
  sub->add_flag("--left-pad", args->left_pad, "--key-mask: the padding is on the left");
  add_int64_list_option(*sub, "--seqlens", args->seqlens,
                        "A packed batch (attention_varlen_forward): the query count of each "
                        "sequence")
      ->type_name("N1,N2,...");
  add_int64_list_option(*sub, "--seqlens-k", args->seqlens_k,
                        "--seqlens: the key count of each sequence (default --seqlens)")
      ->type_name("N1,N2,...");
  add_int64_list_option(*sub, "--cache-seqlens", args->cache_seqlens,
                        "A KV-cache call (attention_kvcache_forward): keys in the cache per "
                        "sequence; -i queries each (default 1), the last -i positions")
      ->type_name("N1,N2,...");
  sub->add_flag("--paged", args->paged,
                "--cache-seqlens: a paged cache (blocks of --block-size rows and a block "
                "table) instead of one slab per sequence");
  add_int64_option(*sub, "--block-size", args->block_size, "--paged: rows per block (>= 1)");
  add_seed_option(*sub, args->seed, "Seed of the random inputs and of the table's module");
  args->dtype_option =
      sub->add_option("--dtype", args->dtype,
                      "Dtype of q, k, v and the output: float32, bfloat16 or float16 (float32 "
                      "accumulation); with --inputs the file's dtype unless given")
          ->default_str("float32");
  args->kv_dtype_option =
      sub->add_option("--kv-dtype", args->kv_dtype,
                      "Dtype of k and v (or the cache) when it differs from q's: bfloat16 or "
                      "float16 with --dtype float32")
          ->type_name("DTYPE");
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
