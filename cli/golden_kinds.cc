#include "golden_kinds.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "golden_case.h"
#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/limits.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli::golden {

std::string check_alibi_slopes(const json& c, const CheckContext&) {
  return compare_slopes(alibi_slopes(get_int(c, "heads")), c);
}

std::string check_ggml_slopes(const json& c, const CheckContext&) {
  const auto max_bias = static_cast<float>(get_number(c, "max_bias"));
  return compare_slopes(alibi_slopes_max_bias(get_int(c, "heads"), max_bias), c);
}

namespace {

// The case's `calls`, an array with at least one call: an empty one would
// make the case pass while checking nothing.
const json& get_calls(const json& c) {
  const json& calls = get_array(c, "calls");
  if (calls.empty()) throw MalformedCase("field 'calls' is empty: the case would check nothing");
  return calls;
}

// Runs `forward(i, j)` for each entry of the case's `calls` ({i, j, shape,
// data}), in order (so that later calls may be served from what earlier ones
// stored), and compares; "" when every call matches.
template <typename Forward>
std::string check_calls(const json& c, const Forward& forward) {
  const json& calls = get_calls(c);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const json& call = calls[k];
    const std::string where = "call " + std::to_string(k);
    try {
      if (!call.is_object()) {
        throw MalformedCase("must be an object, got " + describe(call));
      }
      const std::int64_t i = get_int(call, "i");
      const std::int64_t j = get_int(call, "j");
      const Expected want = get_expected(call, "shape", "data");
      const std::string diff = compare_tensor(forward(i, j), want);
      if (!diff.empty()) {
        return where + " (i = " + std::to_string(i) + ", j = " + std::to_string(j) + "): " + diff;
      }
    } catch (const MalformedCase& e) {
      throw MalformedCase(where + ": " + e.what());
    }
  }
  return "";
}

}  // namespace

// One module for all calls.
std::string check_alibi_positional_bias(const json& c, const CheckContext&) {
  const std::int64_t heads = get_int(c, "heads");
  const std::int64_t total_heads = get_int(c, "total_heads");
  const std::optional<std::vector<float>> slopes = get_optional_slopes(c, "slopes");
  get_calls(c);  // a malformed case is reported before a refused one
  const AlibiPositionalBias module = slopes ? AlibiPositionalBias(heads, total_heads, *slopes)
                                            : AlibiPositionalBias(heads, total_heads);
  return check_calls(c, [&](std::int64_t i, std::int64_t j) { return module.forward(i, j); });
}

std::string check_alibi_bias(const json& c, const CheckContext&) {
  const std::int64_t n_heads = get_int(c, "n_heads");
  const bool causal = get_bool(c, "causal");
  const std::optional<std::vector<float>> slopes = get_optional_slopes(c, "slopes");
  const std::int64_t q_len = get_int(c, "q_len");
  const std::int64_t k_len = get_int(c, "k_len");
  const Expected want = get_expected(c, "shape", "data");
  if (slopes && slopes->empty()) {
    // AlibiBias refuses an empty list (it needs n_heads >= 1 slopes), which
    // would report the case as refused by posbias; but the case is what is
    // wrong (null means the default schedule), so say so.
    throw MalformedCase("field 'slopes' is an empty list (null means the default)");
  }
  const AlibiBias builder =
      slopes ? AlibiBias(n_heads, causal, *slopes) : AlibiBias(n_heads, causal);
  return compare_tensor(builder.build(q_len, k_len), want);
}

// --------------------------------------------------- DynamicPositionBias

namespace {

// The module's options from dim, heads and the variant's fields (`variant`
// may be absent where the format implies zeta).
DpbOptions get_dpb_options(const json& c, bool variant_required) {
  DpbOptions o;
  o.dim = get_int(c, "dim");
  o.heads = get_int(c, "heads");
  const std::string variant =
      variant_required || c.contains("variant") ? get_string(c, "variant") : "zeta";
  if (variant == "zeta") return o;
  if (variant != "x-transformers") {
    throw MalformedCase("field 'variant' must be \"zeta\" or \"x-transformers\", got " +
                        posbias::quoted_name(variant));
  }
  o.variant = DpbVariant::kXTransformers;
  o.depth = get_int(c, "depth");
  o.log_distance = get_bool(c, "log_distance");
  o.norm = get_bool(c, "norm");
  return o;
}

// zeta: `params`, a state dict by name.
TensorMap zeta_state(const json& c) {
  TensorMap state;
  for (const auto& [name, value] : get_object(c, "params").items()) {
    state.emplace(name, get_tensor(value, "params " + posbias::quoted_name(name)));
  }
  return state;
}

// x-transformers: `layers`, the modules of the MLP in order, which must be
// depth blocks of linear, [layernorm when norm,] silu, then a linear. Block b
// is mlp.b (its Linear mlp.b.0, its LayerNorm mlp.b.1), the output Linear
// mlp.<depth>, as in x-transformers' state dict. Sets options->layernorm_eps
// from the LayerNorms (which must agree).
TensorMap x_transformers_state(const json& c, DpbOptions* options) {
  const json& layers = get_array(c, "layers");
  if (options->depth < 1) DynamicPositionBias refused(*options);  // throws the library's message
  const std::int64_t per_block = options->norm ? 3 : 2;
  const std::int64_t count = static_cast<std::int64_t>(layers.size());
  if (options->depth > (count - 1) / per_block || count != options->depth * per_block + 1) {
    const std::string needed =
        options->depth <= (std::numeric_limits<std::int64_t>::max() - 1) / per_block
            ? std::to_string(options->depth * per_block + 1)
            : "more";
    throw MalformedCase("field 'layers' has " + std::to_string(count) + " layers; depth " +
                        std::to_string(options->depth) + (options->norm ? " with" : " without") +
                        " norm needs " + needed + " (linear, " +
                        (options->norm ? "layernorm, " : "") + "silu per block, then linear)");
  }
  std::vector<std::pair<std::string, std::string>> expected;  // type, state-dict prefix
  for (std::int64_t b = 0; b < options->depth; ++b) {
    const std::string block = "mlp." + std::to_string(b);
    expected.emplace_back("linear", block + ".0");
    if (options->norm) expected.emplace_back("layernorm", block + ".1");
    expected.emplace_back("silu", "");
  }
  expected.emplace_back("linear", "mlp." + std::to_string(options->depth));
  TensorMap state;
  std::optional<double> eps;
  for (std::size_t k = 0; k < layers.size(); ++k) {
    const std::string where = "layers[" + std::to_string(k) + "]";
    try {
      const json& layer = layers[k];
      if (!layer.is_object()) throw MalformedCase("must be an object, got " + describe(layer));
      const std::string& type = get_string(layer, "type");
      const auto& [want_type, prefix] = expected[k];
      if (type != want_type) {
        throw MalformedCase("expected a '" + want_type + "' layer, got " +
                            posbias::quoted_name(type));
      }
      if (type == "silu") continue;
      state.emplace(prefix + ".weight", get_tensor(field(layer, "weight"), "'weight'"));
      state.emplace(prefix + ".bias", get_tensor(field(layer, "bias"), "'bias'"));
      if (type == "layernorm") {
        const double e = get_number(layer, "eps");
        if (eps && *eps != e) {
          throw MalformedCase("eps " + number_text(e) + " differs from the first LayerNorm's " +
                              number_text(*eps) + " (the module has one eps)");
        }
        eps = e;
      }
    } catch (const MalformedCase& e) {
      throw MalformedCase(where + ": " + e.what());
    }
  }
  if (eps) options->layernorm_eps = static_cast<float>(*eps);
  return state;
}

// `grad`: {i, j, grad_output {shape, data}, param_grads {name: {shape,
// data}}}, the gradients of sum(forward(i, j) * grad_output). Every
// parameter of the module must have an expected gradient.
std::string check_dpb_grad(const json& c, const DynamicPositionBias& module) {
  const json& grad = get_object(c, "grad");
  std::int64_t i = 0;
  std::int64_t j = 0;
  Tensor grad_output;
  std::vector<std::pair<std::string, Expected>> want;
  try {
    i = get_int(grad, "i");
    j = get_int(grad, "j");
    grad_output = get_tensor(field(grad, "grad_output"), "'grad_output'");
    const json& param_grads = get_object(grad, "param_grads");
    for (const std::string& name : module.parameter_names()) {
      if (param_grads.find(name) == param_grads.end()) {
        throw MalformedCase("'param_grads' has no '" + name + "'");
      }
      const json& g = param_grads.at(name);
      if (!g.is_object()) {
        throw MalformedCase("'param_grads' '" + name + "' must be an object, got " + describe(g));
      }
      try {
        want.emplace_back(name, get_expected(g, "shape", "data"));
      } catch (const MalformedCase& e) {
        throw MalformedCase("'param_grads' '" + name + "': " + e.what());
      }
    }
    const std::vector<std::string> names = module.parameter_names();
    for (const auto& item : param_grads.items()) {
      if (std::find(names.begin(), names.end(), item.key()) == names.end()) {
        throw MalformedCase("'param_grads' has " + posbias::quoted_name(item.key()) +
                            ", which is not a parameter of the module");
      }
    }
  } catch (const MalformedCase& e) {
    throw MalformedCase(std::string("field 'grad': ") + e.what());
  }
  const TensorMap got = module.backward(i, j, grad_output);
  for (const auto& [name, expected] : want) {
    const std::string diff = compare_tensor(got.at(name), expected);
    if (!diff.empty()) {
      return "grad (i = " + std::to_string(i) + ", j = " + std::to_string(j) + ") of '" + name +
             "': " + diff;
    }
  }
  return "";
}

// The calls, then the gradient when the case has one.
std::string check_dpb(const json& c, const DynamicPositionBias& module) {
  const std::string diff =
      check_calls(c, [&](std::int64_t i, std::int64_t j) { return module.forward(i, j); });
  if (!diff.empty() || c.find("grad") == c.end()) return diff;
  return check_dpb_grad(c, module);
}

}  // namespace

std::string check_dynamic_position_bias(const json& c, const CheckContext&) {
  DpbOptions options = get_dpb_options(c, /*variant_required=*/true);
  const bool zeta = options.variant == DpbVariant::kZeta;
  const TensorMap state = zeta ? zeta_state(c) : x_transformers_state(c, &options);
  get_calls(c);
  // `grad` belongs to zeta cases; any other case may have one too.
  if (zeta) get_object(c, "grad");
  DynamicPositionBias module(options);
  module.load_state_dict(state);
  return check_dpb(c, module);
}

// The weights come from a safetensors file beside the golden file.
std::string check_dynamic_position_bias_file(const json& c, const CheckContext& ctx) {
  const std::string& file = get_string(c, "file");
  if (file.empty()) throw MalformedCase("field 'file' is empty");
  const DpbOptions options = get_dpb_options(c, /*variant_required=*/false);
  get_calls(c);
  const std::string path = (std::filesystem::path(ctx.base_dir) / file).string();
  DynamicPositionBias module(options);
  module.load(path);
  return check_dpb(c, module);
}

// ----------------------------------------------------------- T5 buckets

std::string check_t5_bucket(const json& c, const CheckContext&) {
  const bool causal = get_bool(c, "causal");
  const std::int64_t num_buckets = get_int(c, "num_buckets");
  const std::int64_t max_distance = get_int(c, "max_distance");
  const std::vector<std::int64_t> rel = get_ints(c, "rel");
  const std::vector<std::int64_t> buckets = get_ints(c, "buckets");
  if (rel.size() != buckets.size()) {
    throw MalformedCase("field 'rel' has " + std::to_string(rel.size()) +
                        " values but 'buckets' has " + std::to_string(buckets.size()));
  }
  if (rel.empty()) throw MalformedCase("field 'rel' is empty: the case would check nothing");
  std::size_t bad = 0;
  std::string first;
  for (std::size_t k = 0; k < rel.size(); ++k) {
    const std::int64_t got = t5_relative_position_bucket(rel[k], causal, num_buckets, max_distance);
    if (got != buckets[k]) {
      if (bad++ == 0) {
        first = "rel " + std::to_string(rel[k]) + " (index " + std::to_string(k) +
                "): got bucket " + std::to_string(got) + ", expected " + std::to_string(buckets[k]);
      }
    }
  }
  if (bad > 1) {
    first += " (" + std::to_string(bad) + " of " + std::to_string(rel.size()) + " differ)";
  }
  return first;
}

// The attention kinds are in golden_attention_kinds.cc.

}  // namespace posbias::cli::golden
