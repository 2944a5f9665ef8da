// The decode passes' prefetch setting (kernels/decode_prefetch.h): the
// per-vendor defaults, the override's grammar, and its errors. That the
// decode is exact under every setting is checked by running the decode
// tests again with the override set (tests/unit/CMakeLists.txt,
// posbias.attention.decode_prefetch.*).
#include "kernels/decode_prefetch.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "posbias/attention.h"
#include "posbias/slopes.h"

namespace posbias::detail {
namespace {

TEST(DecodePrefetch, DefaultsPerVendor) {
  const DecodePrefetch amd = parse_decode_prefetch(nullptr, DecodeCpu::kOther);
  EXPECT_FALSE(amd.to_l2);
  EXPECT_EQ(amd.ahead_bytes, 4096);
  EXPECT_EQ(amd.value_group, 8);
  const DecodePrefetch intel = parse_decode_prefetch(nullptr, DecodeCpu::kIntel);
  EXPECT_TRUE(intel.to_l2);
  EXPECT_EQ(intel.ahead_bytes, 3072);
  EXPECT_EQ(intel.value_group, 4);
  // An empty variable: no override.
  const DecodePrefetch empty = parse_decode_prefetch("", DecodeCpu::kIntel);
  EXPECT_TRUE(empty.to_l2);
  EXPECT_EQ(empty.ahead_bytes, 3072);
  EXPECT_FALSE(amd.f32_value_prefetch);
  EXPECT_FALSE(intel.f32_value_prefetch);
  const DecodePrefetch zen4 = parse_decode_prefetch(nullptr, DecodeCpu::kZen4);
  EXPECT_TRUE(zen4.to_l2);
  EXPECT_EQ(zen4.ahead_bytes, 8192);
  EXPECT_EQ(zen4.value_group, 8);
  EXPECT_TRUE(zen4.f32_value_prefetch);
}

TEST(DecodePrefetch, CpuKindMatchesCpuinfo) {
  // The kind from cpuid against /proc/cpuinfo's first processor, where
  // the file is there (Linux on x86).
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string vendor, family, flags;
  char line[8192];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const std::string l(line);
    const auto value = [&]() { return l.substr(l.find(':') + 1); };
    if (vendor.empty() && l.rfind("vendor_id", 0) == 0) vendor = value();
    if (family.empty() && l.rfind("cpu family", 0) == 0) family = value();
    if (flags.empty() && l.rfind("flags", 0) == 0) flags = value() + " ";
  }
  std::fclose(f);
  if (vendor.empty() || family.empty()) GTEST_SKIP() << "no vendor_id or cpu family line";
  DecodeCpu want = DecodeCpu::kOther;
  if (vendor.find("GenuineIntel") != std::string::npos) want = DecodeCpu::kIntel;
  if (vendor.find("AuthenticAMD") != std::string::npos && std::stoi(family) == 25 &&
      flags.find(" avx512f ") != std::string::npos) {
    want = DecodeCpu::kZen4;
  }
  EXPECT_EQ(static_cast<int>(cpu_kind()), static_cast<int>(want)) << vendor << family;
}

TEST(DecodePrefetch, OverrideSetsHintAndDistance) {
  const DecodePrefetch a = parse_decode_prefetch("t1:2048", DecodeCpu::kOther);
  EXPECT_TRUE(a.to_l2);
  EXPECT_EQ(a.ahead_bytes, 2048);
  const DecodePrefetch b = parse_decode_prefetch("t0:64", DecodeCpu::kIntel);
  EXPECT_FALSE(b.to_l2);
  EXPECT_EQ(b.ahead_bytes, 64);
  EXPECT_EQ(parse_decode_prefetch("t0:32768", DecodeCpu::kIntel).ahead_bytes, 32768);
  // The value group: the CPU's unless given.
  EXPECT_EQ(parse_decode_prefetch("t1:2048", DecodeCpu::kIntel).value_group, 4);
  EXPECT_EQ(parse_decode_prefetch("t1:2048", DecodeCpu::kOther).value_group, 8);
  const DecodePrefetch c = parse_decode_prefetch("t1:2048:8", DecodeCpu::kIntel);
  EXPECT_TRUE(c.to_l2);
  EXPECT_EQ(c.ahead_bytes, 2048);
  EXPECT_EQ(c.value_group, 8);
  const DecodePrefetch e = parse_decode_prefetch("t0:64:4", DecodeCpu::kOther);
  EXPECT_FALSE(e.to_l2);
  EXPECT_EQ(e.ahead_bytes, 64);
  EXPECT_EQ(e.value_group, 4);
  // The float32 value prefetch: the CPU's, whatever the override.
  EXPECT_TRUE(parse_decode_prefetch("t0:4096", DecodeCpu::kZen4).f32_value_prefetch);
  EXPECT_FALSE(parse_decode_prefetch("t1:8192", DecodeCpu::kOther).f32_value_prefetch);
}

TEST(DecodePrefetch, BadOverrideNamesItself) {
  for (const char* text : {"t2:4096", "t1:63", "t1:32769", "t1:", "t1", "x1:4096", "t1-4096",
                           "t1:12a", "t1:99999999", "T1:4096", "t1:-64", " t1:4096", "t1:3072:5",
                           "t1:3072:", "t1:3072:44", "t1::4", "t1:3072:4:4", "t1:32:4"}) {
    try {
      (void)parse_decode_prefetch(text, DecodeCpu::kOther);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("POSBIAS_DECODE_PREFETCH"), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + text + "'"), std::string::npos) << what;
    }
  }
}

TEST(DecodePrefetch, ProcessSettingIsTheEnvironmentsOnThisCpu) {
  const DecodePrefetch& a = decode_prefetch();
  EXPECT_EQ(&a, &decode_prefetch());  // found once
  const DecodePrefetch b =
      parse_decode_prefetch(std::getenv("POSBIAS_DECODE_PREFETCH"), cpu_kind());
  EXPECT_EQ(a.to_l2, b.to_l2);
  EXPECT_EQ(a.ahead_bytes, b.ahead_bytes);
  EXPECT_EQ(a.value_group, b.value_group);
  EXPECT_EQ(a.f32_value_prefetch, b.f32_value_prefetch);
}

// Run by ctest with a bad POSBIAS_DECODE_PREFETCH (skipped without one): an
// attention call then throws the parse's error, before its threads start,
// and every later call does too.
TEST(DecodePrefetch, BadEnvironmentFailsEveryCallCleanly) {
  const char* env = std::getenv("POSBIAS_DECODE_PREFETCH");
  bool bad = false;
  try {
    (void)parse_decode_prefetch(env, DecodeCpu::kOther);
  } catch (const std::invalid_argument&) {
    bad = true;
  }
  if (!bad) GTEST_SKIP() << "POSBIAS_DECODE_PREFETCH is unset or valid";
  const Tensor q = Tensor::full({1, 4, 1, 64}, 0.1f);
  const Tensor kv = Tensor::full({1, 2, 100, 64}, 0.2f);
  for (int call = 0; call < 2; ++call) {
    try {
      (void)attention_forward(q, kv, kv, AttentionBias::alibi(alibi_slopes(4)), AttentionOptions());
      ADD_FAILURE() << "the call ran with POSBIAS_DECODE_PREFETCH='" << env << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(env), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace posbias::detail
