// `posbias bench` as a process (it runs the posbias-bench program): the
// --json interface of every suite at --quick sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_process.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

namespace posbias::cli {
namespace {

using json = nlohmann::json;

// ------------------------------------------------------------------- bench

TEST(Cli, BenchQuickJsonIsOneObjectPerCase) {
  const ProcessResult run =
      run_ok({"bench", "alibi", "--quick", "--json", "--repetitions", "1", "--warmup", "0"});
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    const json doc = json::parse(line);
    EXPECT_TRUE(doc.at("case").is_string()) << line;
    EXPECT_TRUE(doc.at("median_ms").is_number()) << line;
    EXPECT_TRUE(doc.at("baselines").is_object()) << line;
  }
}

// The dashboard interface of each suite (--quick sizes): every case the
// issues name, each with its same-run baselines and figures, all positive
// and finite (a baseline that silently failed would print 0 or nothing).
struct BenchSuiteCases {
  std::string suite;
  // case name -> the baselines and the extra fields it must carry
  std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases;
};

TEST(Cli, BenchQuickSuitesPrintEveryCaseWithItsBaselines) {
  const std::vector<BenchSuiteCases> suites = {
      {"alibi",
       {{"alibi_h16_n1024_f32", {"fill", "fill_store"}, {"bytes", "gbps", "fraction_of_fill"}},
        {"alibi_h16_n1024_bf16", {"fill"}, {"bytes"}},
        {"alibi_h16_n1024_f16", {"fill"}, {"bytes"}},
        {"alibi_forward_h16_n1024_f32", {"alloc_fill"}, {"fraction_of_alloc_fill"}},
        {"alibi_cache_hit_h16_n1024", {"cache_hit_n256"}, {"ratio_to_small"}}}},
      {"dpb",
       {{"dpb_forward_d64_h8_n1024", {"fill"}, {"fraction_of_fill"}},
        {"dpb_table_d64_h8_n1024", {"naive"}, {"speedup_vs_naive"}},
        {"dpb_backward_d64_h8_n512", {"read"}, {"fraction_of_read"}}}},
      {"attention",
       {{"attention_alibi_causal_h16_n512_d64", {"no_bias"}, {"alibi_cost_over_no_bias"}},
        {"attention_none_causal_h16_n512_d64", {"alibi"}, {"gflops"}},
        {"attention_table_causal_h16_n512_d64", {"no_bias"}, {"table_cost_over_no_bias"}},
        {"attention_alibi_noncausal_h16_n512_d64", {"sgemm_gflops"}, {"gflops"}},
        {"decode_alibi_h32_n4096_d128", {"read_gbps"}, {"gbps"}},
        {"memory_h16_n2048_d64", {}, {"peak_bytes", "io_bytes"}}}},
  };
  for (const BenchSuiteCases& suite : suites) {
    const ProcessResult run =
        run_ok({"bench", suite.suite, "--quick", "--json", "--repetitions", "1", "--warmup", "0"});
    std::map<std::string, json> by_case;
    for (const std::string& line : lines_of(run.out)) {
      const json doc = json::parse(line);
      by_case[doc.at("case").get<std::string>()] = doc;
    }
    for (const auto& [name, baselines, extra] : suite.cases) {
      SCOPED_TRACE(suite.suite + " " + name);
      ASSERT_EQ(by_case.count(name), 1u) << run.out;
      const json& doc = by_case[name];
      const auto positive = [](const json& v) {
        return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0.0;
      };
      if (name.rfind("memory_", 0) != 0) {
        EXPECT_TRUE(positive(doc.at("median_ms"))) << doc;
      }
      for (const std::string& b : baselines) {
        EXPECT_TRUE(doc.at("baselines").contains(b) && positive(doc["baselines"][b])) << b << doc;
      }
      for (const std::string& e : extra) {
        ASSERT_TRUE(doc.contains(e)) << e << doc;
        if (e.find("_cost_over_") != std::string::npos) {  // a difference: any sign
          EXPECT_TRUE(doc[e].is_number() && std::isfinite(doc[e].get<double>())) << e << doc;
        } else {
          EXPECT_TRUE(positive(doc[e])) << e << doc;
        }
      }
    }
  }
}


}  // namespace
}  // namespace posbias::cli
