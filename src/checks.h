// Argument checks shared by the front functions in src/. Every check throws
// with the offending values in the message; nothing here allocates output.
#ifndef POSBIAS_SRC_CHECKS_H_
#define POSBIAS_SRC_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "posbias/dtype.h"

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
std::int64_t checked_numel(const std::vector<std::int64_t>& shape,
                           DType dtype);

// "[2, 3, 4]"
std::string shape_string(const std::vector<std::int64_t>& shape);

// Physical memory of this machine in bytes (sysconf), cached.
std::size_t physical_memory_bytes();

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_CHECKS_H_
