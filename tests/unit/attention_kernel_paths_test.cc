// Kernel paths of the fused attention that the shape tests may not reach,
// each against the naive double formula (attention_naive.h).
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_naive.h"
#include "attention_test_util.h"
#include "posbias/attention.h"

namespace posbias {
namespace {

// The naive formula's description of one dense sequence (b = 1, queries
// the last i positions, the default scale) over q, k, v as given.
test::NaiveSeq DenseNaive(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t h,
                          std::int64_t hk, std::int64_t i, std::int64_t j, std::int64_t d,
                          bool causal) {
  test::NaiveSeq a;
  a.h = h, a.hk = hk, a.i = i, a.j = j, a.d = d;
  a.q = q.to_float_vector(), a.k = k.to_float_vector(), a.v = v.to_float_vector();
  a.q_offset = j - i;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.causal = causal;
  return a;
}

enum class PathBias : std::uint8_t { kNone, kAlibi, kTable, kDense };

// One dense call (b 1) of h query heads on hk kv heads against the naive
// formula, float32.
void ExpectForwardMatchesNaive(std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                               std::int64_t d, bool causal, float softcap, PathBias kind,
                               std::uint32_t seed, AttentionWindow window = {}) {
  SCOPED_TRACE("h " + std::to_string(h) + " hk " + std::to_string(hk) + " i " + std::to_string(i) +
               " j " + std::to_string(j) + " d " + std::to_string(d) + " causal " +
               std::to_string(causal) + " softcap " + std::to_string(softcap) + " bias " +
               std::to_string(static_cast<int>(kind)) + " window " + std::to_string(window.left) +
               " " + std::to_string(window.right));
  const Tensor q = test::random_tensor({1, h, i, d}, seed, -2.0f, 2.0f);
  const Tensor k = test::random_tensor({1, hk, j, d}, seed + 1, -2.0f, 2.0f);
  const Tensor v = test::random_tensor({1, hk, j, d}, seed + 2);
  test::NaiveSeq a = DenseNaive(q, k, v, h, hk, i, j, d, causal);
  a.softcap = softcap;
  a.left = window.left;
  a.right = window.right;
  AttentionOptions opt;
  opt.causal = causal;
  opt.softcap = softcap;
  opt.window = window;
  std::mt19937 gen(seed + 3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  AttentionBias bias;
  switch (kind) {
    case PathBias::kNone:
      break;
    case PathBias::kAlibi:
      for (std::int64_t x = 0; x < h; ++x) a.slopes.push_back(0.02f + 0.2f * (u(gen) + 1.0f));
      bias = AttentionBias::alibi(a.slopes);
      break;
    case PathBias::kTable:
      a.table_n = 2 * (i + j) + 1;
      for (std::int64_t x = 0; x < h * a.table_n; ++x) a.table.push_back(u(gen));
      bias = AttentionBias::distance_table(Tensor::from_vector({h, a.table_n}, a.table));
      break;
    case PathBias::kDense:
      for (std::int64_t x = 0; x < h * i * j; ++x) a.dense.push_back(u(gen));
      bias = AttentionBias::dense_bias(Tensor::from_vector({1, h, i, j}, a.dense));
      break;
  }
  const test::NaiveOut want = test::naive_attention(a);
  const std::vector<float> wantf(want.out.begin(), want.out.end());
  test::expect_close(attention_forward(q, k, v, bias, opt).to_float_vector(), wantf,
                     "attention_forward", test::naive_atol(DType::kFloat32),
                     test::naive_rtol(DType::kFloat32));
}

// The decode path's score pass over d: one query row per head
// (multi-head, and a group of 3 that takes no 4-row tile) holds q in
// registers 8 vectors at a time (4 on AVX2), then single vectors, then the
// last d % lanes elements one by one; grouped-query tiles of 4 rows. The
// value pass: groups of keys in chunks of 16, 8, ..., 1 vectors for one
// row (and for tiles of several rows where d takes more than one chunk),
// the keys past the last whole group one by one. d below one vector,
// whole chunks, chunks and a remainder, two chunks; one and three query
// rows; two key blocks of 256; on every instruction set.
TEST(AttentionKernelPaths, DecodeScoresOverEveryChunkOfD) {
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::uint32_t seed = 1100;
    for (const std::int64_t d : {7, 16, 100, 128, 144, 200, 256, 272}) {
      for (const std::int64_t i : {1, 3}) {
        ExpectForwardMatchesNaive(2, 2, i, 300, d, true, 0.0f, PathBias::kAlibi, seed++);
        ExpectForwardMatchesNaive(3, 1, i, 300, d, true, 0.0f, PathBias::kNone, seed++);
        ExpectForwardMatchesNaive(8, 2, i, 300, d, true, 0.0f, PathBias::kAlibi, seed++);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Query blocks of 5 to 17 rows (the blocked path starts at 5): every
// remainder of the 6-row score and P V tiles, with and without a full tile
// before it, on and off the causal diagonal; two key blocks and d not a
// multiple of the vector length.
TEST(AttentionKernelPaths, ForwardRowTileRemainders) {
  std::uint32_t seed = 100;
  for (std::int64_t i = 5; i <= 17; ++i) {
    for (const bool causal : {true, false}) {
      ExpectForwardMatchesNaive(2, 2, i, i + 70, 24, causal, 0.0f, PathBias::kAlibi, seed++);
      ExpectForwardMatchesNaive(1, 1, i, i + 3, 8, causal, 0.0f, PathBias::kNone, seed++);
    }
  }
}

// Row tiles that see part of a 64-key block (the causal diagonal, a
// window's edges, rows before the first key) take the general row pass,
// next to tiles over whole blocks on the registers; with and without ALiBi
// and a soft-cap, in blocks of 64 keys (i, j >= 128).
TEST(AttentionKernelPaths, ForwardPartialTilesNextToWholeOnes) {
  std::uint32_t seed = 900;
  for (const PathBias kind : {PathBias::kNone, PathBias::kAlibi}) {
    for (const float cap : {0.0f, 20.0f}) {
      ExpectForwardMatchesNaive(2, 1, 200, 200, 16, true, cap, kind, seed++);
      ExpectForwardMatchesNaive(2, 2, 130, 260, 24, true, cap, kind, seed++);
      ExpectForwardMatchesNaive(1, 1, 300, 150, 16, true, cap, kind, seed++);  // rows before key 0
      ExpectForwardMatchesNaive(2, 2, 256, 256, 16, false, cap, kind, seed++,
                                AttentionWindow{40, 7});
      ExpectForwardMatchesNaive(1, 1, 200, 200, 16, true, cap, kind, seed++,
                                AttentionWindow{100, 0});
    }
  }
}

// The causal diagonal on the main register tile: rows that see a block
// from its first key up to their own last (the keys past it masked on the
// registers), next to rows that see none of it, over 1 to all vectors of
// the block; square calls, fewer queries than keys (q_offset > 0), more
// queries than keys (rows before the first key see nothing), d not a
// multiple of the vector length; ALiBi, a distance table and no bias; every
// instruction set.
TEST(AttentionKernelPaths, ForwardCausalDiagonalOnTheRegisterTile) {
  struct Shape {
    std::int64_t i, j, d;
  };
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::uint32_t seed = 1300;
    for (const Shape sh : {Shape{64, 64, 16}, Shape{70, 70, 16}, Shape{130, 130, 9},
                           Shape{200, 200, 64}, Shape{37, 160, 16}, Shape{150, 90, 16}}) {
      for (const PathBias kind : {PathBias::kNone, PathBias::kAlibi, PathBias::kTable}) {
        ExpectForwardMatchesNaive(2, 1, sh.i, sh.j, sh.d, true, 0.0f, kind, seed++);
      }
    }
    // The distance table on the whole-block tile, with and without a
    // soft-cap; more queries than keys (rows before the first key).
    for (const float cap : {0.0f, 2.0f}) {
      ExpectForwardMatchesNaive(2, 1, 150, 90, 16, false, cap, PathBias::kTable, seed++);
      ExpectForwardMatchesNaive(2, 1, 64, 200, 16, false, cap, PathBias::kTable, seed++);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A row whose scores over a whole 64-key block are all -inf (a -inf in
// every key of the block where the query is positive) before it has seen a
// finite score: the block adds nothing to it, and the later block's keys
// set its output.
TEST(AttentionKernelPaths, ForwardBlockOfMinusInfScoresAddsNothing) {
  const std::int64_t i = 12, j = 128, d = 16;
  Tensor q = test::random_tensor({1, 1, i, d}, 950, -1.0f, 1.0f);
  Tensor k = test::random_tensor({1, 1, j, d}, 951, -1.0f, 1.0f);
  const Tensor v = test::random_tensor({1, 1, j, d}, 952);
  for (std::int64_t r = 0; r < i; ++r) q.mutable_data<float>()[r * d] = 1.5f;
  for (std::int64_t c = 0; c < 64; ++c) {
    k.mutable_data<float>()[c * d] = -std::numeric_limits<float>::infinity();
  }
  for (const PathBias kind : {PathBias::kNone, PathBias::kAlibi}) {
    test::NaiveSeq a = DenseNaive(q, k, v, 1, 1, i, j, d, false);
    AttentionBias bias;
    if (kind == PathBias::kAlibi) {
      a.slopes = {0.25f};
      bias = AttentionBias::alibi(a.slopes);
    }
    const test::NaiveOut want = test::naive_attention(a);
    const std::vector<float> wantf(want.out.begin(), want.out.end());
    test::expect_close(attention_forward(q, k, v, bias, AttentionOptions{}).to_float_vector(),
                       wantf, "attention_forward", test::naive_atol(DType::kFloat32),
                       test::naive_rtol(DType::kFloat32));
  }
}

// The register tile keeps a row's running maximum while a block's maximum
// exceeds it by at most ln 256 (exp terms up to 256, no rescale), and moves
// it past that. Scores rising along the keys by 64 x step per 64-key block:
// rows of one tile with steps below and above the threshold per block, a
// tile whose maxima then fall; larger scores (per block 5.8 to 27). Where
// the tile goes through a block in chunks (AVX2, SSE4: 16 and 8 keys), a
// chunk that moves the maximum rescales the P of the block's earlier chunks
// (the test fails without that rescale, and with alpha the last chunk's
// factor instead of their product).
TEST(AttentionKernelPaths, ForwardRunningMaximumKeptWithinTheThreshold) {
  // Four query heads on one kv head: enough tasks that no key split makes
  // each block the first of its task.
  const std::int64_t h = 4, i = 12, j = 256, d = 16;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const float big : {1.0f, 3.0f}) {
      Tensor q = test::random_tensor({1, h, i, d}, 960, -0.1f, 0.1f);
      Tensor k = test::random_tensor({1, 1, j, d}, 961, -0.1f, 0.1f);
      const Tensor v = test::random_tensor({1, 1, j, d}, 962);
      // Row r's score rises by about (0.03 + 0.01 r) * big per key: 64 of
      // them are 1.9 to 8.9 per block at big = 1 (the threshold is 5.5).
      for (std::int64_t x = 0; x < h * i; ++x) {
        q.mutable_data<float>()[x * d] = (0.03f + 0.01f * static_cast<float>(x % i)) * big;
      }
      for (std::int64_t c = 0; c < j; ++c) {
        // Up for three blocks, then down: the last block's maxima fall.
        const std::int64_t at = c < 192 ? c : 383 - c;
        k.mutable_data<float>()[c * d] = 4.0f * static_cast<float>(at);
      }
      for (const PathBias kind : {PathBias::kNone, PathBias::kAlibi}) {
        test::NaiveSeq a = DenseNaive(q, k, v, h, 1, i, j, d, false);
        AttentionBias bias;
        if (kind == PathBias::kAlibi) {
          a.slopes = {0.0625f, 0.03125f, 0.015625f, 0.0078125f};
          bias = AttentionBias::alibi(a.slopes);
        }
        const test::NaiveOut want = test::naive_attention(a);
        const std::vector<float> wantf(want.out.begin(), want.out.end());
        const std::vector<float> got =
            attention_forward(q, k, v, bias, AttentionOptions{}).to_float_vector();
        for (const float x : got) ASSERT_TRUE(std::isfinite(x));
        test::expect_close(got, wantf, "attention_forward", test::naive_atol(DType::kFloat32),
                           test::naive_rtol(DType::kFloat32));
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Soft-capping on the row pass without a window or key mask (each bias kind;
// the dense bias caps whole vectors before its element-wise add), where the
// cap changes the scores a lot (cap 1.5 against scores of a few units).
TEST(AttentionKernelPaths, ForwardSoftcapEveryBias) {
  std::uint32_t seed = 300;
  for (const PathBias kind : {PathBias::kNone, PathBias::kAlibi, PathBias::kTable, PathBias::kDense}) {
    for (const bool causal : {true, false}) {
      for (const float cap : {1.5f, 30.0f}) {
        ExpectForwardMatchesNaive(2, 1, 13, 77, 16, causal, cap, kind, seed++);
        ExpectForwardMatchesNaive(1, 1, 70, 70, 9, causal, cap, kind, seed++);
      }
    }
  }
}

// Grouped-query prefill with one query block per head: the group's query
// heads share one packing of their kv head's keys (consecutive tasks).
TEST(AttentionKernelPaths, ForwardGroupedQuerySharedPacking) {
  std::uint32_t seed = 500;
  for (const bool causal : {true, false}) {
    ExpectForwardMatchesNaive(8, 2, 40, 200, 32, causal, 0.0f, PathBias::kAlibi, seed++);
    ExpectForwardMatchesNaive(6, 3, 33, 129, 20, causal, 0.0f, PathBias::kTable, seed++);
  }
}

// Dense prefill with several threads: each takes the tasks of whole kv
// heads (its own first, then what is left of the others'), for kv head
// counts that do and do not divide among 2 and 3 threads, grouped-query
// too; every task runs once (the naive formula), and who ran which does
// not change a bit (two calls agree).
TEST(AttentionKernelPaths, ForwardThreadsTakeWholeKvHeads) {
  const int saved = omp_get_max_threads();
  std::uint32_t seed = 700;
  struct Heads {
    std::int64_t h, hk;
  };
  for (const int threads : {2, 3}) {
    omp_set_num_threads(threads);
    for (const Heads hh : {Heads{3, 3}, Heads{4, 4}, Heads{5, 5}, Heads{8, 2}, Heads{12, 3}}) {
      for (const bool causal : {true, false}) {
        SCOPED_TRACE(std::to_string(threads) + " threads");
        ExpectForwardMatchesNaive(hh.h, hh.hk, 300, 310, 16, causal, 0.0f, PathBias::kAlibi, seed);
        const Tensor q = test::random_tensor({1, hh.h, 300, 16}, seed, -2.0f, 2.0f);
        const Tensor k = test::random_tensor({1, hh.hk, 310, 16}, seed + 1, -2.0f, 2.0f);
        const Tensor v = test::random_tensor({1, hh.hk, 310, 16}, seed + 2);
        AttentionOptions opt;
        opt.causal = causal;
        const AttentionBias none = AttentionBias::none();
        EXPECT_EQ(attention_forward(q, k, v, none, opt).to_float_vector(),
                  attention_forward(q, k, v, none, opt).to_float_vector());
        ++seed;
      }
    }
  }
  omp_set_num_threads(saved);
}

// Decode (the direct path) with K and V whose elements are not contiguous
// (views of [b, hk, d, j] buffers): their rows are converted into the
// block's float32 buffers rather than read in place, for float32 and a
// 16-bit cache, one and three query rows, two key blocks, d not a
// multiple of the vector length.
TEST(AttentionKernelPaths, DecodeStridedKeyAndValueElements) {
  std::uint32_t seed = 700;
  const std::int64_t h = 4, hk = 2, j = 300, d = 20;
  for (const DType kv_dtype : {DType::kFloat32, DType::kFloat16}) {
    for (const std::int64_t i : {1, 3}) {
      SCOPED_TRACE("kv dtype " + std::to_string(static_cast<int>(kv_dtype)) + " i " +
                   std::to_string(i));
      const Tensor q = test::random_tensor({1, h, i, d}, seed, -2.0f, 2.0f);
      const Tensor kt = test::random_tensor({1, hk, d, j}, seed + 1, -2.0f, 2.0f).to(kv_dtype);
      const Tensor vt = test::random_tensor({1, hk, d, j}, seed + 2).to(kv_dtype);
      seed += 3;
      const std::vector<std::int64_t> shape = {1, hk, j, d}, strides = {hk * d * j, d * j, 1, j};
      const Tensor k = Tensor::from_blob(const_cast<void*>(kt.raw_data()), shape, strides, kv_dtype);
      const Tensor v = Tensor::from_blob(const_cast<void*>(vt.raw_data()), shape, strides, kv_dtype);
      test::NaiveSeq a = DenseNaive(q, k, v, h, hk, i, j, d, true);
      a.slopes = {0.05f, 0.1f, 0.2f, 0.4f};
      AttentionOptions opt;
      opt.causal = true;
      const test::NaiveOut want = test::naive_attention(a);
      const std::vector<float> wantf(want.out.begin(), want.out.end());
      test::expect_close(
          attention_forward(q, k, v, AttentionBias::alibi(a.slopes), opt).to_float_vector(), wantf,
          "attention_forward", test::naive_atol(kv_dtype), test::naive_rtol(kv_dtype));
    }
  }
}

// A causal ALiBi call of q, k, v (b 1) against the naive formula of a,
// with one thread and with four (the keys split across tasks).
void ExpectCausalAlibiOnThreads(const Tensor& q, const Tensor& k, const Tensor& v,
                                const test::NaiveSeq& a) {
  const test::NaiveOut want = test::naive_attention(a);
  const std::vector<float> wantf(want.out.begin(), want.out.end());
  AttentionOptions opt;
  opt.causal = true;
  for (const int threads : {1, 4}) {
    omp_set_num_threads(threads);
    test::expect_close(
        attention_forward(q, k, v, AttentionBias::alibi(a.slopes), opt).to_float_vector(), wantf,
        "attention_forward threads " + std::to_string(threads), test::naive_atol(DType::kFloat32),
        test::naive_rtol(DType::kFloat32));
  }
}

// Decode from a dense cache with d = 128 (on AVX-512 the rows are
// addressed by their stride: DecScoresDenseTile for four query rows of a
// kv head, with DecPVDenseQuad and the cross-pass prefetch for float32,
// DecScoresDenseRow and, for 16-bit values, DecPVDenseRow for one row, with
// the cross-pass prefetch for 16-bit rows; a change to any of them fails
// here): float32, float16 and bfloat16 K and
// V with float32 q, one query head per kv head and four, key counts that
// are and are not whole groups of 16 (the keys past the last whole group
// take the general tiles), two and three key blocks (the last shorter),
// one thread and four (the keys split across tasks), on every
// instruction set. Also the rows of a
// [b, j, hk, d] slab (a row stride of hk d), whose tasks hold several kv
// heads and take the general tiles.
TEST(AttentionKernelPaths, DecodeDenseRowsOfD128) {
  const int saved = omp_get_max_threads();
  std::uint32_t seed = 900;
  const std::int64_t d = 128, i = 1;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const DType kv_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const auto& [h, hk] : {std::pair<std::int64_t, std::int64_t>{2, 2}, {8, 2}, {4, 1}}) {
        for (const std::int64_t j : {300, 37, 16, 700}) {
          for (const bool slab : {false, true}) {
            SCOPED_TRACE(std::string(hwy::TargetName(target)) + " kv dtype " +
                         std::to_string(static_cast<int>(kv_dtype)) + " h " + std::to_string(h) +
                         " hk " + std::to_string(hk) + " j " + std::to_string(j) + " slab " +
                         std::to_string(slab));
            const Tensor q = test::random_tensor({1, h, i, d}, seed, -2.0f, 2.0f);
            Tensor k = test::random_tensor({1, hk, j, d}, seed + 1, -2.0f, 2.0f).to(kv_dtype);
            Tensor v = test::random_tensor({1, hk, j, d}, seed + 2).to(kv_dtype);
            seed += 3;
            // The naive formula on the values as stored (16-bit rounded).
            test::NaiveSeq a = DenseNaive(q, k, v, h, hk, i, j, d, true);
            for (std::int64_t x = 0; x < h; ++x)
              a.slopes.push_back(0.01f + 0.05f * static_cast<float>(x));
            if (slab) {  // the same values in [1, j, hk, d], viewed as [1, hk, j, d]
              k = k.transpose(1, 2).contiguous_copy().transpose(1, 2);
              v = v.transpose(1, 2).contiguous_copy().transpose(1, 2);
            }
            ExpectCausalAlibiOnThreads(q, k, v, a);
            if (::testing::Test::HasFailure()) break;
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  omp_set_num_threads(saved);
}

// bfloat16 K and V rows read in place are read in pair order (each whole
// block of 2N elements as its even and its odd elements, N the float
// lanes; the rest of a row in element order), with q laid out the same
// way and O put back after the value pass: every width of row (below one
// vector, whole blocks, a block and a vector, a scalar tail), one query
// head a kv head and several (the four-, two- and one-row tiles), decode
// and several query rows, one thread and four (key splits), and K or V
// alone read in place (the other, with a last-dimension stride, converted
// to float32 rows in element order), on every instruction set.
TEST(AttentionKernelPaths, DecodeBfloat16RowsInPairOrderOfEveryWidth) {
  const int saved = omp_get_max_threads();
  std::uint32_t seed = 1300;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const std::int64_t d :
         {1, 7, 8, 16, 24, 32, 40, 48, 64, 72, 80, 100, 128, 136, 192, 256}) {
      for (const auto& [h, hk] :
           {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 1}, {6, 2}, {14, 2}}) {
        for (int layout = 0; layout < 3; ++layout) {  // both in place, K only, V only
          const std::int64_t i = 1 + static_cast<std::int64_t>(seed % 3);
          const std::int64_t j = seed % 2 == 0 ? 37 : 290;
          SCOPED_TRACE(std::string(hwy::TargetName(target)) + " d " + std::to_string(d) + " h " +
                       std::to_string(h) + " hk " + std::to_string(hk) + " i " + std::to_string(i) +
                       " j " + std::to_string(j) + " layout " + std::to_string(layout));
          const Tensor q = test::random_tensor({1, h, i, d}, seed, -2.0f, 2.0f);
          // [1, hk, d, j] transposed: the same values with a last-dimension
          // stride of j, read through float32 copies.
          const auto rows = [&](std::uint32_t sd, bool in_place) {
            if (in_place)
              return test::random_tensor({1, hk, j, d}, sd, -2.0f, 2.0f).to(DType::kBFloat16);
            return test::random_tensor({1, hk, d, j}, sd, -2.0f, 2.0f)
                .to(DType::kBFloat16)
                .transpose(2, 3);
          };
          const Tensor k = rows(seed + 1, layout != 2);
          const Tensor v = rows(seed + 2, layout != 1);
          seed += 3;
          test::NaiveSeq a =
              DenseNaive(q, k.contiguous_copy(), v.contiguous_copy(), h, hk, i, j, d, true);
          for (std::int64_t x = 0; x < h; ++x)
            a.slopes.push_back(0.02f + 0.03f * static_cast<float>(x));
          ExpectCausalAlibiOnThreads(q, k, v, a);
          if (::testing::Test::HasFailure()) break;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace posbias
