// Fuzzes the command line: posbias::cli::run(argc, argv, out, err) on argv
// words split from the input (at whitespace and NUL bytes) must return 0, 1
// or 2 and never crash, hang, leak or throw; exit code 2 comes with exactly
// one line "posbias: error: ..." on err, at most 4 KiB, with no control
// byte in it (values the tool echoes are escaped).
//
// Limits, so that the fuzzer explores argument handling instead of the
// allocator or the clock:
// - at most 24 words of at most 96 bytes;
// - every number written in the input (any base or exponent, also inside
//   words such as -d8 or --heads=7) at most 2^20 in magnitude, and the
//   product of those >= 2 at most 2^20: no output or computation past a few
//   million elements (the library's own refusal of sizes past physical
//   memory is tested in tests/unit/*_limits_test.cc, not here), except
//   a --depth of at least 2^36 (`--depth N` or `--depth=N`): no machine
//   holds that many layers, and the library must refuse it at once, before
//   building anything (issue 19: `posbias dpb --variant x-transformers
//   --depth 1000000000000` hung);
// - `bench` (timing runs) and `demo` (a fixed script of its own, with plots
//   and timed runs; ctest cli.demo runs it) are never run, and no word may
//   hold '/' or '\': the
//   process works in a fresh temporary directory (LLVMFuzzerInitialize), so
//   --save, --weights, --inputs and check-golden only touch files there.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"

namespace {

constexpr std::size_t kMaxWords = 24;
constexpr std::size_t kMaxWordBytes = 96;
constexpr double kMaxProduct = 1 << 20;
constexpr double kRefusedDepth = 68719476736.0;  // 2^36: about 50 TB of layers

// A --depth value the library must refuse at once (see the file comment).
bool is_refused_depth(const std::string& previous, const std::string& word) {
  std::string value;
  if (previous == "--depth") {
    value = word;
  } else if (word.rfind("--depth=", 0) == 0) {
    value = word.substr(8);
  } else {
    return false;
  }
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  return !value.empty() && end != nullptr && *end == '\0' && v >= kRefusedDepth;
}

// Every number in `word`, started at each digit that does not continue
// another number, read both as strtod and as strtoll(base 0) reads it.
bool numbers_acceptable(std::string word, double& product) {
  std::string clean;
  for (char ch : word) {
    if (ch != '_' && ch != '\'') clean += ch;
  }
  for (std::size_t p = 0; p < clean.size(); ++p) {
    const bool digit = clean[p] >= '0' && clean[p] <= '9';
    const bool continues =
        p > 0 && ((clean[p - 1] >= '0' && clean[p - 1] <= '9') || clean[p - 1] == '.');
    if (!digit || continues) continue;
    const char* start = clean.c_str() + p;
    const double as_double = std::fabs(std::strtod(start, nullptr));
    const long long as_int = std::strtoll(start, nullptr, 0);
    double v = std::fmax(as_double, std::fabs(static_cast<double>(as_int)));
    if (std::isnan(v)) continue;
    if (v > kMaxProduct) return false;
    if (v >= 2) product *= v;
    if (product > kMaxProduct) return false;
  }
  return true;
}

std::filesystem::path g_dir;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/posbias-cli-fuzz-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr || chdir(pattern.c_str()) != 0) {
    std::perror("cli fuzzer: temporary directory");
    std::abort();
  }
  g_dir = pattern;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"posbias"};
  std::string word;
  for (std::size_t k = 0; k <= size; ++k) {
    const char ch = k < size ? static_cast<char>(data[k]) : ' ';
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\0') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += ch;
    }
  }
  if (words.size() > kMaxWords + 1) return -1;
  double product = 1;
  for (std::size_t w = 1; w < words.size(); ++w) {
    const std::string& s = words[w];
    if (s.size() > kMaxWordBytes || s == "bench" || s == "demo" ||
        s.find('/') != std::string::npos || s.find('\\') != std::string::npos ||
        (!is_refused_depth(words[w - 1], s) && !numbers_acceptable(s, product))) {
      return -1;
    }
  }
  std::vector<const char*> argv;
  for (const auto& s : words) argv.push_back(s.c_str());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  const int code = posbias::cli::run(static_cast<int>(words.size()), argv.data(), out, err);
  if (code < 0 || code > 2) {
    std::fprintf(stderr, "cli fuzzer: exit code %d\n", code);
    std::abort();
  }
  if (code == 2) {
    const std::string e = err.str();
    if (e.rfind("posbias: error: ", 0) != 0 || e.find('\n') != e.size() - 1) {
      std::fprintf(stderr, "cli fuzzer: exit code 2 without one error line: [%s]\n", e.c_str());
      std::abort();
    }
    // Short, and no control byte (the words may hold any but whitespace):
    // values echoed in messages are escaped (issue 19).
    for (std::size_t k = 0; k + 1 < e.size(); ++k) {
      const auto byte = static_cast<unsigned char>(e[k]);
      if (byte < 0x20 || byte == 0x7F) {
        std::fprintf(stderr, "cli fuzzer: control byte 0x%02x at %zu of the error line: [%s]\n",
                     byte, k, e.c_str());
        std::abort();
      }
    }
    if (e.size() > 4096) {
      std::fprintf(stderr, "cli fuzzer: an error line of %zu bytes\n", e.size());
      std::abort();
    }
  }
  return 0;
}
