// `posbias bench` as a process (it runs the posbias-bench program): the
// --json interface of every suite at --quick sizes, and what it says when
// posbias-bench is not there.
#include <gtest/gtest.h>
#include <unistd.h>

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
#include "openblas_core.h"
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
       {{"attention_alibi_causal_h16_n512_d64",
         {"no_bias", "fma_peak_gflops"},
         {"alibi_cost_over_no_bias", "gflops", "fraction_of_fma_peak"}},
        {"attention_none_causal_h16_n512_d64", {"alibi", "fma_peak_gflops"}, {"gflops"}},
        {"attention_table_causal_h16_n512_d64", {"no_bias"}, {"table_cost_over_no_bias"}},
        {"attention_alibi_noncausal_h16_n512_d64",
         {"sgemm_gflops", "fma_peak_gflops"},
         {"gflops", "fraction_of_fma_peak"}},
        {"decode_alibi_h32_n4096_d128",
         {"read_gbps", "fma_peak_gflops"},
         {"gbps", "gflops", "fraction_of_read_best"}},
        {"decode_gqa_alibi_h32_hk8_n4096_d128",
         {"read_gbps", "multi_head_ms"},
         {"gbps", "fraction_of_read_best"}},
        {"decode_alibi_h32_n4096_d128_f16kv",
         {"read_gbps", "f32kv"},
         {"fraction_of_read", "fraction_of_read_best"}},
        {"decode_alibi_h32_n4096_d128_bf16kv", {"read_gbps", "f32kv"}, {"fraction_of_read"}},
        {"decode_alibi_h32_n4096_d128_f16",
         {"read_gbps", "f32kv", "f16kv_ms"},
         {"fraction_of_read", "speedup_over_f32kv"}},
        {"varlen_alibi_causal_h8_d64_b8",
         {"per_sequence", "padded"},
         {"speedup_over_per_sequence", "speedup_over_padded", "gflops"}},
        {"varlen_backward_alibi_causal_h8_d64_b8", {"per_sequence"}, {"speedup_over_per_sequence"}},
        {"backward_gqa_alibi_causal_h32_hk8_n256_d128",
         {"multi_head", "fma_peak_gflops"},
         {"gflops", "fraction_of_fma_peak"}},
        {"window_alibi_causal_h4_n2048_d64_w128", {"full"}, {"speedup_over_full", "gflops"}},
        {"masked_alibi_causal_h16_n512_d64", {"plain"}, {"mask_cost_over_plain"}},
        {"softcap_alibi_causal_h16_n512_d64", {"plain"}, {"softcap_cost_over_plain"}},
        {"paged_decode_alibi_b8_h32_hk8_d128_block16",
         {"contiguous", "slab", "read_gbps"},
         {"fraction_of_read", "fraction_of_read_best", "fraction_of_contiguous",
          "fraction_of_slab"}},
        {"paged_append_alibi_b4_i16_h32_hk8_d128_block16",
         {"contiguous", "slab"},
         {"fraction_of_contiguous", "fraction_of_slab", "append_ms"}},
        {"paged_prefill_alibi_b4_c64_i64_h32_hk8_d128_block16",
         {"contiguous", "slab", "fma_peak_gflops"},
         {"fraction_of_contiguous", "fraction_of_slab", "append_ms", "gflops"}},
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
      // A case with a target says whether this run met it.
      if (doc.contains("target")) {
        EXPECT_TRUE(doc["target"].is_string() && doc.at("target_met").is_boolean()) << doc;
      }
      // One round (--repetitions 1): its fastest round is its median, so
      // the fastest-round fraction of read is the medians' one.
      if (doc.contains("fraction_of_read_best") && doc.contains("fraction_of_read")) {
        const double best = doc["fraction_of_read_best"].get<double>();
        EXPECT_NEAR(best, doc["fraction_of_read"].get<double>(), 1e-9 * best) << doc;
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

// --only reports the cases whose name contains the text, and nothing else.
TEST(Cli, BenchOnlyReportsTheNamedCases) {
  const ProcessResult run = run_ok({"bench", "attention", "--quick", "--json", "--repetitions", "1",
                                    "--warmup", "0", "--only", "decode_gqa"});
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 1u) << run.out;
  const json doc = json::parse(lines[0]);
  EXPECT_EQ(doc.at("case"), "decode_gqa_alibi_h32_hk8_n4096_d128") << doc;
  EXPECT_TRUE(doc.at("baselines").contains("fma_peak_gflops")) << doc;
}

// --isa runs the kernels and the probes in one instruction set of those
// this CPU and build have (the FMA probe's note names it); an unknown name
// exits 2 with the list of the ones there are.
TEST(Cli, BenchIsaRunsTheNamedInstructionSet) {
  const std::vector<std::string> args = {"bench",         "attention",  "--quick",  "--json",
                                         "--repetitions", "1",          "--warmup", "0",
                                         "--only",        "decode_gqa", "--isa"};
  std::vector<std::string> bad = args;
  bad.push_back("NO_SUCH_ISA");
  const ProcessResult refused = run_posbias(bad);
  EXPECT_EQ(refused.exit_code, 2) << describe(bad, refused);
  EXPECT_TRUE(refused.out.empty()) << describe(bad, refused);
  const std::string head = "no instruction set 'NO_SUCH_ISA' here; this CPU and build have ";
  const std::size_t at = refused.err.find(head);
  ASSERT_NE(at, std::string::npos) << describe(bad, refused);
  // The list, best first: the second is one the CPU has that its best
  // dispatch would not run.
  std::vector<std::string> have;
  std::stringstream list(refused.err.substr(at + head.size()));
  for (std::string name; std::getline(list, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(" \n") + 1);
    have.push_back(name);
  }
  ASSERT_FALSE(have.empty()) << refused.err;
  if (have.size() < 2) GTEST_SKIP() << "one instruction set only: " << have[0];
  for (const std::string& isa : {have[0], have[1]}) {
    std::vector<std::string> good = args;
    good.push_back(isa);
    const ProcessResult run = run_ok(good);
    const std::vector<std::string> lines = lines_of(run.out);
    ASSERT_EQ(lines.size(), 1u) << run.out;
    const json doc = json::parse(lines[0]);
    EXPECT_NE(doc.at("note").get<std::string>().find("FMA loop on all threads (" + isa + ","),
              std::string::npos)
        << isa << ": " << doc;
    EXPECT_GT(doc.at("fraction_of_read").get<double>(), 0) << doc;
  }
}

// OpenBLAS's generic cores are overridden by the widest kernels the CPU
// runs; a core with AVX2 and FMA kernels (any case) is kept.
TEST(Cli, BenchOverridesOnlyAGenericOpenBlasCore) {
  using bench::openblas_core_for;
  EXPECT_EQ(openblas_core_for("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_for("prescott", false, true), "Haswell");
  EXPECT_EQ(openblas_core_for("Core2", false, true), "Haswell");
  EXPECT_EQ(openblas_core_for("Prescott", false, false), "");
  EXPECT_EQ(openblas_core_for("", true, true), "SkylakeX");
  for (const char* kept :
       {"Haswell", "SkylakeX", "SKYLAKEX", "Cooperlake", "SapphireRapids", "Zen"}) {
    EXPECT_EQ(openblas_core_for(kept, true, true), "") << kept;
  }
}

// The sgemm roofline names the OpenBLAS kernels it ran, and on a CPU with
// AVX2 and FMA they are not a generic core's (posbias-bench runs itself
// again with OPENBLAS_CORETYPE where OpenBLAS fell back to one).
TEST(Cli, BenchSgemmRunsThisCpusOpenBlasKernels) {
  const ProcessResult run = run_ok({"bench", "attention", "--quick", "--json", "--repetitions", "1",
                                    "--warmup", "0", "--only", "alibi_noncausal"});
  std::string note;
  for (const std::string& line : lines_of(run.out)) {
    const json doc = json::parse(line);
    if (doc.at("baselines").contains("sgemm_gflops")) note = doc.at("note");
  }
  const std::string head = "OpenBLAS (";
  const std::size_t at = note.find(head);
  ASSERT_NE(at, std::string::npos) << run.out;
  const std::size_t end = note.find(" kernels", at);
  ASSERT_NE(end, std::string::npos) << note;
  const std::string core = note.substr(at + head.size(), end - at - head.size());
  EXPECT_FALSE(core.empty()) << note;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    EXPECT_EQ(bench::openblas_core_for(core, false, true), "") << "generic core " << core;
  }
#endif
}

// posbias bench runs posbias-bench from beside its own executable: a copy
// of the tool in a folder without it exits 2 with one line that says how to
// build it.
TEST(Cli, BenchWithoutTheBenchProgramSaysHowToBuildIt) {
#ifdef POSBIAS_INSTALL_BINDIR
  if (std::filesystem::exists(std::string(POSBIAS_INSTALL_BINDIR) + "/posbias-bench")) {
    GTEST_SKIP() << "posbias-bench is installed in " << POSBIAS_INSTALL_BINDIR
                 << ", where the tool looks second";
  }
#endif
  std::string pattern =
      (std::filesystem::temp_directory_path() / "posbias_cli_test_bench_XXXXXX").string();
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  const std::filesystem::path copy = dir / "posbias";
  std::filesystem::copy_file(posbias_path(), copy);
  ASSERT_FALSE(std::filesystem::exists(dir / "posbias-bench"));
  const std::vector<std::string> args = {"bench", "alibi", "--quick"};
  const ProcessResult run = run_executable(copy.string(), args);
  // The options are checked before the program is looked for.
  const ProcessResult bad = run_executable(copy.string(), {"bench", "no-such-suite"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(run.exit_code, 2) << describe(args, run);
  EXPECT_EQ(run.out, "") << describe(args, run);
  const std::vector<std::string> lines = lines_of(run.err);
  ASSERT_EQ(lines.size(), 1u) << describe(args, run);
  EXPECT_EQ(lines[0].rfind("posbias: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("posbias-bench"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("cmake --build build --target posbias-bench"), std::string::npos)
      << lines[0];
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("unknown benchmark suite 'no-such-suite'"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace posbias::cli
