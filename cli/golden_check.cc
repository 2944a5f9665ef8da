#include "golden_check.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "golden_case.h"
#include "golden_kinds.h"
#include "posbias/limits.h"

namespace posbias::cli {
namespace {

using golden::CheckContext;
using golden::CheckFn;
using golden::MalformedCase;
using json = nlohmann::json;

struct KindEntry {
  const char* kind;
  CheckFn check;  // nullptr: defined by the format, not checked by this build
};

// Adding a kind: write its checker above and give it its row here.
constexpr KindEntry kKinds[] = {
    {"alibi_slopes", golden::check_alibi_slopes},
    {"ggml_slopes", golden::check_ggml_slopes},
    {"alibi_positional_bias", golden::check_alibi_positional_bias},
    {"alibi_bias", golden::check_alibi_bias},
    {"dynamic_position_bias", golden::check_dynamic_position_bias},
    {"dynamic_position_bias_file", golden::check_dynamic_position_bias_file},
    {"t5_bucket", golden::check_t5_bucket},
    {"attention", golden::check_attention},
    {"attention_masked", golden::check_attention_masked},
    {"attention_varlen", golden::check_attention_varlen},
    {"attention_paged", golden::check_attention_paged},
};

const KindEntry* find_kind(const std::string& kind) {
  for (const KindEntry& entry : kKinds) {
    if (kind == entry.kind) return &entry;
  }
  return nullptr;
}

CaseResult check_case(const json& c, std::size_t index, const CheckContext& ctx) {
  CaseResult result;
  result.index = index;
  result.status = CaseStatus::kFailed;
  try {
    if (!c.is_object()) {
      throw MalformedCase("a case must be an object, got " + golden::describe(c));
    }
    const json& kind = golden::field(c, "kind");
    if (!kind.is_string()) {
      throw MalformedCase("field 'kind' must be a string, got " + golden::describe(kind));
    }
    result.kind = kind.get<std::string>();
    const KindEntry* entry = find_kind(result.kind);
    if (entry == nullptr) {
      result.status = CaseStatus::kSkipped;
      result.known_kind = false;
      result.message = "unknown kind " + posbias::quoted_name(result.kind);
      return result;
    }
    if (entry->check == nullptr) {
      result.status = CaseStatus::kSkipped;
      result.message = "kind '" + result.kind + "' is not checked by this build yet";
      return result;
    }
    result.message = entry->check(c, ctx);
    if (result.message.empty()) result.status = CaseStatus::kPassed;
  } catch (const MalformedCase& e) {
    result.message = std::string("malformed case: ") + e.what();
  } catch (const json::exception& e) {
    result.message = std::string("malformed case: ") + e.what();
  } catch (const std::invalid_argument& e) {
    result.message = std::string("posbias refused the case: ") + e.what();
  } catch (const std::length_error& e) {
    result.message = std::string("posbias refused the case: ") + e.what();
  } catch (const std::exception& e) {
    result.message = std::string("error: ") + e.what();
  }
  return result;
}

}  // namespace

std::size_t GoldenReport::passed() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kPassed;
  return n;
}

std::size_t GoldenReport::failed() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kFailed;
  return n;
}

std::size_t GoldenReport::skipped() const {
  std::size_t n = 0;
  for (const CaseResult& c : cases) n += c.status == CaseStatus::kSkipped;
  return n;
}

std::string GoldenReport::summary() const {
  return std::to_string(passed()) + " passed, " + std::to_string(failed()) + " failed, " +
         std::to_string(skipped()) + " skipped";
}

namespace {

// Thrown by the parser callback at the first value nested deeper than
// kMaxGoldenDepth, before the parser goes further in.
struct TooDeep {};

// nlohmann's messages quote the text they stopped at ("last read: '...'",
// "number overflow parsing '...'"), which is the file's, as it is: show it
// through posbias::quoted_name (escaped, shortened) instead.
std::string parse_error_text(const std::string& message) {
  const std::size_t open = message.find('\'');
  const std::size_t close = message.rfind('\'');
  if (open == std::string::npos || close <= open) return message;
  return message.substr(0, open) +
         posbias::quoted_name(std::string_view(message).substr(open + 1, close - open - 1)) +
         message.substr(close + 1);
}

std::string limit_text(std::size_t bytes) {
  return std::to_string(bytes) + " bytes (" + std::to_string(bytes >> 20) + " MiB)";
}

}  // namespace

GoldenReport check_golden_text(const std::string& json_text, const std::string& base_dir) {
  if (json_text.size() > kMaxGoldenFileBytes) {
    throw GoldenFileError("larger than the golden-file limit of " +
                          limit_text(kMaxGoldenFileBytes));
  }
  json doc;
  try {
    // The depth is bounded while parsing (the callback sees each value's
    // depth as it starts), so that nothing later (the case checkers,
    // describe()) meets a value nested without limit.
    doc = json::parse(json_text, [](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= kMaxGoldenDepth) {
        throw TooDeep{};
      }
      return true;
    });
  } catch (const TooDeep&) {
    throw GoldenFileError("nested deeper than the golden-file limit of " +
                          std::to_string(kMaxGoldenDepth) + " levels of arrays and objects");
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past double's range
    // ("1e4196"; found by fuzz/golden_fuzzer.cc).
    throw GoldenFileError("not valid JSON: " + parse_error_text(e.what()));
  }
  if (!doc.is_object()) {
    throw GoldenFileError("expected a JSON object with a \"cases\" array, got " +
                          golden::describe(doc));
  }
  const auto cases = doc.find("cases");
  if (cases == doc.end() || !cases->is_array()) {
    throw GoldenFileError("expected a \"cases\" array at the top level");
  }
  CheckContext ctx;
  ctx.base_dir = base_dir;
  GoldenReport report;
  for (std::size_t k = 0; k < cases->size(); ++k) {
    report.cases.push_back(check_case((*cases)[k], k, ctx));
  }
  return report;
}

GoldenReport check_golden_file(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string shown = posbias::quoted_name(path);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw GoldenFileError("cannot read " + shown + ": it is a directory");
  }
  const auto too_large = [&] {
    return GoldenFileError(shown + ": larger than the golden-file limit of " +
                           limit_text(kMaxGoldenFileBytes));
  };
  // A regular file is judged by its size before it is read; anything else
  // (a device such as /dev/zero, a pipe) is read up to the limit + 1 byte.
  const auto status = fs::status(path, ec);
  if (!ec && fs::is_regular_file(status)) {
    const auto size = fs::file_size(path, ec);
    if (!ec && size > kMaxGoldenFileBytes) throw too_large();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw GoldenFileError("cannot read " + shown + ": " + std::strerror(errno));
  }
  std::string text;
  std::vector<char> chunk(std::size_t{1} << 16);
  while (in && text.size() <= kMaxGoldenFileBytes) {
    in.read(chunk.data(), static_cast<std::streamsize>(
                              std::min(chunk.size(), kMaxGoldenFileBytes + 1 - text.size())));
    text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) {
    throw GoldenFileError("cannot read " + shown + ": read error");
  }
  if (text.size() > kMaxGoldenFileBytes) throw too_large();
  std::string base_dir = fs::path(path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";  // "golden.json": beside it is here
  try {
    return check_golden_text(text, base_dir);
  } catch (const GoldenFileError& e) {
    throw GoldenFileError(shown + ": " + e.what());
  }
}

std::vector<std::string> golden_checked_kinds() {
  std::vector<std::string> kinds;
  for (const KindEntry& entry : kKinds) {
    if (entry.check != nullptr) kinds.emplace_back(entry.kind);
  }
  return kinds;
}

std::vector<std::string> golden_pending_kinds() {
  std::vector<std::string> kinds;
  for (const KindEntry& entry : kKinds) {
    if (entry.check == nullptr) kinds.emplace_back(entry.kind);
  }
  return kinds;
}

}  // namespace posbias::cli
