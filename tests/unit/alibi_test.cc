// ALiBi matrices against a naive reference, over many shapes, head counts,
// dtypes, every compiled instruction set, and both store paths.
#include "posbias/alibi.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/alibi_fill.h"
#include "posbias/slopes.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;
using test::golden_dir;
using test::round_to;

// The naive reference, straight from docs/spec.md: q_r = j - i + r,
// bias = -m * |c - q_r| (+0.0 at distance 0), zero heads after `slopes`.
std::vector<float> naive_alibi(const std::vector<float>& slopes, std::int64_t total, std::int64_t i,
                               std::int64_t j) {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(total * i * j));
  for (std::int64_t h = 0; h < total; ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        if (h >= static_cast<std::int64_t>(slopes.size())) {
          out.push_back(0.0f);
          continue;
        }
        const std::int64_t q = j - i + r;
        const float dist = static_cast<float>(std::llabs(c - q));
        const float v = slopes[static_cast<std::size_t>(h)] * dist;
        out.push_back(v == 0.0f ? 0.0f : -v);
      }
    }
  }
  return out;
}

struct Shape {
  std::int64_t heads, total, i, j;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (std::int64_t heads : {1, 3, 8, 12}) {
    for (std::int64_t extra : {0, 2}) {
      for (std::int64_t i : {0, 1, 2, 7, 16, 33}) {
        for (std::int64_t j : {0, 1, 5, 16, 17, 64, 100, 257}) {
          s.push_back({heads, heads + extra, i, j});
        }
      }
    }
  }
  s.push_back({2, 2, 50, 10});     // i > j: query positions below zero
  s.push_back({16, 16, 1, 4099});  // decode row
  return s;
}

TEST(AlibiBias, MatchesNaiveReferenceForAllShapesAndDtypes) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const Shape& s : shapes()) {
      const std::vector<float> slopes = alibi_slopes(s.heads);
      const Tensor t = alibi_bias(slopes, s.total, s.i, s.j, dtype);
      ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{s.total, s.i, s.j}));
      ASSERT_EQ(t.dtype(), dtype);
      std::vector<float> want = naive_alibi(slopes, s.total, s.i, s.j);
      for (float& v : want) v = round_to(dtype, v);
      expect_bits_equal(t.to_float_vector(), want,
                        dtype_name(dtype) + " h" + std::to_string(s.heads) + "/" +
                            std::to_string(s.total) + " i" + std::to_string(s.i) + " j" +
                            std::to_string(s.j));
    }
  }
}

// Every instruction set Highway compiled the kernel for, streaming and not,
// on unaligned destinations and partial row ranges.
TEST(AlibiKernel, EveryTargetAndStorePathMatchesReference) {
  const std::vector<float> slopes = alibi_slopes(5);
  std::vector<float> scale;
  for (float m : slopes) scale.push_back(-m);
  int targets_tested = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    ++targets_tested;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (bool stream : {false, true}) {
        for (std::int64_t j : {1, 3, 31, 32, 33, 129}) {
          for (std::int64_t misalign : {0, 1, 3}) {
            const std::int64_t i = 9;
            const std::size_t es = dtype_size(dtype);
            std::vector<unsigned char> buf((5 * i * j + 64) * es + 64, 0xAB);
            // Start `misalign` elements past a 64-byte boundary.
            auto base = reinterpret_cast<std::uintptr_t>(buf.data());
            base = (base + 63) / 64 * 64 + static_cast<std::uintptr_t>(misalign) * es;
            void* out = reinterpret_cast<void*>(base);
            detail::AlibiFillParams p;
            p.scale = scale.data();
            p.heads = 5;
            p.rows = i;
            p.cols = j;
            p.q0 = j - i;
            p.dtype = dtype;
            p.out = out;
            // Two partial ranges, as two threads would write them.
            detail::alibi_fill_rows(p, 0, 17, stream);
            detail::alibi_fill_rows(p, 17, 5 * i, stream);
            Tensor view = Tensor::empty({5, i, j}, dtype);
            std::memcpy(view.raw_mutable_data(), out, static_cast<std::size_t>(5 * i * j) * es);
            std::vector<float> want = naive_alibi(slopes, 5, i, j);
            for (float& v : want) v = round_to(dtype, v);
            expect_bits_equal(view.to_float_vector(), want,
                              std::string(hwy::TargetName(target)) + " " + dtype_name(dtype) +
                                  (stream ? " stream" : " store") + " j" + std::to_string(j) +
                                  " misalign" + std::to_string(misalign));
            // Nothing written past the end.
            const auto* after =
                static_cast<const unsigned char*>(out) + static_cast<std::size_t>(5 * i * j) * es;
            for (std::size_t k = 0; k < 16; ++k) ASSERT_EQ(after[k], 0xAB);
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(targets_tested, 2) << "expected several instruction sets on x86-64";
}

// The table + Toeplitz expansion path (alibi_fill_uses_table), on
// every instruction set, both store kinds, odd row lengths (so most rows start
// unaligned), i > j, and top-left causal clamping.
TEST(AlibiKernel, TablePathOnEveryTargetMatchesReference) {
  const std::vector<float> slopes = alibi_slopes(3);
  std::vector<float> scale;
  for (float m : slopes) scale.push_back(-m);
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (bool stream : {false, true}) {
        for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{16, 1},
                            {16, 16},
                            {17, 3},
                            {20, 129},
                            {33, 517},
                            {64, 40}}) {
          Tensor t = Tensor::empty({3, i, j}, dtype);
          detail::AlibiFillParams p;
          p.scale = scale.data();
          p.heads = 3;
          p.rows = i;
          p.cols = j;
          p.q0 = j - i;
          p.dtype = dtype;
          p.out = t.raw_mutable_data();
          detail::alibi_fill_by_table(p, stream);
          std::vector<float> want = naive_alibi(slopes, 3, i, j);
          for (float& v : want) v = round_to(dtype, v);
          expect_bits_equal(t.to_float_vector(), want,
                            std::string(hwy::TargetName(target)) + " table " + dtype_name(dtype) +
                                " i" + std::to_string(i) + " j" + std::to_string(j) +
                                (stream ? " stream" : ""));
          // Causal clamp, top-left, raw slopes (the AlibiBias form).
          p.q0 = 0;
          p.kind = detail::DistanceKind::kCausalClamp;
          p.canonical_zero = false;
          detail::alibi_fill_by_table(p, stream);
          const std::vector<float> got = t.to_float_vector();
          for (std::int64_t h = 0; h < 3; ++h) {
            for (std::int64_t r = 0; r < i; ++r) {
              for (std::int64_t c = 0; c < j; ++c) {
                const float v = scale[h] * static_cast<float>(std::max<std::int64_t>(r - c, 0));
                ASSERT_EQ(float_bits(got[(h * i + r) * j + c]), float_bits(round_to(dtype, v)))
                    << hwy::TargetName(target) << " causal " << h << " " << r << " " << c;
              }
            }
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The direct path through alibi_fill, in its parallel region (several
// threads, output >= 256 KiB) with and without streaming stores: a decode
// step (one row), few rows, and a tall, narrow output, which take the direct
// path since their table would be as large as a good part of the output.
// (This test used i = 100, j = 333, which takes the table path.)
TEST(AlibiKernel, ThreadedStreamingDirectPathMatchesReference) {
  const std::vector<float> slopes = alibi_slopes(12);
  std::vector<float> scale;
  for (float m : slopes) scale.push_back(-m);
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(3);
  for (auto [i, j] :
       {std::pair<std::int64_t, std::int64_t>{1, 40009}, {9, 4099}, {20000, 3}, {6000, 7}}) {
    ASSERT_FALSE(detail::alibi_fill_uses_table(i, j)) << i << " x " << j;
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      ASSERT_GE(12 * i * j * static_cast<std::int64_t>(dtype_size(dtype)), 256 << 10);
      for (bool stream : {false, true}) {
        Tensor t = Tensor::empty({12, i, j}, dtype);
        detail::AlibiFillParams p;
        p.scale = scale.data();
        p.heads = 12;
        p.rows = i;
        p.cols = j;
        p.q0 = j - i;
        p.dtype = dtype;
        p.out = t.raw_mutable_data();
        detail::alibi_fill(p, stream);
        std::vector<float> want = naive_alibi(slopes, 12, i, j);
        for (float& v : want) v = round_to(dtype, v);
        expect_bits_equal(t.to_float_vector(), want,
                          dtype_name(dtype) + (stream ? " stream " : " store ") +
                              std::to_string(i) + "x" + std::to_string(j));
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// The table is used only when its scratch (rows + cols - 1 values per head,
// in the output dtype) is at most 1/8 of the output, and from kTableMinRows
// rows on: never for decode steps or tall, narrow outputs (heads 1,
// i = 2e7, j = 1 allocated an 80 MB table beside the 80 MB result).
TEST(AlibiKernel, TablePathOnlyWhenItsScratchIsSmall) {
  EXPECT_TRUE(detail::alibi_fill_uses_table(16, 16));
  EXPECT_TRUE(detail::alibi_fill_uses_table(4096, 4096));
  EXPECT_TRUE(detail::alibi_fill_uses_table(4096, 9));
  EXPECT_TRUE(detail::alibi_fill_uses_table(512, 100000));
  EXPECT_FALSE(detail::alibi_fill_uses_table(15, 100000));  // decode-like
  EXPECT_FALSE(detail::alibi_fill_uses_table(1, 4096));
  EXPECT_FALSE(detail::alibi_fill_uses_table(20000000, 1));
  EXPECT_FALSE(detail::alibi_fill_uses_table(20000000, 8));
  EXPECT_FALSE(detail::alibi_fill_uses_table(16, 14));
  for (std::int64_t rows : {16, 17, 100, 5000, 20000000}) {
    for (std::int64_t cols : {1, 2, 8, 9, 15, 16, 64, 4099}) {
      if (detail::alibi_fill_uses_table(rows, cols)) {
        EXPECT_LE(8 * (rows + cols - 1), rows * cols) << rows << " x " << cols;
      }
    }
  }
}

TEST(AlibiBias, LongDistancesStayExactInFloat32) {
  // Distances past 2^24 are no longer exact integers in float32; the kernel
  // converts the int distance once, like the PyTorch reference.
  const std::vector<float> slopes = {0.5f};
  const std::int64_t j = (std::int64_t{1} << 24) + 7;
  const Tensor t = alibi_bias(slopes, 1, 1, j);
  const float* d = t.data<float>();
  for (std::int64_t c : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, j - 1}) {
    const std::int64_t dist = (j - 1) - c;
    const float v = 0.5f * static_cast<float>(dist);
    EXPECT_EQ(d[c], v == 0.0f ? 0.0f : -v) << c;
  }
}

TEST(AlibiBias, Float16SaturatesToInfinityPastItsRange) {
  // slope 1, distance 70000 > 65504: -inf, as torch's .half() gives.
  const Tensor t = alibi_bias({1.0f}, 1, 1, 70001, DType::kFloat16);
  EXPECT_TRUE(std::isinf(t.at({0, 0, 0})));
  EXPECT_LT(t.at({0, 0, 0}), 0.0f);
  EXPECT_EQ(t.at({0, 0, 70000}), 0.0f);
  EXPECT_EQ(t.at({0, 0, 70000 - 2049}), -2048.0f);  // 2049 ties to even 2048
}

TEST(AlibiBias, IntoCallerMemoryEqualsTensorResult) {
  const std::vector<float> slopes = alibi_slopes(6);
  std::vector<float> buf(8 * 5 * 9);
  alibi_bias_into(slopes, 8, 5, 9, DType::kFloat32, buf.data());
  expect_bits_equal(buf, alibi_bias(slopes, 8, 5, 9).to_float_vector(), "into");
  EXPECT_THROW(alibi_bias_into(slopes, 8, 5, 9, DType::kFloat32, nullptr), std::invalid_argument);
  alibi_bias_into(slopes, 8, 0, 9, DType::kFloat32, nullptr);  // empty: fine
  // Element-aligned but not vector-aligned destinations are fine (one row,
  // the direct path; 20 rows, the table path); a misaligned one is refused.
  for (std::int64_t rows : {1, 20}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      const Tensor want = alibi_bias(slopes, 8, rows, 9, dtype);
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(want.numel()) * 4 + 64);
      std::uint8_t* at = bytes.data() + dtype_size(dtype);  // vector() is 16-byte aligned
      alibi_bias_into(slopes, 8, rows, 9, dtype, at);
      EXPECT_EQ(std::memcmp(at, want.raw_data(),
                            static_cast<std::size_t>(want.numel()) * dtype_size(dtype)),
                0);
      expect_throw_with<std::invalid_argument>(
          [&] { alibi_bias_into(slopes, 8, rows, 9, dtype, bytes.data() + 1); },
          "not aligned to the " + std::to_string(dtype_size(dtype)) + "-byte elements");
    }
  }
}

TEST(AlibiBias, CustomPositionsMatchReference) {
  const std::vector<float> slopes = alibi_slopes(3);
  // Packed sequences / chunked prefill: arbitrary, unsorted, negative.
  const std::vector<std::int64_t> q = {5, 6, 7, -2, 100};
  const std::vector<std::int64_t> k = {0, 1, 2, 3, 4, 5, 6, 7, -10, 1000};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Tensor t = alibi_bias_custom_pos(slopes, 4, q, k, dtype);
    ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{4, 5, 10}));
    for (std::int64_t h = 0; h < 4; ++h) {
      for (std::int64_t r = 0; r < 5; ++r) {
        for (std::int64_t c = 0; c < 10; ++c) {
          float want = 0.0f;
          if (h < 3) {
            const float v = slopes[h] * static_cast<float>(std::llabs(k[c] - q[r]));
            want = v == 0.0f ? 0.0f : -v;
          }
          EXPECT_EQ(float_bits(t.at({h, r, c})), float_bits(round_to(dtype, want)))
              << h << " " << r << " " << c;
        }
      }
    }
  }
  // Positions equal to the default layout give the default bias.
  std::vector<std::int64_t> qd, kd;
  for (std::int64_t r = 0; r < 4; ++r) qd.push_back(9 - 4 + r);
  for (std::int64_t c = 0; c < 9; ++c) kd.push_back(c);
  expect_bits_equal(alibi_bias_custom_pos(slopes, 3, qd, kd).to_float_vector(),
                    alibi_bias(slopes, 3, 4, 9).to_float_vector(), "default positions");
}

TEST(AlibiBias, BadInputsThrowBeforeAllocating) {
  const std::vector<float> s = alibi_slopes(4);
  expect_throw_with<std::invalid_argument>([&] { alibi_bias(s, 3, 2, 2); },
                                           "total_heads = 3, heads = 4");
  expect_throw_with<std::invalid_argument>([&] { alibi_bias(s, 4, -1, 2); }, "i = -1");
  expect_throw_with<std::invalid_argument>([&] { alibi_bias(s, 4, 1, -5); }, "j = -5");
  expect_throw_with<std::invalid_argument>([&] { alibi_bias({}, 4, 1, 1); }, "got 0");
  expect_throw_with<std::invalid_argument>(
      [&] {
        alibi_bias({0.5f, NAN}, 2, 1, 1);
      },
      "slope 1 is not finite");
  expect_throw_with<std::invalid_argument>([&] { alibi_bias({INFINITY}, 2, 1, 1); },
                                           "slope 0 is not finite (inf)");
  // Sizes: element count overflowing int64, and more bytes than the machine.
  expect_throw_with<std::length_error>(
      [&] { alibi_bias(s, 4, std::int64_t{1} << 40, std::int64_t{1} << 40); },
      "too large: its size in bytes overflows");
  expect_throw_with<std::length_error>([&] { alibi_bias(s, 16, 1 << 20, 1 << 20); },
                                       "[16, 1048576, 1048576]");
  expect_throw_with<std::length_error>(
      [&] { alibi_bias(s, 16, 1 << 20, 1 << 20, DType::kFloat16); }, "bytes");
  expect_throw_with<std::invalid_argument>(
      [&] { alibi_bias_custom_pos(s, 4, {INT64_MIN}, {INT64_MAX}); }, "overflow");
}

TEST(AlibiBias, EmptyOutputsNeedNoPerHeadMemory) {
  // total_heads = 2^40 with no elements: the result is empty at once (a
  // per-head multiplier list of 2^40 floats threw std::bad_alloc before).
  const std::int64_t total = std::int64_t{1} << 40;
  EXPECT_EQ(alibi_bias({0.5f}, total, 0, 0).shape(), (std::vector<std::int64_t>{total, 0, 0}));
  EXPECT_EQ(alibi_bias({0.5f}, total, 7, 0, DType::kFloat16).numel(), 0);
  EXPECT_EQ(alibi_bias_custom_pos({0.5f}, total, {1, 2}, {}).shape(),
            (std::vector<std::int64_t>{total, 2, 0}));
  alibi_bias_into({0.5f}, total, 0, 3, DType::kFloat32, nullptr);  // nothing written
  // total_heads * i overflows int64 while the element count is 0.
  EXPECT_EQ(alibi_bias({0.5f}, total, std::int64_t{1} << 40, 0).numel(), 0);
}

// AlibiBias's default slopes are PyTorch's serial linspace formula
// (start + step * k, then end - step * (n - 1 - k), float32, two roundings).
// torch.linspace's own bits depend on the CPU kernel it runs: vectorised
// chunks (Vectorized::arange, base and offset rounded separately) and FMA
// contraction in the AVX2 build. Checked with torch 1.13 (/usr/bin/python3,
// ATEN_CPU_CAPABILITY avx2 and default) for n = 1..200: the library's lists
// equal torch's only for n <= 8 and n = 10, 12, 14 (AVX2) or n <= 15
// (default), and are never more than 2 ulp away (35 of the 200 lists have an
// entry 2 ulp away under AVX2, e.g. n = 19). The values below were printed by
// torch 1.13, AVX2:
//   print(', '.join(repr(v) for v in torch.linspace(-0.05, -0.5, n).numpy()))
TEST(AlibiBias, DefaultSlopesAreWithinTwoUlpOfTorchLinspace) {
  const auto ulp_distance = [](float a, float b) {
    std::int32_t ia = 0, ib = 0;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    return std::abs(static_cast<std::int64_t>(ia) - static_cast<std::int64_t>(ib));
  };
  const std::vector<std::vector<float>> torch_lists = {
      // n = 19: entries 8 and 14 are 2 ulp away from the serial formula.
      {-0.05f, -0.075f, -0.099999994f, -0.125f, -0.14999999f, -0.175f, -0.19999999f, -0.22499998f,
       -0.24999999f, -0.27499998f, -0.29999998f, -0.325f, -0.34999996f, -0.37499997f, -0.39999998f,
       -0.42499995f, -0.45f, -0.475f, -0.5f},
      // n = 20
      {-0.05f,       -0.07368421f, -0.09736842f, -0.12105262f, -0.14473684f,
       -0.16842104f, -0.19210525f, -0.21578947f, -0.23947367f, -0.26315787f,
       -0.28684208f, -0.3105263f,  -0.33421052f, -0.35789472f, -0.38157892f,
       -0.40526313f, -0.42894736f, -0.4526316f,  -0.4763158f,  -0.5f}};
  for (const std::vector<float>& want : torch_lists) {
    const auto n = static_cast<std::int64_t>(want.size());
    const std::vector<float> got = AlibiBias::default_slopes(n);
    ASSERT_EQ(got.size(), want.size());
    std::int64_t worst = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_LE(ulp_distance(got[k], want[k]), 2)
          << "n = " << n << " entry " << k << ": " << got[k] << " vs torch " << want[k];
      worst = std::max(worst, ulp_distance(got[k], want[k]));
    }
    EXPECT_GT(worst, 0) << "n = " << n << ": now bit-identical to torch; say so in alibi.h";
  }
}

}  // namespace
}  // namespace posbias
