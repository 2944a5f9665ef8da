#include "golden_check.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

using json = nlohmann::json;

// A case that does not follow the format (missing field, wrong type,
// inconsistent shape and data). Reported as a failed case.
class MalformedCase : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------ field access
//
// nlohmann's own exceptions name neither the field nor the case, so fields
// are read through these helpers, which say which field is wrong and how.

std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(value.type_name()) + " " + text;
}

const json& field(const json& c, const char* name) {
  const auto it = c.find(name);
  if (it == c.end()) {
    throw MalformedCase(std::string("missing field '") + name + "'");
  }
  return *it;
}

std::int64_t as_int(const json& value, const std::string& what) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<std::uint64_t>() >
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw MalformedCase(what + " is out of range: " + value.dump());
    }
    return value.get<std::int64_t>();
  }
  throw MalformedCase(what + " must be an integer, got " + describe(value));
}

std::int64_t get_int(const json& c, const char* name) {
  return as_int(field(c, name), std::string("field '") + name + "'");
}

bool get_bool(const json& c, const char* name) {
  const json& value = field(c, name);
  if (!value.is_boolean()) {
    throw MalformedCase(std::string("field '") + name + "' must be true or false, got " +
                        describe(value));
  }
  return value.get<bool>();
}

const std::string& get_string(const json& c, const char* name) {
  const json& value = field(c, name);
  if (!value.is_string()) {
    throw MalformedCase(std::string("field '") + name + "' must be a string, got " +
                        describe(value));
  }
  return value.get_ref<const std::string&>();
}

const json& get_object(const json& c, const char* name) {
  const json& value = field(c, name);
  if (!value.is_object()) {
    throw MalformedCase(std::string("field '") + name + "' must be an object, got " +
                        describe(value));
  }
  return value;
}

const json& get_array(const json& c, const char* name) {
  const json& value = field(c, name);
  if (!value.is_array()) {
    throw MalformedCase(std::string("field '") + name + "' must be an array, got " +
                        describe(value));
  }
  return value;
}

std::vector<std::int64_t> get_ints(const json& c, const char* name) {
  const json& value = get_array(c, name);
  std::vector<std::int64_t> out;
  out.reserve(value.size());
  for (std::size_t k = 0; k < value.size(); ++k) {
    out.push_back(as_int(value[k], std::string("field '") + name + "'[" + std::to_string(k) + "]"));
  }
  return out;
}

double as_number(const json& value, const std::string& what) {
  if (value.is_number()) return value.get<double>();
  // Non-finite values are written as strings (JSON has no literal for them),
  // as posbias::to_json does.
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  throw MalformedCase(what + " must be a number, got " + describe(value));
}

double get_number(const json& c, const char* name) {
  return as_number(field(c, name), std::string("field '") + name + "'");
}

std::vector<double> as_numbers(const json& value, const std::string& what) {
  if (!value.is_array()) {
    throw MalformedCase(what + " must be an array of numbers, got " + describe(value));
  }
  std::vector<double> out;
  out.reserve(value.size());
  for (std::size_t k = 0; k < value.size(); ++k) {
    out.push_back(as_number(value[k], what + "[" + std::to_string(k) + "]"));
  }
  return out;
}

std::vector<double> get_numbers(const json& c, const char* name) {
  return as_numbers(field(c, name), std::string("field '") + name + "'");
}

std::vector<std::int64_t> get_shape(const json& c, const char* name) {
  const json& value = field(c, name);
  const std::string what = std::string("field '") + name + "'";
  if (!value.is_array()) {
    throw MalformedCase(what + " must be an array of integers, got " + describe(value));
  }
  std::vector<std::int64_t> shape;
  for (std::size_t k = 0; k < value.size(); ++k) {
    const std::int64_t extent = as_int(value[k], what + "[" + std::to_string(k) + "]");
    if (extent < 0) {
      throw MalformedCase(what + " has a negative extent: " + value.dump());
    }
    shape.push_back(extent);
  }
  return shape;
}

// Slopes as the float32 values a module is given. Missing or null: nullopt
// (the default schedule).
std::optional<std::vector<float>> get_optional_slopes(const json& c, const char* name) {
  const auto it = c.find(name);
  if (it == c.end() || it->is_null()) return std::nullopt;
  std::vector<float> slopes;
  for (double v : as_numbers(*it, std::string("field '") + name + "'")) {
    slopes.push_back(static_cast<float>(v));
  }
  return slopes;
}

// ------------------------------------------------------------- comparison

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) {
    if (e != 0 && n > std::numeric_limits<std::int64_t>::max() / e) {
      throw MalformedCase("shape " + shape_text(shape) + " is too large");
    }
    n *= e;
  }
  return n;
}

// Multi-index of flat element `flat` of a row-major `shape`.
std::vector<std::int64_t> unflatten(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] > 0) {
      index[d] = flat % shape[d];
      flat /= shape[d];
    }
  }
  return index;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// |got - want| <= atol + rtol |want|.
struct Tolerance {
  double atol;
  double rtol;
};
// Every kind but attention (README: 1e-6 + 1e-5 |b|).
constexpr Tolerance kDefaultTolerance{1e-6, 1e-5};
// Attention outputs (README: 1e-5 + 1e-4 |b|).
constexpr Tolerance kAttentionTolerance{1e-5, 1e-4};

bool close_enough(float got, double want, const Tolerance& tol) {
  const double g = static_cast<double>(got);
  if (std::isnan(want)) return std::isnan(g);
  // An infinite value matches only itself (the tolerance 1e-5 |want| would
  // be infinite and accept anything).
  if (!std::isfinite(want) || !std::isfinite(g)) return g == want;
  return std::fabs(g - want) <= tol.atol + tol.rtol * std::fabs(want);
}

// The expected values of a case: `shape` and flat row-major `data` of the
// same size.
struct Expected {
  std::vector<std::int64_t> shape;
  std::vector<double> data;
};

Expected get_expected(const json& c, const char* shape_name, const char* data_name) {
  Expected e;
  e.shape = get_shape(c, shape_name);
  e.data = get_numbers(c, data_name);
  if (element_count(e.shape) != static_cast<std::int64_t>(e.data.size())) {
    throw MalformedCase("field '" + std::string(shape_name) + "' " + shape_text(e.shape) +
                        " holds " + std::to_string(element_count(e.shape)) + " elements but '" +
                        data_name + "' has " + std::to_string(e.data.size()));
  }
  return e;
}

// A {"shape", "data"} object (a parameter, a gradient) as a float32 tensor;
// `what` names it in errors.
Tensor get_tensor(const json& value, const std::string& what) {
  try {
    if (!value.is_object()) {
      throw MalformedCase("must be an object with 'shape' and 'data', got " + describe(value));
    }
    const Expected e = get_expected(value, "shape", "data");
    std::vector<float> values(e.data.size());
    for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(e.data[k]);
    return Tensor::from_vector(e.shape, values);
  } catch (const MalformedCase& e) {
    throw MalformedCase(what + ": " + e.what());
  }
}

// Empty when `got` has the expected shape and values; else what differs: the
// shapes, or the first bad element with got vs expected and how many differ.
std::string compare(const std::vector<std::int64_t>& got_shape, const std::vector<float>& got,
                    const Expected& want, const Tolerance& tol = kDefaultTolerance) {
  if (got_shape != want.shape) {
    return "shape " + shape_text(got_shape) + ", expected " + shape_text(want.shape);
  }
  std::size_t bad = 0;
  std::size_t first = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (!close_enough(got[k], want.data[k], tol)) {
      if (bad == 0) first = k;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::string s = "element " + shape_text(unflatten(static_cast<std::int64_t>(first), want.shape)) +
                  " (flat " + std::to_string(first) + "): got " +
                  format_float_roundtrip(got[first]) + ", expected " +
                  number_text(want.data[first]);
  if (bad > 1) {
    s += " (" + std::to_string(bad) + " of " + std::to_string(got.size()) + " elements differ)";
  }
  return s;
}

std::string compare_tensor(const Tensor& got, const Expected& want,
                           const Tolerance& tol = kDefaultTolerance) {
  return compare(got.shape(), got.to_float_vector(), want, tol);
}

std::string compare_slopes(const std::vector<float>& got, const json& c) {
  Expected want;
  want.data = get_numbers(c, "slopes");
  want.shape = {static_cast<std::int64_t>(want.data.size())};
  return compare({static_cast<std::int64_t>(got.size())}, got, want);
}

// ------------------------------------------------------------ the checkers
//
// Each returns "" when the case passes, else a one-line description of the
// first difference; a malformed case throws MalformedCase, a refused argument
// the library's exception.

struct CheckContext {
  std::string base_dir;  // where files named by a case live
};

using CheckFn = std::string (*)(const json& c, const CheckContext& ctx);

std::string check_alibi_slopes(const json& c, const CheckContext&) {
  return compare_slopes(alibi_slopes(get_int(c, "heads")), c);
}

std::string check_ggml_slopes(const json& c, const CheckContext&) {
  const auto max_bias = static_cast<float>(get_number(c, "max_bias"));
  return compare_slopes(alibi_slopes_max_bias(get_int(c, "heads"), max_bias), c);
}

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
    throw MalformedCase("field 'variant' must be \"zeta\" or \"x-transformers\", got \"" + variant +
                        "\"");
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
    state.emplace(name, get_tensor(value, "params '" + name + "'"));
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
        throw MalformedCase("expected a '" + want_type + "' layer, got '" + type + "'");
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
        throw MalformedCase("'param_grads' has '" + item.key() +
                            "', which is not a parameter of the module");
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

// ------------------------------------------------------------ attention

// q, k or v: a {shape, data} object of rank 4 ([b, h or hk, len, d]).
Tensor get_attention_input(const json& c, const char* name) {
  const std::string what = std::string("field '") + name + "'";
  Tensor t = get_tensor(field(c, name), what);
  if (t.dim() != 4) {
    throw MalformedCase(what + " must have 4 dimensions [b, " +
                        (std::string(name) == "q" ? "h, i" : "hk, j") + ", d], got shape " +
                        shape_text(t.shape()));
  }
  return t;
}

// `bias`: {"type": "none"}, {"type": "alibi", "slopes": [...]} or
// {"type": "distance_table", "table": {shape, data}} (other fields, such as
// the file's "index" note, are ignored).
AttentionBias get_attention_bias(const json& c) {
  const json& bias = get_object(c, "bias");
  try {
    const std::string& type = get_string(bias, "type");
    if (type == "none") return AttentionBias::none();
    if (type == "alibi") {
      std::vector<float> slopes;
      for (double s : get_numbers(bias, "slopes")) slopes.push_back(static_cast<float>(s));
      return AttentionBias::alibi(std::move(slopes));
    }
    if (type == "distance_table") {
      Tensor table = get_tensor(field(bias, "table"), "field 'table'");
      if (table.dim() != 2) {
        throw MalformedCase("field 'table' must have 2 dimensions [h, 2j - 1], got shape " +
                            shape_text(table.shape()));
      }
      return AttentionBias::distance_table(std::move(table));
    }
    throw MalformedCase("field 'type' must be \"none\", \"alibi\" or \"distance_table\", got \"" +
                        type + "\"");
  } catch (const MalformedCase& e) {
    throw MalformedCase(std::string("field 'bias': ") + e.what());
  }
}

// The fused attention_forward and the plain attention_reference, each
// against `out` with the attention tolerance 1e-5 + 1e-4 |want|.
std::string check_attention(const json& c, const CheckContext&) {
  const Tensor q = get_attention_input(c, "q");
  const Tensor k = get_attention_input(c, "k");
  const Tensor v = get_attention_input(c, "v");
  AttentionOptions options;
  options.causal = get_bool(c, "causal");
  // null: the default 1 / sqrt(d) (what a Python None would be written as).
  if (!field(c, "scale").is_null()) options.scale = static_cast<float>(get_number(c, "scale"));
  const AttentionBias bias = get_attention_bias(c);
  const json& out = field(c, "out");
  Expected want;
  try {
    if (!out.is_object()) {
      throw MalformedCase("must be an object with 'shape' and 'data', got " + describe(out));
    }
    want = get_expected(out, "shape", "data");
  } catch (const MalformedCase& e) {
    throw MalformedCase(std::string("field 'out': ") + e.what());
  }
  std::string message;
  const std::string fused =
      compare_tensor(attention_forward(q, k, v, bias, options), want, kAttentionTolerance);
  if (!fused.empty()) message = "attention_forward: " + fused;
  const std::string reference =
      compare_tensor(attention_reference(q, k, v, bias, options), want, kAttentionTolerance);
  if (!reference.empty()) {
    message += (message.empty() ? "" : "; ") + std::string("attention_reference: ") + reference;
  }
  return message;
}

struct KindEntry {
  const char* kind;
  CheckFn check;  // nullptr: defined by the format, not checked by this build
};

// Adding a kind: write its checker above and give it its row here.
constexpr KindEntry kKinds[] = {
    {"alibi_slopes", check_alibi_slopes},
    {"ggml_slopes", check_ggml_slopes},
    {"alibi_positional_bias", check_alibi_positional_bias},
    {"alibi_bias", check_alibi_bias},
    {"dynamic_position_bias", check_dynamic_position_bias},
    {"dynamic_position_bias_file", check_dynamic_position_bias_file},
    {"t5_bucket", check_t5_bucket},
    {"attention", check_attention},
};

const KindEntry* find_kind(const std::string& kind) {
  for (const KindEntry& entry : kKinds) {
    if (kind == entry.kind) return &entry;
  }
  return nullptr;
}

CaseResult check_case(const json& c, std::size_t index, const CheckContext& ctx) {
  CaseResult result;
  result.index = index;
  result.status = CaseStatus::kFailed;
  try {
    if (!c.is_object()) {
      throw MalformedCase("a case must be an object, got " + describe(c));
    }
    const json& kind = field(c, "kind");
    if (!kind.is_string()) {
      throw MalformedCase("field 'kind' must be a string, got " + describe(kind));
    }
    result.kind = kind.get<std::string>();
    const KindEntry* entry = find_kind(result.kind);
    if (entry == nullptr) {
      result.status = CaseStatus::kSkipped;
      result.known_kind = false;
      result.message = "unknown kind '" + result.kind + "'";
      return result;
    }
    if (entry->check == nullptr) {
      result.status = CaseStatus::kSkipped;
      result.message = "kind '" + result.kind + "' is not checked by this build yet";
      return result;
    }
    result.message = entry->check(c, ctx);
    if (result.message.empty()) result.status = CaseStatus::kPassed;
  } catch (const MalformedCase& e) {
    result.message = std::string("malformed case: ") + e.what();
  } catch (const json::exception& e) {
    result.message = std::string("malformed case: ") + e.what();
  } catch (const std::invalid_argument& e) {
    result.message = std::string("posbias refused the case: ") + e.what();
  } catch (const std::length_error& e) {
    result.message = std::string("posbias refused the case: ") + e.what();
  } catch (const std::exception& e) {
    result.message = std::string("error: ") + e.what();
  }
  return result;
}

}  // namespace

std::size_t GoldenReport::passed() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kPassed;
  return n;
}

std::size_t GoldenReport::failed() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kFailed;
  return n;
}

std::size_t GoldenReport::skipped() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kSkipped;
  return n;
}

std::string GoldenReport::summary() const {
  return std::to_string(passed()) + " passed, " + std::to_string(failed()) + " failed, " +
         std::to_string(skipped()) + " skipped";
}

GoldenReport check_golden_text(const std::string& json_text, const std::string& base_dir) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past double's range
    // ("1e4196"; found by fuzz/golden_fuzzer.cc).
    throw GoldenFileError(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    throw GoldenFileError("expected a JSON object with a \"cases\" array, got " + describe(doc));
  }
  const auto cases = doc.find("cases");
  if (cases == doc.end() || !cases->is_array()) {
    throw GoldenFileError("expected a \"cases\" array at the top level");
  }
  CheckContext ctx;
  ctx.base_dir = base_dir;
  GoldenReport report;
  for (std::size_t k = 0; k < cases->size(); ++k) {
    report.cases.push_back(check_case((*cases)[k], k, ctx));
  }
  return report;
}

GoldenReport check_golden_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw GoldenFileError("cannot read '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw GoldenFileError("cannot read '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw GoldenFileError("cannot read '" + path + "': read error");
  }
  std::string base_dir = fs::path(path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";  // "golden.json": beside it is here
  try {
    return check_golden_text(text.str(), base_dir);
  } catch (const GoldenFileError& e) {
    throw GoldenFileError("'" + path + "': " + e.what());
  }
}

std::vector<std::string> golden_checked_kinds() {
  std::vector<std::string> kinds;
  for (const KindEntry& entry : kKinds) {
    if (entry.check != nullptr) kinds.emplace_back(entry.kind);
  }
  return kinds;
}

std::vector<std::string> golden_pending_kinds() {
  std::vector<std::string> kinds;
  for (const KindEntry& entry : kKinds) {
    if (entry.check == nullptr) kinds.emplace_back(entry.kind);
  }
  return kinds;
}

}  // namespace posbias::cli
