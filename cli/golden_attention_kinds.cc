// The attention kinds of the golden format (see golden_kinds.h): dense
// attention, the masked dense call (q_offset, window, softcap, key_mask,
// per-sequence slopes, a centred table), the packed varlen call and the paged
// KV-cache call. Every case runs through the fused path and the plain path,
// both compared with `out` at the attention tolerance 1e-5 + 1e-4 |want|.

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "golden_case.h"
#include "golden_kinds.h"
#include "posbias/attention.h"
#include "posbias/tensor.h"

namespace posbias::cli::golden {
namespace {

// A {shape, data} tensor of `rank` dimensions; `dims` names them in errors.
Tensor get_ranked(const json& c, const char* name, std::int64_t rank, const char* dims) {
  const std::string what = std::string("field '") + name + "'";
  Tensor t = get_tensor(field(c, name), what);
  if (t.dim() != rank) {
    throw MalformedCase(what + " must have " + std::to_string(rank) + " dimensions " + dims +
                        ", got shape " + shape_text(t.shape()));
  }
  return t;
}

// An integral value of a field that the library takes as int32.
std::int32_t as_int32(double value, const std::string& what) {
  if (!(std::floor(value) == value) || value < std::numeric_limits<std::int32_t>::min() ||
      value > std::numeric_limits<std::int32_t>::max()) {
    throw MalformedCase(what + " must hold int32 integers, got " + number_text(value));
  }
  return static_cast<std::int32_t>(value);
}

// A {shape, data} object of integral values as a contiguous int32 tensor.
Tensor get_int32_tensor(const json& c, const char* name) {
  const std::string what = std::string("field '") + name + "'";
  const json& value = field(c, name);
  if (!value.is_object()) {
    throw MalformedCase(what + " must be an object with 'shape' and 'data', got " +
                        describe(value));
  }
  Expected e;
  try {
    e = get_expected(value, "shape", "data");
  } catch (const MalformedCase& err) {
    throw MalformedCase(what + ": " + err.what());
  }
  Tensor t = Tensor::empty(e.shape, DType::kInt32);
  auto* data = t.mutable_data<std::int32_t>();
  for (std::size_t k = 0; k < e.data.size(); ++k) data[k] = as_int32(e.data[k], what);
  return t;
}

// A plain list of integers (cu_seqlens_*, cache_seqlens) as int32 [n].
Tensor get_int32_list(const json& c, const char* name) {
  const std::vector<std::int64_t> values = get_ints(c, name);
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt32);
  auto* data = t.mutable_data<std::int32_t>();
  for (std::size_t k = 0; k < values.size(); ++k) {
    data[k] = as_int32(static_cast<double>(values[k]), std::string("field '") + name + "'");
  }
  return t;
}

// ALiBi slopes: a plain list ([h]) or a {shape, data} object of [h] or [b, h]
// (flattened row-major, as AttentionBias::alibi takes them).
std::vector<float> get_alibi_slopes(const json& bias) {
  std::vector<float> slopes;
  if (field(bias, "slopes").is_object()) {
    const Tensor t = get_tensor(field(bias, "slopes"), "field 'slopes'");
    if (t.dim() != 1 && t.dim() != 2) {
      throw MalformedCase("field 'slopes' must be [h] or [b, h], got shape " +
                          shape_text(t.shape()));
    }
    return t.to_float_vector();
  }
  for (double s : get_numbers(bias, "slopes")) slopes.push_back(static_cast<float>(s));
  return slopes;
}

// `bias`: {"type": "none"}, {"type": "alibi", "slopes": ...} or
// {"type": "distance_table", "table": {shape, data}} (other fields, such as
// the file's "index" note, are ignored).
AttentionBias get_attention_bias(const json& c) {
  const json& bias = get_object(c, "bias");
  try {
    const std::string& type = get_string(bias, "type");
    if (type == "none") return AttentionBias::none();
    if (type == "alibi") return AttentionBias::alibi(get_alibi_slopes(bias));
    if (type == "distance_table") {
      return AttentionBias::distance_table(get_ranked(bias, "table", 2, "[h, n]"));
    }
    throw MalformedCase("field 'type' must be \"none\", \"alibi\" or \"distance_table\", got \"" +
                        type + "\"");
  } catch (const MalformedCase& e) {
    throw MalformedCase(std::string("field 'bias': ") + e.what());
  }
}

// causal and scale (null: the default 1 / sqrt(d)); with `extended`, also
// window [left, right] and softcap, which the new kinds always carry.
AttentionOptions get_options(const json& c, bool extended) {
  AttentionOptions options;
  options.causal = get_bool(c, "causal");
  if (!field(c, "scale").is_null()) options.scale = get_number(c, "scale");
  if (!extended) return options;
  const std::vector<std::int64_t> window = get_ints(c, "window");
  if (window.size() != 2) {
    throw MalformedCase("field 'window' must be [left, right], got " +
                        std::to_string(window.size()) + " values");
  }
  options.window.left = window[0];
  options.window.right = window[1];
  options.softcap = get_number(c, "softcap");
  return options;
}

Expected get_out(const json& c) {
  const json& out = field(c, "out");
  try {
    if (!out.is_object()) {
      throw MalformedCase("must be an object with 'shape' and 'data', got " + describe(out));
    }
    return get_expected(out, "shape", "data");
  } catch (const MalformedCase& e) {
    throw MalformedCase(std::string("field 'out': ") + e.what());
  }
}

// Both paths against `want`: "" when both agree, else what each got wrong.
template <typename Fused, typename Reference>
std::string compare_paths(const char* fused_name, const Fused& fused, const char* reference_name,
                          const Reference& reference, const Expected& want) {
  std::string message;
  const std::string f = compare_tensor(fused(), want, kAttentionTolerance);
  if (!f.empty()) message = std::string(fused_name) + ": " + f;
  const std::string r = compare_tensor(reference(), want, kAttentionTolerance);
  if (!r.empty()) message += (message.empty() ? "" : "; ") + std::string(reference_name) + ": " + r;
  return message;
}

// The dense kinds: q [b, h, i, d], k and v [b, hk, j, d].
std::string check_dense(const json& c, bool masked) {
  const Tensor q = get_ranked(c, "q", 4, "[b, h, i, d]");
  const Tensor k = get_ranked(c, "k", 4, "[b, hk, j, d]");
  const Tensor v = get_ranked(c, "v", 4, "[b, hk, j, d]");
  AttentionOptions options = get_options(c, masked);
  if (masked) {
    options.q_offset = get_int(c, "q_offset");
    if (!field(c, "key_mask").is_null()) {
      // 0/1 values, as the uint8 mask the library takes.
      const Tensor mask = get_int32_tensor(c, "key_mask");
      Tensor bytes = Tensor::empty(mask.shape(), DType::kUInt8);
      const auto* from = mask.data<std::int32_t>();
      auto* to = bytes.mutable_data<std::uint8_t>();
      for (std::int64_t x = 0; x < mask.numel(); ++x) {
        if (from[x] != 0 && from[x] != 1) {
          throw MalformedCase("field 'key_mask' must hold 0 or 1, got " + std::to_string(from[x]));
        }
        to[x] = static_cast<std::uint8_t>(from[x]);
      }
      options.key_mask = bytes;
    }
  }
  const AttentionBias bias = get_attention_bias(c);
  const Expected want = get_out(c);
  return compare_paths(
      "attention_forward", [&] { return attention_forward(q, k, v, bias, options); },
      "attention_reference", [&] { return attention_reference(q, k, v, bias, options); }, want);
}

}  // namespace

std::string check_attention(const json& c, const CheckContext&) {
  return check_dense(c, /*masked=*/false);
}

std::string check_attention_masked(const json& c, const CheckContext&) {
  return check_dense(c, /*masked=*/true);
}

namespace {

// What the packed and paged kinds share: q, k and v of rank `rank` (k and v
// named `k_name`, `v_name`), window and softcap among the options, the bias
// and `out`.
struct BatchCase {
  Tensor q, k, v;
  AttentionOptions options;
  AttentionBias bias;
  Expected want;
};

BatchCase get_batch_case(const json& c, std::int64_t rank, const char* q_dims, const char* k_name,
                         const char* v_name, const char* kv_dims) {
  BatchCase b;
  b.q = get_ranked(c, "q", rank, q_dims);
  b.k = get_ranked(c, k_name, rank, kv_dims);
  b.v = get_ranked(c, v_name, rank, kv_dims);
  b.options = get_options(c, /*extended=*/true);
  b.bias = get_attention_bias(c);
  b.want = get_out(c);
  return b;
}

}  // namespace

// q [total_q, h, d], k and v [total_k, hk, d], cu_seqlens_q/k plain lists.
std::string check_attention_varlen(const json& c, const CheckContext&) {
  const BatchCase b = get_batch_case(c, 3, "[total_q, h, d]", "k", "v", "[total_k, hk, d]");
  const Tensor cu_q = get_int32_list(c, "cu_seqlens_q");
  const Tensor cu_k = get_int32_list(c, "cu_seqlens_k");
  return compare_paths(
      "attention_varlen_forward",
      [&] { return attention_varlen_forward(b.q, b.k, b.v, cu_q, cu_k, b.bias, b.options); },
      "attention_varlen_reference",
      [&] { return attention_varlen_reference(b.q, b.k, b.v, cu_q, cu_k, b.bias, b.options); },
      b.want);
}

// q [b, i, h, d], k_cache and v_cache [num_blocks, block_size, hk, d],
// block_table {shape, data} [b, max_blocks], cache_seqlens a plain list.
std::string check_attention_paged(const json& c, const CheckContext&) {
  const BatchCase b =
      get_batch_case(c, 4, "[b, i, h, d]", "k_cache", "v_cache", "[num_blocks, block_size, hk, d]");
  const Tensor table = get_int32_tensor(c, "block_table");
  const Tensor lens = get_int32_list(c, "cache_seqlens");
  return compare_paths(
      "attention_kvcache_forward",
      [&] { return attention_kvcache_forward(b.q, b.k, b.v, lens, table, b.bias, b.options); },
      "attention_kvcache_reference",
      [&] { return attention_kvcache_reference(b.q, b.k, b.v, lens, table, b.bias, b.options); },
      b.want);
}

}  // namespace posbias::cli::golden
