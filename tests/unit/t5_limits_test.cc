// Requests whose output cannot fit in memory are refused before anything is
// allocated, with the size in the message (issue 7): RelativePositionBias (T5).
//
// "Before allocating" is checked by the sizes chosen: each request below
// would need terabytes or more, so an attempt to allocate would fail with
// std::bad_alloc (Release) or stop the process (AddressSanitizer refuses
// requests past its maximum), and a fill would never finish; the tests
// require std::length_error (or std::invalid_argument where the input is
// inconsistent) instead, naming the shape and the bytes.
// Requests that fit must not need much more memory than their output
// (peak resident growth, test::expect_little_more_memory_than_output).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;

constexpr std::int64_t kMillion = 1000000;

TEST(Limits, RelativePositionBiasRefusesBeforeItsTable) {
  const RelativePositionBias t5(1.f, false, 32, 128, 16);
  expect_throw_with<std::length_error>([&] { t5.forward(kMillion, kMillion); },
                                       "[16, 1000000, 1000000] (float32) needs 64000000000000");
  expect_throw_with<std::length_error>([&] { t5.distance_table(kMillion * kMillion); }, "bytes");
}

// Tall, narrow T5 outputs are written without a whole per-head table (see
// test::expect_little_more_memory_than_output).
TEST(Limits, T5NarrowOutputsNeedLittleMoreMemoryThanThemselves) {
  const std::int64_t n = 12 * kMillion;
  const RelativePositionBias t5(1.f, false, 32, 128, 1);
  test::expect_little_more_memory_than_output(
      n,
      {
          {"T5 i=12e6 j=1", DType::kFloat32, [&] { return t5.forward(n, 1); }},
          {"T5 i=12e6 j=1 f16", DType::kFloat16, [&] { return t5.forward(n, 1, DType::kFloat16); }},
      });
}

// Issue 19: a state dict's odd names (empty, control bytes, 1 MB) are shown
// quoted, escaped and shortened.
TEST(RelativePositionBias, OddNamesInMessagesAreQuotedEscapedAndShort) {
  RelativePositionBias m(2.0f, false, 16, 64, 4, 1);
  for (const test::OddName& odd : test::odd_names()) {
    for (const bool with_weight : {false, true}) {
      TensorMap s = {{odd.name, Tensor::full({1}, 0.0f)}};
      if (with_weight) s.emplace("relative_attention_bias.weight", Tensor::full({16, 4}, 0.0f));
      try {
        m.load_state_dict(s);
        ADD_FAILURE() << "no exception";
      } catch (const std::invalid_argument& e) {
        test::expect_short_printable(e.what(), (with_weight ? "unexpected " : "got ") + odd.shown);
      }
    }
  }
}

}  // namespace
}  // namespace posbias
