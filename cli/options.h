// The conventions of the posbias programs' command lines (CLI11): integers
// in base 10 that fit in int64, no empty values, comma-separated number lists.
// Shared by the posbias tool and the posbias-bench program, so that both
// refuse the same values with the same messages.
#ifndef POSBIAS_CLI_OPTIONS_H_
#define POSBIAS_CLI_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace posbias::cli {

/// The one rule for every integer on the command line (options, list
/// items, --seed, --range): the whole text in base 10, an optional sign
/// ('+', or '-' for a signed type), then digits. Leading zeros are decimal
/// ("010" is 10; CLI11 2.1 alone would read it as octal 8); "0x", "0b" and
/// "0o" prefixes are refused, as is anything else but digits. Returns why
/// `text` is refused ("is not an integer", "is not a base-10 integer (0x,
/// ...)", "does not fit in a 64-bit integer"), to follow the quoted value in a
/// message, or nullopt with `value` set.
std::optional<std::string> parse_decimal(const std::string& text, std::int64_t& value);
std::optional<std::string> parse_decimal(const std::string& text, std::uint64_t& value);

/// A CLI11 transform for integer options: parse_decimal() the value and hand
/// CLI11 its plain decimal form (so that CLI11's own conversion, which reads
/// "010" as octal and saturates past int64, never sees anything else); a
/// refused value is a CLI::ValidationError "NAME: "TEXT" is not an integer"
/// (exit code 2), the text quoted and shortened by posbias::quoted_name.
const CLI::Validator& decimal_int64();

/// An integer option `name` on `sub` stored in `value` (an integer type or a
/// std::optional of one) through decimal_int64(). Every integer option of
/// the tools is made here.
template <typename T>
CLI::Option* add_int64_option(CLI::App& sub, const std::string& name, T& value,
                              const std::string& help) {
  return sub.add_option(name, value, help)->transform(decimal_int64());
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
/// naming the option and the item (exit code 2). Values in messages are
/// quoted and shortened (posbias::quoted_name).
CLI::Option* add_float_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<float>& values, const std::string& help);
/// The same for 64-bit integers, each item read by parse_decimal().
CLI::Option* add_int64_list_option(CLI::App& sub, const std::string& name,
                                   std::vector<std::int64_t>& values, const std::string& help);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_OPTIONS_H_
