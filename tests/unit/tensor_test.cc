#include "posbias/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/alibi.h"

namespace posbias {
namespace {

TEST(Tensor, EmptyIsAlignedAndContiguous) {
  const Tensor t = Tensor::empty({3, 4, 5}, DType::kFloat32);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{20, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_EQ(Tensor().numel(), 0);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::kFloat32), std::invalid_argument);
}

// Freed storage of 4 MiB and up is kept for the next tensor of the same
// rounded size (blocks up to 64 MiB, 128 MiB in all), until
// release_cached_storage gives it back.
TEST(Tensor, LargeStorageIsKeptForReuseWithinItsBounds) {
  release_cached_storage();
  constexpr std::int64_t kMiB = 1 << 20;
  const void* first = nullptr;
  {
    Tensor a = Tensor::empty({2 * kMiB}, DType::kFloat32);  // 8 MiB
    first = a.raw_data();
    a.mutable_data<float>()[5] = 3.0f;
  }
  {
    // 7.5 MiB rounds to the same 4 huge pages: the kept block, 2 MiB aligned.
    const Tensor b = Tensor::empty({15 * kMiB / 8}, DType::kFloat32);
    EXPECT_EQ(b.raw_data(), first);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.raw_data()) % (2 * kMiB), 0U);
    const Tensor c = Tensor::empty({2 * kMiB}, DType::kFloat32);  // b holds it: a new block
    EXPECT_NE(c.raw_data(), first);
  }
  EXPECT_EQ(release_cached_storage(), static_cast<std::size_t>(16 * kMiB));
  EXPECT_EQ(release_cached_storage(), 0U);
  {  // three 64 MiB blocks: two are kept, the oldest goes back first
    std::vector<Tensor> held;
    for (int x = 0; x < 3; ++x) held.push_back(Tensor::empty({16 * kMiB}, DType::kFloat32));
    const void* last = held[2].raw_data();
    held.clear();
    const Tensor again = Tensor::empty({16 * kMiB}, DType::kFloat32);
    EXPECT_EQ(again.raw_data(), last);  // the newest of the same size
  }
  EXPECT_EQ(release_cached_storage(), static_cast<std::size_t>(128 * kMiB));
  {  // above 64 MiB: unmapped at once
    const Tensor big = Tensor::empty({17 * kMiB}, DType::kFloat32);
    EXPECT_NE(big.raw_data(), nullptr);
  }
  EXPECT_EQ(release_cached_storage(), 0U);
  {  // below 4 MiB: malloc's, not kept here
    const Tensor small = Tensor::empty({kMiB - 1}, DType::kFloat32);
    EXPECT_NE(small.raw_data(), nullptr);
  }
  EXPECT_EQ(release_cached_storage(), 0U);
}

TEST(Tensor, TransposeIsAView) {
  std::vector<float> v(24);
  for (int k = 0; k < 24; ++k) v[k] = static_cast<float>(k);
  const Tensor t = Tensor::from_vector({2, 3, 4}, v);
  const Tensor s = t.transpose(0, -1);
  EXPECT_TRUE(s.shares_storage_with(t));
  EXPECT_EQ(s.shape(), (std::vector<std::int64_t>{4, 3, 2}));
  EXPECT_EQ(s.strides(), (std::vector<std::int64_t>{1, 4, 12}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.at({3, 1, 1}), t.at({1, 1, 3}));
  EXPECT_EQ(s.transpose(2, 0).to_float_vector(), v);
  EXPECT_EQ(t.transpose(1, 1).strides(), t.strides());
  EXPECT_THROW(t.transpose(0, 3), std::invalid_argument);
  EXPECT_THROW(t.transpose(-4, 0), std::invalid_argument);
}

TEST(Tensor, SliceIsAViewAndCopiesAreContiguous) {
  std::vector<float> v(24);
  for (int k = 0; k < 24; ++k) v[k] = static_cast<float>(k);
  const Tensor t = Tensor::from_vector({2, 3, 4}, v);
  const Tensor s = t.slice(1, 1, 3).slice(2, 2, 4);
  EXPECT_TRUE(s.shares_storage_with(t));
  EXPECT_EQ(s.shape(), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.to_float_vector(), (std::vector<float>{6, 7, 10, 11, 18, 19, 22, 23}));
  const Tensor c = s.contiguous_copy();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.to_float_vector(), s.to_float_vector());
  EXPECT_EQ(s.at({1, 1, 0}), 22.0f);
  EXPECT_THROW(s.at({2, 0, 0}), std::invalid_argument);
  EXPECT_THROW(t.slice(0, 1, 3), std::invalid_argument);
  EXPECT_THROW(t.data<bfloat16>(), std::invalid_argument);
}

TEST(Tensor, ConversionRoundsOnce) {
  const Tensor t = Tensor::from_vector({3}, {1.0f + 0x1p-8f, 65520.0f, -0.1f});
  const Tensor b = t.to(DType::kBFloat16);
  EXPECT_EQ(b.at({0}), 1.0f);
  const Tensor h = t.to(DType::kFloat16);
  EXPECT_TRUE(std::isinf(h.at({1})));
  EXPECT_EQ(h.at({2}), to_float(to_float16(-0.1f)));
}

TEST(Tensor, FloatRoundTripText) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int k = 0; k < 100000; ++k) {
    const float f = bits_float(bits(rng));
    if (!std::isfinite(f)) continue;
    const std::string s = format_float_roundtrip(f);
    ASSERT_EQ(float_bits(std::strtof(s.c_str(), nullptr)), float_bits(f)) << s;
  }
  EXPECT_EQ(format_float_roundtrip(0.1f), "0.1");
  EXPECT_EQ(format_float_roundtrip(-0.25f), "-0.25");
  EXPECT_EQ(format_float_roundtrip(std::numeric_limits<float>::infinity()), "inf");
}

TEST(Tensor, Json) {
  const Tensor t = Tensor::from_vector({1, 2, 3}, {-0.5f, 0, -0.5f, -1, -0.5f, 0});
  EXPECT_EQ(to_json(t), "{\"shape\": [1, 2, 3], \"data\": [-0.5, 0, -0.5, -1, -0.5, 0]}");
}

// Expected strings are what PyTorch 1.13 prints for the same tensors.
TEST(Tensor, FormatsLikeTorchPrint) {
  EXPECT_EQ(format_tensor(Tensor::from_vector({3}, {0.5f, 0.25f, 0.125f})),
            "tensor([0.5000, 0.2500, 0.1250])");
  EXPECT_EQ(format_tensor(Tensor::from_vector({2, 2}, {0, -1, -2, 3})),
            "tensor([[ 0., -1.],\n        [-2.,  3.]])");
  EXPECT_EQ(format_tensor(AlibiPositionalBias(1, 2, {0.5f}).forward(2, 3)),
            "tensor([[[-0.5000,  0.0000, -0.5000],\n"
            "         [-1.0000, -0.5000,  0.0000]],\n"
            "\n"
            "        [[ 0.0000,  0.0000,  0.0000],\n"
            "         [ 0.0000,  0.0000,  0.0000]]])");
  EXPECT_EQ(format_tensor(Tensor::from_vector({2}, {1e-5f, 1.0f})),
            "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(format_tensor(Tensor::empty({8, 0, 5}, DType::kFloat32)), "tensor([], size=(8, 0, 5))");
  // Exactly what torch 1.13's print() gives.
  EXPECT_EQ(format_tensor(Tensor::from_vector({2}, {1, 2}).to(DType::kBFloat16)),
            "tensor([1., 2.], dtype=torch.bfloat16)");
  EXPECT_EQ(format_tensor(Tensor::from_vector({2}, {1.5f, 2}).to(DType::kFloat16)),
            "tensor([1.5000, 2.0000], dtype=torch.float16)");
  EXPECT_EQ(format_tensor(Tensor::empty({0}, DType::kFloat32)), "tensor([])");
  EXPECT_EQ(format_tensor(Tensor::empty({0}, DType::kBFloat16)),
            "tensor([], dtype=torch.bfloat16)");
  EXPECT_EQ(format_tensor(Tensor::empty({0, 5}, DType::kFloat32)), "tensor([], size=(0, 5))");
  EXPECT_EQ(format_tensor(Tensor::empty({2, 0, 3}, DType::kFloat16)),
            "tensor([], size=(2, 0, 3), dtype=torch.float16)");
}

TEST(Tensor, FormatSummarizesLargeTensors) {
  std::vector<float> v(2000);
  for (int k = 0; k < 2000; ++k) v[k] = static_cast<float>(k);
  // torch.arange(2000.): max/min > 1000 switches to scientific notation,
  // and " ..." counts as an element when lines are wrapped.
  EXPECT_EQ(format_tensor(Tensor::from_vector({2000}, v)),
            "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
            "        1.9990e+03])");
  for (int k = 0; k < 2000; ++k) v[k] = static_cast<float>(k % 100);
  EXPECT_EQ(format_tensor(Tensor::from_vector({2, 1000}, v)),
            "tensor([[ 0.,  1.,  2.,  ..., 97., 98., 99.],\n"
            "        [ 0.,  1.,  2.,  ..., 97., 98., 99.]])");
  // Long rows wrap at 80 columns like torch.
  std::vector<float> w(20, -0.25f);
  EXPECT_EQ(format_tensor(Tensor::from_vector({20}, w)),
            "tensor([-0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500,\n"
            "        -0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500, -0.2500,\n"
            "        -0.2500, -0.2500, -0.2500, -0.2500])");
}

}  // namespace
}  // namespace posbias
