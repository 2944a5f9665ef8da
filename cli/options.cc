#include "options.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <system_error>

#include "posbias/limits.h"

namespace posbias::cli {
namespace {

// Item `item` of a list option as a float32: the whole text a number
// (strtof: "0.5", "-2e-3", "inf", "nan"), not past float32's range.
std::optional<std::string> parse_float_item(const std::string& item, float& value) {
  char* end = nullptr;
  errno = 0;
  value = std::strtof(item.c_str(), &end);
  if (end == item.c_str() || end != item.c_str() + item.size()) return "is not a number";
  if (errno == ERANGE && std::isinf(value)) return "is past the float32 range";
  return std::nullopt;
}

std::optional<std::string> parse_int64_item(const std::string& item, std::int64_t& value) {
  return parse_decimal(item, value);
}

// The whole of `text` as a base-10 integer of type T (see parse_decimal in
// options.h).
template <typename T>
std::optional<std::string> parse_decimal_as(const std::string& text, T& value,
                                            const char* range_error) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  // from_chars reads base 10 only, so "0x10" would stop at the 'x': name the
  // prefix instead of calling it "not an integer".
  const char* digits = begin != end && *begin == '-' ? begin + 1 : begin;
  if (end - digits >= 2 && digits[0] == '0' &&
      std::string_view("xXbBoO").find(digits[1]) != std::string_view::npos) {
    return "is not a base-10 integer (0x, 0b and 0o prefixes are not accepted)";
  }
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range && ptr == end) return range_error;
  if (ec != std::errc() || ptr != end || begin == end) return "is not an integer";
  return std::nullopt;
}

// The list option: every argument split at commas, each item parsed by
// `parse` (an error message or nullopt) into `values`.
template <typename T, typename Parse>
CLI::Option* add_list_option(CLI::App& sub, const std::string& name, std::vector<T>& values,
                             const std::string& help, Parse parse) {
  return sub.add_option_function<std::vector<std::string>>(
      name,
      [&values, name, parse](const std::vector<std::string>& arguments) {
        values.clear();
        for (const std::string& argument : arguments) {
          std::size_t start = 0;
          for (std::size_t n = 1;; ++n) {
            const std::size_t comma = std::min(argument.find(',', start), argument.size());
            const std::string item = argument.substr(start, comma - start);
            const bool one_item = start == 0 && comma == argument.size();
            const std::string where =
                one_item ? posbias::quoted_name(item)
                         : "item " + std::to_string(n) + " of " + posbias::quoted_name(argument) +
                               (item.empty() ? "" : " (" + posbias::quoted_name(item) + ")");
            if (item.empty()) throw CLI::ValidationError(name, where + " is empty");
            T value{};
            if (const auto error = parse(item, value)) {
              throw CLI::ValidationError(name, where + " " + *error);
            }
            values.push_back(value);
            if (comma == argument.size()) break;
            start = comma + 1;
          }
        }
      },
      help);
}

}  // namespace

CLI::Option* add_float_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<float>& values, const std::string& help) {
  return add_list_option(sub, name, values, help, parse_float_item);
}

CLI::Option* add_int64_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<std::int64_t>& values, const std::string& help) {
  return add_list_option(sub, name, values, help, parse_int64_item);
}

const CLI::Validator& non_empty_value() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "the value is empty ('')" : "";
      },
      "");
  return validator;
}

void refuse_empty_values(CLI::App& app) {
  std::vector<CLI::App*> apps = app.get_subcommands([](CLI::App*) { return true; });
  apps.push_back(&app);
  for (CLI::App* each : apps) {
    for (CLI::Option* option : each->get_options()) {
      if (option->get_type_size_max() > 0) option->check(non_empty_value());
    }
  }
}

std::optional<std::string> parse_decimal(const std::string& text, std::int64_t& value) {
  return parse_decimal_as(text, value, "does not fit in a 64-bit integer");
}

std::optional<std::string> parse_decimal(const std::string& text, std::uint64_t& value) {
  return parse_decimal_as(text, value, "does not fit in an unsigned 64-bit integer");
}

const CLI::Validator& decimal_int64() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "";  // non_empty_value() names that
        std::int64_t value = 0;
        if (const auto error = parse_decimal(text, value)) {
          return posbias::quoted_name(text) + " " + *error;
        }
        text = std::to_string(value);  // what CLI11 converts: plain decimal
        return "";
      },
      "");
  return validator;
}

}  // namespace posbias::cli
