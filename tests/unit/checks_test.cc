// The shared argument checks of src/checks.h: how a user's name is shown in
// a message (detail::quoted_name, the one helper every message uses) and
// the error of a failed allocation; the kernels' float32 -> dtype store
// (kernels/float_store.h) and its error for a dtype it cannot store.
#include "checks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/float_store.h"
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

// store_floats writes the three float dtypes, each value times mul rounded
// once; any other dtype (the callers check first) is an
// std::invalid_argument naming it, with nothing written.
TEST(Checks, FloatStoreWritesFloatDtypesAndRefusesTheOthers) {
  const std::vector<float> src = {1.0f, -2.5f, 3.0f};
  std::vector<float> f32(3, 0.0f);
  detail::store_floats(src.data(), 3, 2.0f, DType::kFloat32, f32.data());
  EXPECT_EQ(f32, (std::vector<float>{2.0f, -5.0f, 6.0f}));
  std::vector<bfloat16> bf(3);
  detail::store_floats(src.data(), 3, 1.0f / 3.0f, DType::kBFloat16, bf.data());
  std::vector<float16> hf(3);
  detail::store_floats(src.data(), 3, 1.0f / 3.0f, DType::kFloat16, hf.data());
  for (std::size_t x = 0; x < 3; ++x) {
    EXPECT_EQ(bf[x].bits, to_bfloat16(src[x] * (1.0f / 3.0f)).bits) << x;
    EXPECT_EQ(hf[x].bits, to_float16(src[x] * (1.0f / 3.0f)).bits) << x;
  }
  for (const DType dt : {DType::kFloat64, DType::kInt32, DType::kUInt8, DType::kBool}) {
    std::vector<unsigned char> dst(3 * 8, 0xAB);
    try {
      detail::store_floats(src.data(), 3, 1.0f, dt, dst.data());
      ADD_FAILURE() << "no exception for " << dtype_name(dt);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "float store: dtype " + dtype_name(dt) +
                                           " is not supported here (expected float32, "
                                           "bfloat16 or float16)");
    }
    EXPECT_EQ(dst, std::vector<unsigned char>(3 * 8, 0xAB)) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace posbias
