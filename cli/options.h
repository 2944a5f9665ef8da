// The conventions of the posbias programs' command lines (CLI11): integers
// that must fit in int64, no empty values, comma-separated number lists.
// Shared by the posbias tool and the posbias-bench program, so that both
// refuse the same values with the same messages.
#ifndef POSBIAS_CLI_OPTIONS_H_
#define POSBIAS_CLI_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace posbias::cli {

/// A CLI11 validator for integer options: rejects values that do not fit in
/// int64 (CLI11 2.1 would silently saturate them).
const CLI::Validator& int64_in_range();

/// An integer option `name` on `sub` stored in `value` (an int64 or a
/// std::optional of one), checked with int64_in_range().
template <typename T>
CLI::Option* add_int64_option(CLI::App& sub, const std::string& name, T& value,
                              const std::string& help) {
  return sub.add_option(name, value, help)->check(int64_in_range());
}

/// A CLI11 validator that rejects an empty value. CLI11 2.1 converts "" to 0
/// (`--heads ""`) or to "not given" (`--total-heads ""` into a std::optional)
/// without a word; no option of the tools means anything by an empty value.
const CLI::Validator& non_empty_value();

/// Adds non_empty_value() to every option of `app` and of every subcommand
/// of `app` that takes a value (flags take none). Called once all options
/// are added.
void refuse_empty_values(CLI::App& app);

/// `name` on `sub`: numbers separated by commas ("0.5,0.25"), also given as
/// several arguments or by repeating the option, appended to `values` in
/// order. Parsed here, not by CLI11 2.1's delimiter, which drops empty items
/// ("0.5,,0.25" would be two slopes): an empty item, one that is not a number
/// of the type, or a float past float32's range is a CLI::ValidationError
/// naming the option and the item (exit code 2).
CLI::Option* add_float_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<float>& values, const std::string& help);
/// The same for 64-bit integers (an item past int64 is refused, not saturated).
CLI::Option* add_int64_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<std::int64_t>& values, const std::string& help);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_OPTIONS_H_
