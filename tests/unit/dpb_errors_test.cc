// DynamicPositionBias on bad input: options and lengths are refused with
// the values in the message, and table lengths past int64 or memory are
// length errors naming j.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpb_reference.h"
#include "posbias/dpb.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;
using test::variants;
using test::xt_options;

// --------------------------------------------------------------- bad input

TEST(DynamicPositionBias, RejectsBadOptionsWithValues) {
  const auto message = [](const DpbOptions& o) -> std::string {
    try {
      DynamicPositionBias m(o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THROW(DynamicPositionBias(0, 8), std::invalid_argument);
  EXPECT_THROW(DynamicPositionBias(64, 0), std::invalid_argument);
  EXPECT_THROW(DynamicPositionBias(-3, 8), std::invalid_argument);
  EXPECT_NE(message(DpbOptions{0, 8}).find("dim must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message(DpbOptions{4, -2}).find("heads must be >= 1, got -2"), std::string::npos);
  EXPECT_NE(message(xt_options(4, 2, 0, false, false)).find("depth must be >= 1, got 0"),
            std::string::npos);
  DpbOptions z{4, 2};
  z.depth = 3;
  EXPECT_NE(message(z).find("depth = 3"), std::string::npos) << message(z);
  z.depth = 2;
  z.norm = true;
  EXPECT_FALSE(message(z).empty());
  z.norm = false;
  z.log_distance = true;
  EXPECT_FALSE(message(z).empty());
  DpbOptions e = xt_options(4, 2, 2, false, true);
  e.layernorm_eps = -1.0f;
  EXPECT_NE(message(e).find("layernorm_eps"), std::string::npos);
  e.layernorm_eps = NAN;
  EXPECT_FALSE(message(e).empty());
}

TEST(DynamicPositionBias, RejectsBadLengthsWithValues) {
  DynamicPositionBias m(4, 2);
  DynamicPositionBias x(xt_options(4, 2, 2, false, false));
  for (const DynamicPositionBias* p : {&m, &x}) {
    try {
      p->forward(6, 5);
      FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("i = 6, j = 5"), std::string::npos) << e.what();
    }
    EXPECT_THROW(p->forward(-1, 5), std::invalid_argument);
    EXPECT_THROW(p->forward(0, -1), std::invalid_argument);
    EXPECT_THROW(p->forward(1, 0), std::invalid_argument);
    EXPECT_THROW(p->table(0), std::invalid_argument);
    EXPECT_THROW(p->distance_table(-4), std::invalid_argument);
    EXPECT_THROW(p->backward(-1, 3, Tensor()), std::invalid_argument);
  }
  // Too large to ever allocate: a clean error before allocating.
  EXPECT_THROW(m.forward(std::int64_t{1} << 40, std::int64_t{1} << 40), std::length_error);
}

// The table's length 2j - 1 overflows int64 for j > 2^62: the size is checked
// before it is formed (was signed overflow, then "tensor extents must be >= 0,
// got shape [2, -9223372036854775807]" from j = 2^62 + 1), for every table
// entry point and both variants; a j whose table merely exceeds the memory
// gets the same kind of error, naming j and the shape.
TEST(DynamicPositionBias, HugeTableLengthsAreLengthErrorsNamingJ) {
  DynamicPositionBias m(4, 2);
  DynamicPositionBias x(xt_options(4, 2, 2, false, false));
  const std::int64_t overflowing = (std::int64_t{1} << 62) + 1;  // 4611686018427387905
  const std::int64_t too_big = std::int64_t{1} << 60;            // 2j - 1 fits, memory does not
  const Tensor grad = Tensor::full({2, 3}, 0.0f);
  for (const DynamicPositionBias* p : {&m, &x}) {
    for (const std::int64_t j : {overflowing, too_big}) {
      const std::string js = "j = " + std::to_string(j);
      expect_throw_with<std::length_error>([&] { p->distance_table(j); }, js);
      expect_throw_with<std::length_error>([&] { p->table(j); }, js);
      expect_throw_with<std::length_error>([&] { p->backward_table(j, grad); }, js);
      expect_throw_with<std::length_error>([&] { p->backward_distance_table(j, grad); }, js);
    }
    expect_throw_with<std::length_error>([&] { p->distance_table(overflowing); }, "overflow int64");
    expect_throw_with<std::length_error>([&] { p->distance_table(too_big); },
                                         "[2, " + std::to_string(2 * too_big - 1) + "]");
  }
  expect_throw_with<std::length_error>([&] { m.table(too_big); },
                                       "[2, " + std::to_string(too_big) + "]");
}

// Issue 19: names from a state dict (a file's keys) are shown quoted and
// escaped, a long one shortened with its length; lists stop after 8 names
// (was: printed raw, "unexpected  (" for an empty key, a 1 MB error line).
TEST(DynamicPositionBias, OddNamesInMessagesAreQuotedEscapedAndShort) {
  DynamicPositionBias m(4, 2, 1);
  const auto error_of = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  for (const test::OddName& odd : test::odd_names()) {
    TensorMap s = m.state_dict();
    s.emplace(odd.name, Tensor::full({1}, 0.0f));
    test::expect_short_printable(error_of([&] { m.load_state_dict(s); }),
                                 "unexpected " + odd.shown);
    test::expect_short_printable(error_of([&] { (void)m.parameter(odd.name); }),
                                 "no parameter named " + odd.shown);
  }
  // 100000 unexpected names: the first 8 and the count.
  TensorMap many = m.state_dict();
  const Tensor one = Tensor::full({1}, 0.0f);
  for (int k = 0; k < 100000; ++k) many.emplace("x" + std::to_string(k), one);
  test::expect_short_printable(error_of([&] { m.load_state_dict(many); }), "(100000 in all)");
  // A deep module's own list is shortened the same way.
  DynamicPositionBias deep(xt_options(2, 1, 5000, false, false));
  test::expect_short_printable(error_of([&] { deep.load_state_dict({}); }),
                               "missing \"mlp.0.0.weight\", \"mlp.0.0.bias\"");
}

}  // namespace
}  // namespace posbias
