// Requests whose output cannot fit in memory are refused before anything is
// allocated, with the size in the message (issue 7): DynamicPositionBias.
//
// "Before allocating" is checked by the sizes chosen: each request below
// would need terabytes or more, so an attempt to allocate would fail with
// std::bad_alloc (Release) or stop the process (AddressSanitizer refuses
// requests past its maximum), and a fill would never finish; the tests
// require std::length_error (or std::invalid_argument where the input is
// inconsistent) instead, naming the shape and the bytes.
// Requests that fit must not need much more memory than their output
// (peak resident growth, test::expect_little_more_memory_than_output), and
// the backward holds one partial gradient per thread.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/dpb.h"
#include "posbias/tensor.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;
using test::peak_growth_kb;

constexpr std::int64_t kMillion = 1000000;

TEST(Limits, DynamicPositionBiasRefusesBeforeItsTable) {
  // The MLP table (j x dim floats) is built only after the output size is
  // checked: j = 1e12 would need 4e12 x 64 bytes for it alone.
  const DynamicPositionBias dpb(64, 8);
  expect_throw_with<std::length_error>([&] { dpb.forward(kMillion, kMillion); },
                                       "[8, 1000000, 1000000] (float32) needs 32000000000000");
  expect_throw_with<std::length_error>([&] { dpb.forward(1, kMillion * kMillion); },
                                       "[8, 1, 1000000000000]");
  expect_throw_with<std::length_error>([&] { dpb.distance_table(kMillion * kMillion); }, "bytes");
  expect_throw_with<std::length_error>([&] { dpb.table(kMillion * kMillion); }, "bytes");
  DpbOptions xt;
  xt.variant = DpbVariant::kXTransformers;
  xt.dim = 64;
  xt.heads = 8;
  const DynamicPositionBias x(xt);
  expect_throw_with<std::length_error>([&] { x.forward(kMillion, kMillion, DType::kFloat16); },
                                       "16000000000000 bytes");
  // A gradient request of the same size is refused as well.
  expect_throw_with<std::invalid_argument>(
      [&] { dpb.backward(kMillion, kMillion, Tensor::full({1}, 0.f)); }, "1000000");
}

// Single-row (decode) DPB outputs are written without a whole per-head
// table (see test::expect_little_more_memory_than_output).
TEST(Limits, DpbNarrowOutputsNeedLittleMoreMemoryThanThemselves) {
  const std::int64_t n = 12 * kMillion;
  const DynamicPositionBias dpb(4, 1);
  DpbOptions xo;
  xo.variant = DpbVariant::kXTransformers;
  xo.dim = 4;
  xo.heads = 1;
  const DynamicPositionBias xdpb(xo);
  test::expect_little_more_memory_than_output(
      n, {
             {"DPB zeta i=1 j=12e6", DType::kFloat32, [&] { return dpb.forward(1, n); }},
             {"DPB x-transformers i=1 j=12e6 bf16", DType::kBFloat16,
              [&] { return xdpb.forward(1, n, DType::kBFloat16); }},
         });
}

// The DPB backward keeps one partial parameter gradient per thread, not one
// per slot of rows (up to 64): at dim 256 (66K parameters, 263 KB) over
// 2j - 1 = 16383 distances, 64 slots held 16.8 MB of partials (peak growth
// measured 20.6 MB before, 4.3 MB after with 2 threads); at dim 4096 the
// whole call peaked at 1.6 GB for j = 2048.
TEST(Limits, DpbBackwardHoldsOnePartialGradientPerThread) {
  DpbOptions o;
  o.variant = DpbVariant::kXTransformers;
  o.dim = 256;
  o.heads = 8;
  const DynamicPositionBias m(o, 1);
  const std::int64_t j = 8192;
  const Tensor grad = Tensor::full({8, 2 * j - 1}, 0.01f);
  TensorMap grads;
  const std::int64_t growth = peak_growth_kb([&] { grads = m.backward_distance_table(j, grad); });
  if (growth < 0) GTEST_SKIP() << "no VmHWM reset, or AddressSanitizer";
  ASSERT_EQ(grads.size(), 6u);
  // Per thread: its partial, the padded accumulator and packed weights
  // (about 1 MB here); plus the double sum, inputs and results.
  EXPECT_LE(growth, 4 * 1024 + omp_get_max_threads() * 1536) << "kB";
}

}  // namespace
}  // namespace posbias
