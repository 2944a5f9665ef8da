// Fuzzes the golden-file reader (cli/golden_check.h): check_golden_text() on
// arbitrary text must return a report or throw GoldenFileError, never crash,
// hang or leak; a malformed case is a failed case, not an exception.
//
// Sizes are capped before the call (the checker computes whatever a case
// asks for, and a case asking for 64 x 4096 x 4096 would only measure the
// allocator): an input whose JSON holds a size field (heads, i, j, dim, ...)
// above 64, or a shape with more than 2^16 elements, is skipped, except a
// depth of at least 2^36: no machine holds that many layers, and the library
// must refuse it at once (issue 19: such a dynamic_position_bias_file case
// hung the checker). Cases name
// files by relative path beside base_dir (the committed golden folder); an
// input naming a path with '/' or '\' is skipped, so nothing outside it is read.
// Input nested past kMaxGoldenDepth (JSON 100,000 levels deep crashed the
// checker: issue 19) is never skipped: the checker must refuse it at once.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "golden_check.h"

namespace {

constexpr double kMaxSize = 64;
constexpr double kMaxShapeElements = 65536;
constexpr double kRefusedDepth = 68719476736.0;  // 2^36: about 50 TB of layers

bool is_size_key(const std::string& key) {
  static const char* const kKeys[] = {"heads", "total_heads", "n_heads",     "i",
                                      "j",     "q_len",       "k_len",       "dim",
                                      "depth", "num_buckets", "max_distance"};
  for (const char* k : kKeys) {
    if (key == k) return true;
  }
  return false;
}

// False when the value asks for more work than the fuzzer should do.
bool acceptable(const nlohmann::json& v, const std::string& key) {
  if (v.is_number() && is_size_key(key)) {
    const double x = v.get<double>();
    return (x >= -kMaxSize && x <= kMaxSize) || (key == "depth" && x >= kRefusedDepth);
  }
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return s.find('/') == std::string::npos && s.find('\\') == std::string::npos;
  }
  if (v.is_array()) {
    if (key == "shape") {
      double n = 1;
      for (const auto& e : v) {
        if (e.is_number()) n *= e.get<double>() < 0 ? 1 : e.get<double>();
      }
      if (n > kMaxShapeElements) return false;
    }
    for (const auto& e : v) {
      if (!acceptable(e, "")) return false;
    }
    return true;
  }
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!acceptable(it.value(), it.key())) return false;
    }
  }
  return true;
}

// Messages quote what they show through bounded excerpts (describe(),
// posbias::quoted_name): no input, however large, makes a long one.
constexpr std::size_t kMaxMessageBytes = 4096;

void check_message_size(const std::string& message) {
  if (message.size() > kMaxMessageBytes) {
    std::fprintf(stderr, "golden fuzzer: a message of %zu bytes: %.200s...\n", message.size(),
                 message.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The cap, judged on the JSON as nlohmann reads it (the checker's parser);
  // text that is not JSON, or nested past the checker's depth limit (which
  // it must refuse at once, however deep: issue 19), goes to the checker as
  // it is. Values past that depth are discarded here, so that acceptable()
  // recurses at most kMaxGoldenDepth levels.
  bool too_deep = false;
  const nlohmann::json parsed = nlohmann::json::parse(
      text,
      [&too_deep](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if ((event == nlohmann::json::parse_event_t::object_start ||
             event == nlohmann::json::parse_event_t::array_start) &&
            depth >= posbias::cli::kMaxGoldenDepth) {
          too_deep = true;
          return false;
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (!too_deep && !parsed.is_discarded() && !acceptable(parsed, "")) return -1;
  try {
    const posbias::cli::GoldenReport report =
        posbias::cli::check_golden_text(text, POSBIAS_SOURCE_DIR "/tests/data/golden");
    if (report.passed() + report.failed() + report.skipped() != report.cases.size()) {
      std::fprintf(stderr, "golden fuzzer: the counts do not add up: %s\n",
                   report.summary().c_str());
      std::abort();
    }
    for (const auto& c : report.cases) {
      if (c.status != posbias::cli::CaseStatus::kPassed && c.message.empty()) {
        std::fprintf(stderr, "golden fuzzer: case %zu (%s) not passed without a message\n", c.index,
                     c.kind.c_str());
        std::abort();
      }
      check_message_size(c.message);
    }
  } catch (const posbias::cli::GoldenFileError& e) {
    check_message_size(e.what());
  }
  return 0;
}
