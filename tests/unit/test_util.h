// Helpers shared by the unit tests: exact comparisons, the reference
// rounding of 16-bit outputs, exception checks and the golden vectors.
#ifndef POSBIAS_TESTS_UNIT_TEST_UTIL_H_
#define POSBIAS_TESTS_UNIT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "posbias/dtype.h"

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

// The folder of the reference vectors: the repository's copy
// (tests/data/golden), else ../shared/golden; "" when neither has `file`.
inline std::string golden_dir(const std::string& file = "golden.json") {
  for (const char* dir : {POSBIAS_GOLDEN_COPY_DIR, POSBIAS_GOLDEN_SHARED_DIR}) {
    if (std::filesystem::exists(std::filesystem::path(dir) / file)) return dir;
  }
  return "";
}

}  // namespace posbias::test

#endif  // POSBIAS_TESTS_UNIT_TEST_UTIL_H_
