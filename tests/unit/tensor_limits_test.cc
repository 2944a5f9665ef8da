// Requests whose output cannot fit in memory are refused before anything is
// allocated, with the size in the message (issue 7): Tensor::empty.
//
// "Before allocating" is checked by the sizes chosen: each request below
// would need terabytes or more, so an attempt to allocate would fail with
// std::bad_alloc (Release) or stop the process (AddressSanitizer refuses
// requests past its maximum), and a fill would never finish; the tests
// require std::length_error (or std::invalid_argument where the input is
// inconsistent) instead, naming the shape and the bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;

constexpr std::int64_t kMillion = 1000000;

TEST(Limits, TensorEmptyRefusesPastMemoryAndOverflow) {
  expect_throw_with<std::length_error>(
      [] {
        Tensor::empty({kMillion, kMillion, 64}, DType::kBFloat16);
      },
      "needs 128000000000000 bytes, more than this machine's");
  expect_throw_with<std::length_error>(
      [] {
        Tensor::empty({std::int64_t{1} << 62, 4}, DType::kFloat32);
      },
      "overflows int64");
  expect_throw_with<std::invalid_argument>(
      [] {
        Tensor::empty({3, -1}, DType::kFloat32);
      },
      "[3, -1]");
  // Zero elements never overflow, whatever the other extents.
  // (Their strides saturate instead of overflowing: UBSan found the overflow.)
  const Tensor none = Tensor::empty({0, std::int64_t{1} << 62, 1 << 30}, DType::kFloat32);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_TRUE(none.is_contiguous());
  EXPECT_EQ(none.slice(1, 5, 9).shape(), (std::vector<std::int64_t>{0, 4, 1 << 30}));
  EXPECT_EQ(none.transpose(0, 2).numel(), 0);
  EXPECT_TRUE(none.contiguous_copy().to_float_vector().empty());
  const Tensor tail = Tensor::empty({std::int64_t{1} << 62, 1 << 30, 0}, DType::kFloat16);
  EXPECT_EQ(tail.numel(), 0);  // the zero is last: numel must not multiply first
  EXPECT_TRUE(tail.to_float_vector().empty());
}

}  // namespace
}  // namespace posbias
