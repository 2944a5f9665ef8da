// Argument checks shared by the front functions in src/. Every check throws
// with the offending values in the message; nothing here allocates output.
#ifndef POSBIAS_SRC_CHECKS_H_
#define POSBIAS_SRC_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "posbias/dtype.h"
#include "posbias/limits.h"

namespace posbias::detail {

// Throws std::invalid_argument("<what> must be >= <min>, got <value>").
void check_at_least(const char* what, std::int64_t value, std::int64_t min);

// Throws std::invalid_argument("<what> must be <= <max>, got <value>").
void check_at_most(const char* what, std::int64_t value, std::int64_t max);

// Head counts above this are refused (std::invalid_argument) wherever a
// per-head list would be built from a count alone (slope schedules, default
// slopes): no model has them, and such a list would only exhaust memory.
constexpr std::int64_t kMaxHeads = std::int64_t{1} << 24;

// Throws std::invalid_argument naming the first non-finite slope.
void check_finite_slopes(const char* what, const std::vector<float>& slopes);

// The product of `shape`, after checking each extent is >= 0, that the
// product and its byte size do not overflow, and that the bytes fit in the
// machine's physical memory (std::length_error naming shape and bytes).
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, DType dtype);

// The length 2j - 1 of a distance table of j keys (float64 [heads, 2j - 1]),
// after checking j >= 1 (std::invalid_argument) and that the table fits
// (std::length_error); both messages start with `who`.
std::int64_t checked_table_length(const char* who, std::int64_t heads, std::int64_t j);

// "[2, 3, 4]"
std::string shape_string(const std::vector<std::int64_t>& shape);

// Physical memory of this machine in bytes: posbias::physical_memory_bytes()
// (posbias/limits.h), the bound of checked_numel.
using posbias::physical_memory_bytes;

// The error for an allocation that failed although its size passed the
// memory checks (an address-space limit, memory taken by others):
// std::length_error("could not allocate <bytes> bytes for <what>"). Every
// failed allocation of the library becomes this, never a null pointer used.
std::length_error allocation_error(std::size_t bytes, const std::string& what);

// A name or string from the user as messages show it:
// posbias::quoted_name() (posbias/limits.h), the one helper every message of
// the library and its tools uses for such strings; kShownNameChars is how
// many characters it keeps.
constexpr std::size_t kShownNameChars = 120;
using posbias::quoted_name;

// For a switch over DType reached with a dtype its checks should have
// refused: std::invalid_argument "<what>: dtype <name> is not supported here".
[[noreturn]] void unsupported_dtype(const char* what, DType dtype);

// Up to `max_items` names, each quoted_name(), comma-separated, then
// ", ... (N in all)" when there are more.
std::string quoted_names(const std::vector<std::string>& names, std::size_t max_items = 8);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_CHECKS_H_
