// Helpers shared by the unit tests: exact comparisons, the reference
// rounding of 16-bit outputs, exception checks, the golden vectors and the
// peak memory of a call.
#ifndef POSBIAS_TESTS_UNIT_TEST_UTIL_H_
#define POSBIAS_TESTS_UNIT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checks.h"
#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::test {

// v rounded once to `dtype` (what every 16-bit output must hold), as float.
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32:
      return v;
    case DType::kBFloat16:
      return to_float(to_bfloat16(v));
    case DType::kFloat16:
      return to_float(to_float16(v));
    default:  // the other dtypes are not outputs
      break;
  }
  return v;
}

// Bitwise equality (so +0 vs -0 and every last bit count); reports the first
// differing element.
inline void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (float_bits(got[k]) != float_bits(want[k])) {
      FAIL() << what << ": element " << k << " is " << got[k] << ", expected " << want[k];
    }
  }
}

// Bitwise equality as a bool (for checks made on other threads, counted
// there and asserted after the join).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (float_bits(a[k]) != float_bits(b[k])) return false;
  }
  return true;
}

// fn must throw E whose message contains `needle` (the offending values).
template <typename E>
void expect_throw_with(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Names a hostile file or caller may give (issue 19): empty, control bytes
// (an ANSI colour sequence, a newline, DEL), a C1 control and a byte that is
// not UTF-8, a megabyte long. Each with what its message must show of it.
struct OddName {
  std::string name;
  std::string shown;  // a part of the quoted, escaped form
};
inline std::vector<OddName> odd_names() {
  return {{"", "\"\""},
          {"a\x01\x1b[31mred\nb\x7f", "\"a\\u0001\\u001b[31mred\\nb\\u007f\""},
          {"c1\xc2\x9b x\xff", "\"c1\\u009b x\\xff\""},
          {std::string(1000000, 'n'),
           "\"" + std::string(detail::kShownNameChars - 1, 'n') + "...\" (1000000 bytes)"}};
}

// A message that echoes an odd name: short, every byte printable (or part of
// a UTF-8 character), and holding `shown`.
inline void expect_short_printable(const std::string& message, const std::string& shown) {
  EXPECT_LT(message.size(), 2000u) << message.substr(0, 300);
  for (char ch : message) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7F) {
      ADD_FAILURE() << "control byte " << static_cast<int>(u) << " in: " << message.substr(0, 300);
      return;
    }
  }
  EXPECT_NE(message.find(shown), std::string::npos) << message.substr(0, 300);
}

// The folder of the reference vectors: the repository's copy
// (tests/data/golden), else ../shared/golden; "" when neither has `file`.
inline std::string golden_dir(const std::string& file = "golden.json") {
  for (const char* dir : {POSBIAS_GOLDEN_COPY_DIR, POSBIAS_GOLDEN_SHARED_DIR}) {
    if (std::filesystem::exists(std::filesystem::path(dir) / file)) return dir;
  }
  return "";
}

// Peak resident memory (kB) that `fn` added to what the process held when
// it started, from Linux's high-water mark (reset through clear_refs);
// -1 when the kernel offers neither, or under AddressSanitizer (its
// quarantine keeps freed blocks resident, so repeated scratch adds up).
inline std::int64_t peak_growth_kb(const std::function<void()>& fn) {
#if defined(__SANITIZE_ADDRESS__)
  return -1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return -1;
#endif
#endif
  const auto status_kb = [](const std::string& key) -> std::int64_t {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
    }
    return -1;
  };
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // VmHWM := VmRSS
    if (!clear.flush()) return -1;
  }
  const std::int64_t before = status_kb("VmRSS");
  fn();
  const std::int64_t peak = status_kb("VmHWM");
  return before < 0 || peak < 0 ? -1 : peak - before;
}

// A request that fits in memory must not need much more than its output:
// tall, narrow outputs and decode-like single rows, whose whole per-head
// table would be about as large as the output, are written without it.
// Before: ALiBi and T5 at i = 12e6, j = 1 allocated a 48 MB float table
// beside the 48 MB result (plus a 24 MB 16-bit copy for 16-bit outputs); DPB
// at i = 1, j = 12e6 three 48 MB buffers. Bound: 1.5x the output + 4 MB
// (the table path keeps its scratch within 1/8 of the output; the rest is
// slack for AddressSanitizer's shadow and the allocator).
struct NarrowCall {
  std::string name;
  DType dtype;
  std::function<Tensor()> run;  // returns a tensor of n elements of dtype
};
inline void expect_little_more_memory_than_output(std::int64_t n,
                                                  const std::vector<NarrowCall>& cases) {
  for (const NarrowCall& c : cases) {
    std::int64_t numel = 0;
    const std::int64_t growth = peak_growth_kb([&] { numel = c.run().numel(); });
    if (growth < 0) GTEST_SKIP() << "no /proc/self/clear_refs or VmHWM";
    ASSERT_EQ(numel, n) << c.name;
    const std::int64_t out_kb = n * static_cast<std::int64_t>(dtype_size(c.dtype)) / 1024;
    EXPECT_LE(growth, out_kb * 3 / 2 + 4096) << c.name << ": output " << out_kb << " kB";
  }
}

}  // namespace posbias::test

#endif  // POSBIAS_TESTS_UNIT_TEST_UTIL_H_
