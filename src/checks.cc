#include "checks.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace posbias::detail {

void check_at_least(const char* what, std::int64_t value, std::int64_t min) {
  if (value < min) {
    throw std::invalid_argument(std::string(what) + " must be >= " +
                                std::to_string(min) + ", got " +
                                std::to_string(value));
  }
}

void check_at_most(const char* what, std::int64_t value, std::int64_t max) {
  if (value > max) {
    throw std::invalid_argument(std::string(what) + " must be <= " + std::to_string(max) +
                                ", got " + std::to_string(value));
  }
}

void check_finite_slopes(const char* what, const std::vector<float>& slopes) {
  for (std::size_t h = 0; h < slopes.size(); ++h) {
    if (!std::isfinite(slopes[h])) {
      std::ostringstream msg;
      msg << what << ": slope " << h << " is not finite (" << slopes[h] << ")";
      throw std::invalid_argument(msg.str());
    }
  }
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::size_t physical_memory_bytes() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) return std::numeric_limits<std::size_t>::max();
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
  }();
  return bytes;
}

std::int64_t checked_numel(const std::vector<std::int64_t>& shape,
                           DType dtype) {
  std::int64_t n = 1;
  bool overflow = false;
  for (std::int64_t extent : shape) {
    if (extent < 0) {
      throw std::invalid_argument("tensor extents must be >= 0, got shape " +
                                  shape_string(shape));
    }
    if (!overflow && __builtin_mul_overflow(n, extent, &n)) overflow = true;
  }
  for (std::int64_t extent : shape) {
    if (extent == 0) return 0;  // an empty tensor never overflows
  }
  std::int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(
                      n, static_cast<std::int64_t>(dtype_size(dtype)), &bytes)) {
    throw std::length_error("tensor of shape " + shape_string(shape) + " (" +
                            dtype_name(dtype) +
                            ") is too large: its size in bytes overflows int64");
  }
  if (static_cast<std::size_t>(bytes) > physical_memory_bytes()) {
    throw std::length_error(
        "tensor of shape " + shape_string(shape) + " (" + dtype_name(dtype) +
        ") needs " + std::to_string(bytes) + " bytes, more than this machine's " +
        std::to_string(physical_memory_bytes()) + " bytes of memory");
  }
  return n;
}

}  // namespace posbias::detail
