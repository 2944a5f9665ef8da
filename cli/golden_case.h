// Reading a golden file's cases (internal to the golden checker, see
// golden_check.h): every field through a helper that names the field and
// what is wrong with it (MalformedCase), and the comparison of computed
// values with the expected ones, which names the first bad element.
#ifndef POSBIAS_CLI_GOLDEN_CASE_H_
#define POSBIAS_CLI_GOLDEN_CASE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/tensor.h"

namespace posbias::cli::golden {

using json = nlohmann::json;

// A case that does not follow the format (missing field, wrong type,
// inconsistent shape and data). Reported as a failed case.
class MalformedCase : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// |got - want| <= atol + rtol |want|.
struct Tolerance {
  double atol;
  double rtol;
};
// Every kind but attention (README: 1e-6 + 1e-5 |b|).
constexpr Tolerance kDefaultTolerance{1e-6, 1e-5};
// Attention outputs (README: 1e-5 + 1e-4 |b|).
constexpr Tolerance kAttentionTolerance{1e-5, 1e-4};

// The expected values of a case: `shape` and flat row-major `data` of the
// same size.
struct Expected {
  std::vector<std::int64_t> shape;
  std::vector<double> data;
};

// ------------------------------------------------------------ field access
//
// nlohmann's own exceptions name neither the field nor the case, so fields
// are read through these, which throw MalformedCase saying which field is
// wrong and how.

/// The value's JSON type and its first 40 characters as compact JSON, for
/// messages: strings escaped (posbias::quoted_name), never the whole value
/// serialised, however large or deep.
std::string describe(const json& value);
/// Field `name` of case `c`.
const json& field(const json& c, const char* name);
/// An integer that fits in int64 (`what` names it in the message).
std::int64_t as_int(const json& value, const std::string& what);
std::int64_t get_int(const json& c, const char* name);
bool get_bool(const json& c, const char* name);
const std::string& get_string(const json& c, const char* name);
const json& get_object(const json& c, const char* name);
const json& get_array(const json& c, const char* name);
std::vector<std::int64_t> get_ints(const json& c, const char* name);
/// A number (JSON has no inf or nan: also the strings "inf", "-inf", "nan").
double as_number(const json& value, const std::string& what);
double get_number(const json& c, const char* name);
std::vector<double> as_numbers(const json& value, const std::string& what);
std::vector<double> get_numbers(const json& c, const char* name);
/// A shape: non-negative integers.
std::vector<std::int64_t> get_shape(const json& c, const char* name);
/// Slopes as the float32 values a module is given. Missing or null: nullopt
/// (the default schedule).
std::optional<std::vector<float>> get_optional_slopes(const json& c, const char* name);

// ------------------------------------------------------------- comparison

/// "[2, 3]".
std::string shape_text(const std::vector<std::int64_t>& shape);
/// `v` to 9 significant digits (an expected value, in messages).
std::string number_text(double v);
/// `shape_name` and flat row-major `data_name` of `c`, of the same size.
Expected get_expected(const json& c, const char* shape_name, const char* data_name);
/// A {"shape", "data"} object (a parameter, a gradient) as a float32
/// tensor; `what` names it in errors.
Tensor get_tensor(const json& value, const std::string& what);
/// Empty when `got` has the expected shape and values; else what differs:
/// the shapes, or the first bad element with got vs expected and how many
/// differ.
std::string compare(const std::vector<std::int64_t>& got_shape, const std::vector<float>& got,
                    const Expected& want, const Tolerance& tol = kDefaultTolerance);
std::string compare_tensor(const Tensor& got, const Expected& want,
                           const Tolerance& tol = kDefaultTolerance);
/// `got` against the case's "slopes".
std::string compare_slopes(const std::vector<float>& got, const json& c);

}  // namespace posbias::cli::golden

#endif  // POSBIAS_CLI_GOLDEN_CASE_H_
