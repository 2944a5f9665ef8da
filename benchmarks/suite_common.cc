// The suites' shared helpers (suite_common.h).
#include "suite_common.h"

#include <hwy/targets.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace posbias::bench {

std::string dtype_tag(DType d) {
  if (d == DType::kFloat32) return "f32";
  if (d == DType::kBFloat16) return "bf16";
  if (d == DType::kFloat16) return "f16";
  return dtype_name(d);
}

double gbps(std::size_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) / ms / 1e6 : 0.0;
}

void use_only_isa(const std::string& name) {
  if (name.empty()) return;
  std::string have;
  for (const std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (hwy::TargetName(t) == name) {
      hwy::SetSupportedTargetsForTest(t);
      return;
    }
    have += std::string(have.empty() ? "" : ", ") + hwy::TargetName(t);
  }
  throw std::invalid_argument("no instruction set '" + name + "' here; this CPU and build have " +
                              have);
}

namespace {

// `text` in single quotes for /bin/sh (a path with spaces or quotes stays
// one word).
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string run_peer(const std::string& script, const std::string& args, std::string* why) {
#ifdef POSBIAS_BENCH_DIR
  const char* env = std::getenv("POSBIAS_PEER_PYTHON");
  const std::string python = env ? env : "/usr/bin/python3";
  const std::string cmd = shell_quote(python) + " " +
                          shell_quote(std::string(POSBIAS_BENCH_DIR) + "/" + script) + " " + args +
                          " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) {
    *why = "could not start " + python;
    return "";
  }
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe.get()) != nullptr) text += buf;
  // The last line is the peer's JSON object.
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::size_t line_start = text.find_last_of('\n');
  text = line_start == std::string::npos ? text : text.substr(line_start + 1);
  if (text.empty() || text.front() != '{') {
    *why = "PyTorch peer unavailable (" + python + " without torch?)";
    return "";
  }
  return text;
#else
  (void)script;
  (void)args;
  *why = "PyTorch peer scripts not found in this installation";
  return "";
#endif
}

double json_field(const std::string& text, const std::string& key) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return -1;
  const auto it = doc.find(key);
  return it != doc.end() && it->is_number() ? it->get<double>() : -1;
}

void add_pytorch_baseline(CaseResult& r, const std::string& name, double ms) {
  r.baselines[name] = ms;
  const std::string stem = name.size() > 3 && name.compare(name.size() - 3, 3, "_ms") == 0
                               ? name.substr(0, name.size() - 3)
                               : name;
  r.extra["speedup_vs_" + stem] = ms / r.median_ms;
}

Tensor random_tensor(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.mutable_data<float>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t k = 0; k < t.numel(); ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[k] = static_cast<float>(static_cast<double>(x >> 40) * 0x1p-23 - 1.0);
  }
  return t;
}

}  // namespace posbias::bench
