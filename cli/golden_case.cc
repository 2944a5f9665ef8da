#include "golden_case.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "posbias/limits.h"

namespace posbias::cli::golden {

// ------------------------------------------------------------ field access

namespace {

// Appends compact JSON text of `value` to `out` until `out` holds `limit`
// characters. Every level of nesting writes at least one character first,
// so the recursion is at most `limit` deep, however deep the value (a case
// nested 100,000 levels must not recurse 100,000 times: issue 19). Strings
// and keys through posbias::quoted_name (escaped, shortened).
void append_excerpt(const json& value, std::string& out, std::size_t limit) {
  if (out.size() >= limit) return;
  if (value.is_string()) {
    out += posbias::quoted_name(value.get_ref<const std::string&>());
  } else if (value.is_array() || value.is_object()) {
    out += value.is_array() ? '[' : '{';
    for (auto it = value.begin(); it != value.end() && out.size() < limit; ++it) {
      if (it != value.begin()) out += ',';
      if (value.is_object()) out += posbias::quoted_name(it.key()) + ":";
      append_excerpt(*it, out, limit);
    }
    if (out.size() < limit) out += value.is_array() ? ']' : '}';
  } else {
    out += value.dump();  // a number, true, false or null: one token
  }
}

}  // namespace

std::string describe(const json& value) {
  constexpr std::size_t kShown = 40;
  std::string text;
  append_excerpt(value, text, kShown + 1);
  if (text.size() > kShown) {
    text.resize(kShown - 3);
    // Not half a UTF-8 character at the cut.
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) {
      text.pop_back();
    }
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
    text += "...";
  }
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
      throw MalformedCase(what + " has a negative extent: " + describe(value));
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

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

namespace {

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


bool close_enough(float got, double want, const Tolerance& tol) {
  const double g = static_cast<double>(got);
  if (std::isnan(want)) return std::isnan(g);
  // An infinite value matches only itself (the tolerance 1e-5 |want| would
  // be infinite and accept anything).
  if (!std::isfinite(want) || !std::isfinite(g)) return g == want;
  return std::fabs(g - want) <= tol.atol + tol.rtol * std::fabs(want);
}

}  // namespace

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
                    const Expected& want, const Tolerance& tol) {
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
                           const Tolerance& tol) {
  return compare(got.shape(), got.to_float_vector(), want, tol);
}

std::string compare_slopes(const std::vector<float>& got, const json& c) {
  Expected want;
  want.data = get_numbers(c, "slopes");
  want.shape = {static_cast<std::int64_t>(want.data.size())};
  return compare({static_cast<std::int64_t>(got.size())}, got, want);
}

}  // namespace posbias::cli::golden
