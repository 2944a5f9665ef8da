#include "golden_check.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "golden_case.h"
#include "golden_kinds.h"

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
      result.message = "unknown kind '" + result.kind + "'";
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

GoldenReport check_golden_text(const std::string& json_text, const std::string& base_dir) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past double's range
    // ("1e4196"; found by fuzz/golden_fuzzer.cc).
    throw GoldenFileError(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    throw GoldenFileError("expected a JSON object with a \"cases\" array, got " + golden::describe(doc));
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
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw GoldenFileError("cannot read '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw GoldenFileError("cannot read '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw GoldenFileError("cannot read '" + path + "': read error");
  }
  std::string base_dir = fs::path(path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";  // "golden.json": beside it is here
  try {
    return check_golden_text(text.str(), base_dir);
  } catch (const GoldenFileError& e) {
    throw GoldenFileError("'" + path + "': " + e.what());
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
