// The shared argument checks of src/checks.h: how a user's name is shown in
// a message (detail::quoted_name, the one helper every message uses) and
// the error of a failed allocation.
#include "checks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace posbias {
namespace {

TEST(Checks, QuotedNameEscapesAndShortens) {
  EXPECT_EQ(detail::quoted_name(""), "\"\"");
  EXPECT_EQ(detail::quoted_name("mlp.0.weight"), "\"mlp.0.weight\"");
  EXPECT_EQ(detail::quoted_name("a\"b\\c\td\re"), "\"a\\\"b\\\\c\\td\\re\"");
  EXPECT_EQ(detail::quoted_name(std::string("\0z", 2)), "\"\\u0000z\"");
  // UTF-8 letters stay; C1 controls (U+0080..U+009F) are escaped; bytes that
  // are not UTF-8 (a stray continuation, an overlong form, a surrogate, a
  // sequence cut short) are shown as \xNN.
  EXPECT_EQ(detail::quoted_name("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            "\"h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
  EXPECT_EQ(detail::quoted_name("\xc2\x85"), "\"\\u0085\"");
  EXPECT_EQ(detail::quoted_name("\x80\xc0\xaf\xed\xa0\x80\xe2\x82"),
            "\"\\x80\\xc0\\xaf\\xed\\xa0\\x80\\xe2\\x82\"");
  for (const test::OddName& odd : test::odd_names()) {
    test::expect_short_printable(detail::quoted_name(odd.name), odd.shown);
  }
  // A name of control bytes only is cut by its shown length, not its own.
  const std::string shown = detail::quoted_name(std::string(100000, '\x01'));
  EXPECT_LT(shown.size(), detail::kShownNameChars + 40) << shown;
  EXPECT_NE(shown.find("...\" (100000 bytes)"), std::string::npos) << shown;
}

TEST(Checks, QuotedNamesStopsAfterMaxItems) {
  EXPECT_EQ(detail::quoted_names({}), "");
  EXPECT_EQ(detail::quoted_names({"a", ""}), "\"a\", \"\"");
  std::vector<std::string> many(1000, "x");
  EXPECT_EQ(detail::quoted_names(many, 2), "\"x\", \"x\", ... (1000 in all)");
}

TEST(Checks, AllocationErrorNamesBytesAndBuffer) {
  const std::length_error e = detail::allocation_error(4096, "a test buffer");
  EXPECT_STREQ(e.what(), "could not allocate 4096 bytes for a test buffer");
}

}  // namespace
}  // namespace posbias
