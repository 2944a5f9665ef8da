// See decode_prefetch.h.
#include "kernels/decode_prefetch.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace posbias::detail {

DecodePrefetch parse_decode_prefetch(const char* override_text, DecodeCpu cpu) {
  DecodePrefetch pf;
  if (cpu == DecodeCpu::kIntel) {
    pf.to_l2 = true;
    pf.ahead_bytes = 3072;
    pf.value_group = 4;
  } else if (cpu == DecodeCpu::kZen4) {
    pf.to_l2 = true;
    pf.ahead_bytes = 8192;
    pf.f32_value_prefetch = true;
  }
  if (override_text == nullptr || *override_text == '\0') return pf;
  const std::string whole(override_text);
  const auto bad = [&]() {
    return std::invalid_argument(
        "POSBIAS_DECODE_PREFETCH must be t0:BYTES or t1:BYTES with 64 <= BYTES <= 32768, "
        "optionally followed by :4 or :8, got '" +
        whole + "'");
  };
  // An optional value group at the end (:4 or :8), after t?:BYTES.
  std::string text = whole;
  if (text.size() > 5 && text[text.size() - 2] == ':') {
    const char g = text.back();
    if (g != '4' && g != '8') throw bad();
    pf.value_group = g - '0';
    text.resize(text.size() - 2);
  }
  if (text.size() < 4 || text.size() > 8 || text[0] != 't' || (text[1] != '0' && text[1] != '1') ||
      text[2] != ':') {
    throw bad();
  }
  std::int64_t bytes = 0;
  for (std::size_t x = 3; x < text.size(); ++x) {
    if (text[x] < '0' || text[x] > '9') throw bad();
    bytes = bytes * 10 + (text[x] - '0');  // at most 5 digits: no overflow
  }
  if (bytes < 64 || bytes > 32768) throw bad();
  pf.to_l2 = text[1] == '1';
  pf.ahead_bytes = bytes;
  return pf;
}

DecodeCpu cpu_kind() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return DecodeCpu::kOther;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  if (std::strcmp(vendor, "GenuineIntel") == 0) return DecodeCpu::kIntel;
  if (std::strcmp(vendor, "AuthenticAMD") != 0 || max_leaf < 7) return DecodeCpu::kOther;
  __get_cpuid(1, &a, &b, &c, &d);
  // The family: the base family, plus the extended family where it is 15.
  const unsigned base = (a >> 8) & 0xF, family = base == 0xF ? base + ((a >> 20) & 0xFF) : base;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const bool avx512f = (b >> 16) & 1;
  return family == 0x19 && avx512f ? DecodeCpu::kZen4 : DecodeCpu::kOther;
#else
  return DecodeCpu::kOther;
#endif
}

const DecodePrefetch& decode_prefetch() {
  static const DecodePrefetch pf =
      parse_decode_prefetch(std::getenv("POSBIAS_DECODE_PREFETCH"), cpu_kind());
  return pf;
}

}  // namespace posbias::detail
