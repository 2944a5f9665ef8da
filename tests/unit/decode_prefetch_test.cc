// The decode passes' prefetch setting (kernels/decode_prefetch.h): the
// per-vendor defaults, the override's grammar, and its errors. That the
// decode is exact under every setting is checked by running the decode
// tests again with the override set (tests/unit/CMakeLists.txt,
// posbias.attention.decode_prefetch.*).
#include "kernels/decode_prefetch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "posbias/attention.h"
#include "posbias/slopes.h"

namespace posbias::detail {
namespace {

TEST(DecodePrefetch, DefaultsPerVendor) {
  const DecodePrefetch amd = parse_decode_prefetch(nullptr, false);
  EXPECT_FALSE(amd.to_l2);
  EXPECT_EQ(amd.ahead_bytes, 4096);
  EXPECT_EQ(amd.value_group, 8);
  const DecodePrefetch intel = parse_decode_prefetch(nullptr, true);
  EXPECT_TRUE(intel.to_l2);
  EXPECT_EQ(intel.ahead_bytes, 3072);
  EXPECT_EQ(intel.value_group, 4);
  const DecodePrefetch empty = parse_decode_prefetch("", true);  // an empty variable: no override
  EXPECT_TRUE(empty.to_l2);
  EXPECT_EQ(empty.ahead_bytes, 3072);
}

TEST(DecodePrefetch, OverrideSetsHintAndDistance) {
  const DecodePrefetch a = parse_decode_prefetch("t1:2048", false);
  EXPECT_TRUE(a.to_l2);
  EXPECT_EQ(a.ahead_bytes, 2048);
  const DecodePrefetch b = parse_decode_prefetch("t0:64", true);
  EXPECT_FALSE(b.to_l2);
  EXPECT_EQ(b.ahead_bytes, 64);
  EXPECT_EQ(parse_decode_prefetch("t0:32768", true).ahead_bytes, 32768);
  // The value group: the CPU's unless given.
  EXPECT_EQ(parse_decode_prefetch("t1:2048", true).value_group, 4);
  EXPECT_EQ(parse_decode_prefetch("t1:2048", false).value_group, 8);
  const DecodePrefetch c = parse_decode_prefetch("t1:2048:8", true);
  EXPECT_TRUE(c.to_l2);
  EXPECT_EQ(c.ahead_bytes, 2048);
  EXPECT_EQ(c.value_group, 8);
  const DecodePrefetch e = parse_decode_prefetch("t0:64:4", false);
  EXPECT_FALSE(e.to_l2);
  EXPECT_EQ(e.ahead_bytes, 64);
  EXPECT_EQ(e.value_group, 4);
}

TEST(DecodePrefetch, BadOverrideNamesItself) {
  for (const char* text : {"t2:4096", "t1:63", "t1:32769", "t1:", "t1", "x1:4096", "t1-4096",
                           "t1:12a", "t1:99999999", "T1:4096", "t1:-64", " t1:4096", "t1:3072:5",
                           "t1:3072:", "t1:3072:44", "t1::4", "t1:3072:4:4", "t1:32:4"}) {
    try {
      (void)parse_decode_prefetch(text, false);
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
      parse_decode_prefetch(std::getenv("POSBIAS_DECODE_PREFETCH"), cpu_is_intel());
  EXPECT_EQ(a.to_l2, b.to_l2);
  EXPECT_EQ(a.ahead_bytes, b.ahead_bytes);
}

// Run by ctest with a bad POSBIAS_DECODE_PREFETCH (skipped without one): an
// attention call then throws the parse's error, before its threads start,
// and every later call does too.
TEST(DecodePrefetch, BadEnvironmentFailsEveryCallCleanly) {
  const char* env = std::getenv("POSBIAS_DECODE_PREFETCH");
  bool bad = false;
  try {
    (void)parse_decode_prefetch(env, false);
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
