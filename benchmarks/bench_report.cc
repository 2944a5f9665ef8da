#include "bench_report.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace posbias::bench {
namespace {

// Whole numbers (byte counts, sizes) exactly; other values to 6 significant
// digits (medians of noisy timings carry no more); "n/a" when not finite.
std::string format_number(double v) {
  if (!std::isfinite(v)) return "n/a";
  std::ostringstream s;
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    s << static_cast<std::int64_t>(v);
  } else {
    s << std::setprecision(6) << v;
  }
  return s.str();
}

// The same as a JSON value: an exact integer for whole numbers, a double
// rounded to 6 significant digits otherwise, null when not finite (JSON has
// no inf or nan).
nlohmann::ordered_json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return static_cast<std::int64_t>(v);
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return std::strtod(text, nullptr);
}

}  // namespace

// One line per case; the keys in a fixed order (case, median_ms, baselines,
// the extra figures, threads, note, target and target_met, and error when
// there is one), strings
// escaped by nlohmann::json.
void print_json(const CaseResult& r, std::ostream& out) {
  nlohmann::ordered_json line;
  line["case"] = r.name;
  line["median_ms"] = json_number(r.median_ms);
  nlohmann::ordered_json baselines = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.baselines) baselines[k] = json_number(v);
  line["baselines"] = baselines;
  for (const auto& [k, v] : r.extra) line[k] = json_number(v);
  line["threads"] = omp_get_max_threads();
  line["note"] = r.note;
  if (!r.target.empty()) {
    line["target"] = r.target;
    line["target_met"] = r.target_met ? nlohmann::ordered_json(*r.target_met) : nullptr;
  }
  if (!r.error.empty()) line["error"] = r.error;
  // replace: a note quoting a path that is not UTF-8 must not throw.
  out << line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

void print_table(const std::vector<CaseResult>& rs, std::ostream& out) {
  out << std::left << std::setw(34) << "case" << std::right << std::setw(12) << "median ms"
      << "   " << std::left << std::setw(30) << "baseline" << std::right << std::setw(12)
      << "median"
      << "   ratio\n";
  for (const CaseResult& r : rs) {
    bool first = true;
    for (const auto& [k, v] : r.baselines) {
      // Baselines named *_gflops, *_gbps or *bytes* are rates or sizes, not times.
      const bool is_time = k.find("gflops") == std::string::npos &&
                           k.find("gbps") == std::string::npos &&
                           k.find("bytes") == std::string::npos;
      out << std::left << std::setw(34) << (first ? r.name : "") << std::right << std::setw(12)
          << (first ? format_number(r.median_ms) : "") << "   " << std::left << std::setw(30) << k
          << std::right << std::setw(12) << format_number(v) << "   ";
      if (is_time && r.median_ms > 0 && v > 0) {
        const double ratio = v / r.median_ms;
        out << std::fixed << std::setprecision(2) << (ratio >= 1.0 ? ratio : 1.0 / ratio)
            << std::defaultfloat << (ratio >= 1.0 ? "x faster than " : "x slower than ") << k;
      }
      out << "\n";
      first = false;
    }
    for (const auto& [k, v] : r.extra) out << "    " << k << " = " << format_number(v) << "\n";
    out << "    " << r.note << "\n";
    if (!r.target.empty()) {
      out << "    target: " << r.target
          << (r.target_met ? (*r.target_met ? " (met)" : " (NOT met)") : "") << "\n";
    }
    if (!r.error.empty()) out << "    ERROR: " << r.error << "\n";
  }
  out << "(" << omp_get_max_threads() << " threads; medians; ratio: how much faster or slower "
      << "than the baseline, measured in the same run: interleaved call by call, except "
      << "sgemm_gflops (timed right after the attention rounds) and the pytorch_* baselines "
      << "(timed by a Python process of their own just before or after))\n";
}

}  // namespace posbias::bench
