#include "checks.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace posbias::detail {

void check_at_least(const char* what, std::int64_t value, std::int64_t min) {
  if (value < min) {
    throw std::invalid_argument(std::string(what) + " must be >= " + std::to_string(min) +
                                ", got " + std::to_string(value));
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

}  // namespace posbias::detail

namespace posbias {

std::size_t physical_memory_bytes() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) return std::numeric_limits<std::size_t>::max();
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
  }();
  return bytes;
}

}  // namespace posbias

namespace posbias::detail {

std::int64_t checked_table_length(const char* who, std::int64_t heads, std::int64_t j) {
  if (j < 1) {
    throw std::invalid_argument(std::string(who) + ": j must be >= 1, got " + std::to_string(j));
  }
  try {
    checked_numel({heads, j, 2}, DType::kFloat64);  // 2j cannot overflow after this
  } catch (const std::length_error& e) {
    throw std::length_error(std::string(who) + ": j = " + std::to_string(j) + ": " + e.what());
  }
  return 2 * j - 1;
}

std::int64_t checked_numel(const std::vector<std::int64_t>& shape, DType dtype) {
  std::int64_t n = 1;
  bool overflow = false;
  for (std::int64_t extent : shape) {
    if (extent < 0) {
      throw std::invalid_argument("tensor extents must be >= 0, got shape " + shape_string(shape));
    }
    if (!overflow && __builtin_mul_overflow(n, extent, &n)) overflow = true;
  }
  for (std::int64_t extent : shape) {
    if (extent == 0) return 0;  // an empty tensor never overflows
  }
  std::int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(n, static_cast<std::int64_t>(dtype_size(dtype)), &bytes)) {
    throw std::length_error("tensor of shape " + shape_string(shape) + " (" + dtype_name(dtype) +
                            ") is too large: its size in bytes overflows int64");
  }
  if (static_cast<std::size_t>(bytes) > physical_memory_bytes()) {
    throw std::length_error("tensor of shape " + shape_string(shape) + " (" + dtype_name(dtype) +
                            ") needs " + std::to_string(bytes) +
                            " bytes, more than this machine's " +
                            std::to_string(physical_memory_bytes()) + " bytes of memory");
  }
  return n;
}

std::length_error allocation_error(std::size_t bytes, const std::string& what) {
  return std::length_error("could not allocate " + std::to_string(bytes) + " bytes for " + what);
}

namespace {

// The length of the UTF-8 sequence at s[k] (2 to 4 bytes), or 0 when the
// bytes there are not one (a stray continuation byte, an overlong form, a
// surrogate, past U+10FFFF, or cut short).
std::size_t utf8_sequence(std::string_view s, std::size_t k) {
  const auto at = [&](std::size_t n) { return static_cast<unsigned char>(s[k + n]); };
  const unsigned char b = at(0);
  std::size_t len = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (k + len > s.size() || at(1) < lo || at(1) > hi) return 0;
  for (std::size_t n = 2; n < len; ++n) {
    if (at(n) < 0x80 || at(n) > 0xBF) return 0;
  }
  return len;
}

void append_hex(std::string& out, const char* prefix, unsigned value, int digits) {
  static const char kHex[] = "0123456789abcdef";
  out += prefix;
  for (int d = digits - 1; d >= 0; --d) out += kHex[(value >> (4 * d)) & 0xF];
}

}  // namespace

}  // namespace posbias::detail

namespace posbias {

std::string quoted_name(std::string_view s) {
  std::string out = "\"";
  std::size_t k = 0;
  while (k < s.size() && out.size() < detail::kShownNameChars) {
    const auto b = static_cast<unsigned char>(s[k]);
    if (b >= 0x80) {
      const std::size_t len = detail::utf8_sequence(s, k);
      if (len == 0) {
        detail::append_hex(out, "\\x", b, 2);
        ++k;
      } else if (b == 0xC2 && static_cast<unsigned char>(s[k + 1]) < 0xA0) {
        detail::append_hex(out, "\\u", 0x80u + (static_cast<unsigned char>(s[k + 1]) - 0x80u),
                           4);  // C1
        k += 2;
      } else {
        out.append(s.substr(k, len));
        k += len;
      }
      continue;
    }
    switch (b) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (b < 0x20 || b == 0x7F) {
          detail::append_hex(out, "\\u", b, 4);
        } else {
          out += static_cast<char>(b);
        }
    }
    ++k;
  }
  if (k < s.size()) return out + "...\" (" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}

}  // namespace posbias

namespace posbias::detail {

std::string quoted_names(const std::vector<std::string>& names, std::size_t max_items) {
  std::string out;
  for (std::size_t k = 0; k < names.size() && k < max_items; ++k) {
    out += (k ? ", " : "") + quoted_name(names[k]);
  }
  if (names.size() > max_items) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

void unsupported_dtype(const char* what, DType dtype) {
  throw std::invalid_argument(std::string(what) + ": dtype " + dtype_name(dtype) +
                              " is not supported here (expected float32, bfloat16 or float16)");
}

}  // namespace posbias::detail
