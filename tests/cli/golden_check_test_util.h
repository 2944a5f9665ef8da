// Helpers of the golden-checker tests (golden_check*_test.cc): one case
// checked on its own, and what its result must be.
#ifndef POSBIAS_TESTS_CLI_GOLDEN_CHECK_TEST_UTIL_H_
#define POSBIAS_TESTS_CLI_GOLDEN_CHECK_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "golden_check.h"
#include "posbias/tensor.h"

namespace posbias::cli {

// A golden file with the given cases (JSON text of each, comma-separated).
inline std::string golden(const std::string& cases) {
  return R"({"format": "test", "cases": [)" + cases + "]}";
}

inline CaseResult only_case(const std::string& case_json) {
  const GoldenReport report = check_golden_text(golden(case_json), ".");
  EXPECT_EQ(report.cases.size(), 1u);
  return report.cases.at(0);
}

inline void expect_fails_with(const std::string& case_json, const std::string& message_part) {
  const CaseResult c = only_case(case_json);
  EXPECT_EQ(c.status, CaseStatus::kFailed) << case_json;
  EXPECT_NE(c.message.find(message_part), std::string::npos)
      << "expected '" << message_part << "' in: " << c.message;
}

inline void expect_passes(const std::string& case_json) {
  const CaseResult c = only_case(case_json);
  EXPECT_EQ(c.status, CaseStatus::kPassed) << case_json << "\n" << c.message;
}

// {"shape", "data"} of a tensor, every value exact.
inline nlohmann::json tensor_json(const Tensor& t) { return nlohmann::json::parse(to_json(t)); }

}  // namespace posbias::cli

#endif  // POSBIAS_TESTS_CLI_GOLDEN_CHECK_TEST_UTIL_H_
