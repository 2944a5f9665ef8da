// Flushed tiles (src/kernels/attention_skip-inl.h): a tile of query rows
// skips a key block where a bound proves every p = exp(s - m) is exactly 0.
// The results must keep every bit of the computation without the skip
// (POSBIAS_FLUSHED_TILES=0), out and lse, over the layouts and options the
// blocked path takes; the skip must happen where ALiBi's steep heads put
// whole blocks far below the diagonal (the kernel's counter), and never for
// a block whose V holds a NaN or an infinity, whose K holds a NaN, or where
// the skip is not allowed (a distance table).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "kernels/attention_fused.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::Shape;

Tensor ints(const Shape& shape, const std::vector<std::int64_t>& v) {
  return Tensor::from_vector(shape, std::vector<float>(v.begin(), v.end())).to(DType::kInt32);
}

// One forward's out and lse (as float vectors), and how many tiles skipped
// a block in it.
struct Run {
  std::vector<float> out, lse;
  std::int64_t skipped = 0;
};

using Forward = std::function<AttentionForwardResult()>;

Run RunOnce(const Forward& f) {
  const std::int64_t before = detail::flushed_tiles_skipped();
  const AttentionForwardResult r = f();
  Run run;
  run.skipped = detail::flushed_tiles_skipped() - before;
  run.out = r.out.to_float_vector();
  if (r.lse.numel() > 0) run.lse = r.lse.to_float_vector();
  return run;
}

using test::Skip;

// The call with and without the skip on each vector width: the same bits
// (test::expect_skip_keeps_bits).
void ExpectSameBits(const std::string& what, const Forward& f, Skip skip) {
  test::expect_skip_keeps_bits(
      what, skip, [&] { return RunOnce(f); },
      [&](const Run& on, const Run& off) {
        test::expect_bits_equal(on.out, off.out, what + " out");
        test::expect_bits_equal(on.lse, off.lse, what + " lse");
      });
}

Forward Dense(const Tensor& q, const Tensor& k, const Tensor& v, AttentionBias bias,
              AttentionOptions opt) {
  return [=] { return attention_forward_lse(q, k, v, bias, opt); };
}

// Steep ALiBi heads (slopes 0.5 to 4) beside flat ones.
std::vector<float> MixedSlopes(std::int64_t h) {
  const float pick[] = {2.0f, 0.03f, 4.0f, 0.5f, 1.0f, 0.25f};
  std::vector<float> s;
  for (std::int64_t x = 0; x < h; ++x) s.push_back(pick[x % 6]);
  return s;
}

TEST(AttentionFlushedTiles, DenseCallsKeepEveryBit) {
  struct Case {
    std::int64_t b, h, hk, i, j, d;
    bool causal;
    AttentionWindow window;
    DType dtype, kv_dtype;
    bool mask;
  };
  const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  const Case cases[] = {
      {1, 2, 2, 700, 700, 64, false, {}, f32, f32, false},
      {1, 3, 3, 640, 640, 40, true, {}, f32, f32, false},  // d not whole vectors
      {1, 2, 2, 600, 900, 128, false, {300, 200}, f32, f32, false},
      {1, 2, 2, 500, 500, 64, false, {-1, 100}, f32, f32, false},
      // Window edges send tiles through SoftmaxRows, which folds the rows'
      // partial sums into l: a skipped tile must fold them too.
      {1, 2, 2, 800, 800, 128, false, {300, 200}, f32, f32, false},
      {1, 1, 1, 800, 800, 64, false, {300, -1}, f32, f32, false},
      {1, 4, 2, 520, 520, 64, true, {}, f32, f32, false},  // grouped-query prefill
      {2, 2, 2, 400, 700, 32, false, {}, f32, f32, true},  // key mask: V packed
      {1, 2, 2, 700, 700, 64, true, {}, f32, bf16, false},
      {1, 2, 2, 700, 700, 64, false, {}, f32, f16, false},
      {1, 2, 2, 700, 700, 80, true, {}, bf16, bf16, false},
      {1, 2, 2, 300, 900, 64, false, {}, f16, f16, false},
  };
  std::uint32_t seed = 100;
  for (const Case& c : cases) {
    seed += 10;
    Tensor q = test::random_tensor({c.b, c.h, c.i, c.d}, seed);
    Tensor k = test::random_tensor({c.b, c.hk, c.j, c.d}, seed + 1);
    Tensor v = test::random_tensor({c.b, c.hk, c.j, c.d}, seed + 2);
    if (c.dtype != f32) q = q.to(c.dtype);
    if (c.kv_dtype != f32) {
      k = k.to(c.kv_dtype);
      v = v.to(c.kv_dtype);
    }
    AttentionOptions opt;
    opt.causal = c.causal;
    opt.window = c.window;
    if (c.mask) {
      std::vector<float> m(static_cast<std::size_t>(c.b * c.j), 1.0f);
      for (std::int64_t x = 0; x < 37; ++x) m[static_cast<std::size_t>(c.j + x)] = 0.0f;
      opt.key_mask = Tensor::from_vector({c.b, c.j}, m).to(DType::kUInt8);
    }
    const std::string what = "b " + std::to_string(c.b) + " h " + std::to_string(c.h) + " hk " +
                             std::to_string(c.hk) + " i " + std::to_string(c.i) + " j " +
                             std::to_string(c.j) + " d " + std::to_string(c.d);
    ExpectSameBits(what, Dense(q, k, v, AttentionBias::alibi(MixedSlopes(c.h)), opt), Skip::kMust);
    // A negative slope (the bias grows with distance: the blocks nearest
    // the rows may be flushed once the far ones set the maximum) and no
    // bias (these scores are within a few units of each other: nothing is).
    std::vector<float> negative(static_cast<std::size_t>(c.h), -0.05f);
    ExpectSameBits(what + " negative slopes", Dense(q, k, v, AttentionBias::alibi(negative), opt),
                   Skip::kMay);
    ExpectSameBits(what + " no bias", Dense(q, k, v, AttentionBias::none(), opt), Skip::kMustNot);
  }
}

TEST(AttentionFlushedTiles, PackedAndCachedCallsKeepEveryBit) {
  const std::int64_t h = 2, d = 64;
  const AttentionBias alibi = AttentionBias::alibi(MixedSlopes(h));
  // A packed batch of three sequences (FlashAttention's varlen layout).
  const std::vector<std::int64_t> lens = {300, 900, 700};
  const std::int64_t total = 1900;
  const Tensor q = test::random_tensor({total, h, d}, 7);
  const Tensor k = test::random_tensor({total, h, d}, 8);
  const Tensor v = test::random_tensor({total, h, d}, 9);
  const Tensor cu = ints({4}, {0, 300, 1200, 1900});
  for (const bool causal : {false, true}) {
    AttentionOptions opt;
    opt.causal = causal;
    ExpectSameBits(
        "varlen causal " + std::to_string(causal),
        [=] {
          AttentionForwardResult r;
          r.out = attention_varlen_forward(q, k, v, cu, cu, alibi, opt);
          return r;
        },
        Skip::kMust);
  }
  // A paged cache: 2 sequences of 800 and 1000 keys appending 64 queries
  // each, in blocks of 16 rows handed out in reverse.
  const std::int64_t bs = 16, max_blocks = 63, blocks = 2 * max_blocks;
  const Tensor kc = test::random_tensor({blocks, bs, h, d}, 10);
  const Tensor vc = test::random_tensor({blocks, bs, h, d}, 11);
  std::vector<std::int64_t> table;
  for (std::int64_t x = 0; x < blocks; ++x) table.push_back(blocks - 1 - x);
  const Tensor bt = ints({2, max_blocks}, table);
  const Tensor seqlens = ints({2}, {800, 1000});
  const Tensor qc = test::random_tensor({2, 64, h, d}, 12);
  ExpectSameBits(
      "paged append",
      [=] {
        AttentionForwardResult r;
        r.out = attention_kvcache_forward(qc, kc, vc, seqlens, bt, alibi, AttentionOptions{});
        return r;
      },
      Skip::kMust);
}

// A NaN or infinity in a far block's V reaches the rows through 0 * NaN in
// the products (as in PyTorch's softmax(s) v): that block is computed; a
// NaN in a far key makes the rows' scores NaN. Either way the same bits,
// and NaN rows.
TEST(AttentionFlushedTiles, NonFiniteFarBlocksAreComputed) {
  const std::int64_t h = 1, n = 800, d = 64;
  const std::vector<float> steep = {2.0f};
  for (const bool in_k : {false, true}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), test::kInf}) {
      if (in_k && !std::isnan(bad)) continue;
      std::vector<float> kv = test::random_tensor({1, h, n, d}, 21).to_float_vector();
      kv[static_cast<std::size_t>(5 * d + 3)] = bad;  // key 5: far from rows past ~100
      const Tensor q = test::random_tensor({1, h, n, d}, 20);
      const Tensor other = test::random_tensor({1, h, n, d}, 22);
      const Tensor changed = Tensor::from_vector({1, h, n, d}, kv);
      const Tensor& k = in_k ? changed : other;
      const Tensor& v = in_k ? other : changed;
      const std::string what = std::string(in_k ? "k" : "v") + " holds " + std::to_string(bad);
      ExpectSameBits(what, Dense(q, k, v, AttentionBias::alibi(steep), AttentionOptions{}),
                     Skip::kMust);
      const std::vector<float> out =
          attention_forward(q, k, v, AttentionBias::alibi(steep)).to_float_vector();
      EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(700 * d + 3)]))
          << what;  // row 700, element 3
    }
  }
}

// Grouped-query heads over a paged cache: the query heads of a kv head go
// shallowest slope first, and the steeper ones take a block's key norm and
// its values' finiteness from the packing the shallower ones made (V is
// packed from a paged cache; a dense one's is read in place). A NaN or an
// infinity there must still stop the skip, and a NaN key make the rows NaN.
TEST(AttentionFlushedTiles, GroupedHeadsTestThePackedBlocks) {
  // Two kv heads: each thread takes a whole kv head's query heads in turn
  // (one thread: all of them), so the steep heads find the packing.
  const std::int64_t h = 8, hk = 2, d = 64, bs = 16, cached = 1200, i = 100;
  const std::int64_t blocks = (cached + bs - 1) / bs;
  const AttentionBias alibi =
      AttentionBias::alibi({2.0f, 0.004f, 4.0f, 0.5f, 0.5f, 4.0f, 0.004f, 2.0f});
  std::vector<std::int64_t> table;
  for (std::int64_t x = 0; x < blocks; ++x) table.push_back((x * 7) % blocks);  // 7 and 75 coprime
  const Tensor bt = ints({1, blocks}, table);
  const Tensor seqlens = ints({1}, {cached});
  const Tensor q = test::random_tensor({1, i, h, d}, 50);
  const std::vector<float> k0 = test::random_tensor({blocks, bs, hk, d}, 51).to_float_vector();
  const std::vector<float> v0 = test::random_tensor({blocks, bs, hk, d}, 52).to_float_vector();
  // Key 40 (page 2, row 8) of both kv heads is far from every query row
  // (positions 1100 on).
  const auto at = [&](std::int64_t kvh) {
    return static_cast<std::size_t>(((table[2] * bs + 8) * hk + kvh) * d + 5);
  };
  struct Variant {
    const char* what;
    bool changed, in_k;
    float bad;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Variant variants[] = {{"finite", false, false, 0.0f},
                              {"v holds NaN", true, false, nan},
                              {"v holds inf", true, false, test::kInf},
                              {"k holds NaN", true, true, nan}};
  for (const Variant& var : variants) {
    std::vector<float> k = k0, v = v0;
    if (var.changed) {
      for (std::int64_t kvh = 0; kvh < hk; ++kvh) (var.in_k ? k : v)[at(kvh)] = var.bad;
    }
    const Tensor kc = Tensor::from_vector({blocks, bs, hk, d}, k);
    const Tensor vc = Tensor::from_vector({blocks, bs, hk, d}, v);
    const auto call = [=] {
      AttentionForwardResult r;
      r.out = attention_kvcache_forward(q, kc, vc, seqlens, bt, alibi, AttentionOptions{});
      return r;
    };
    ExpectSameBits(std::string("paged grouped-query, ") + var.what, call, Skip::kMust);
    if (!var.changed) continue;
    // Every head's last row gets the non-finite value through key 40, even
    // where its weight is 0 (0 * NaN and 0 * inf are NaN): element 5 is not
    // finite (a skipped block would leave it finite).
    const std::vector<float> out = call().out.to_float_vector();  // [1, i, h, d]
    for (std::int64_t hh = 0; hh < h; ++hh) {
      EXPECT_FALSE(std::isfinite(out[static_cast<std::size_t>(((i - 1) * h + hh) * d + 5)]))
          << var.what << ", head " << hh;
    }
  }
}

// Keys laid out by position (a paged or slab cache, a dense [b, len, hk, d]
// view): the far blocks that most kv heads test are measured for every kv
// head from whole positions before the tasks (FillBlockNorms, the
// kernel's counter). Every block size, cache dtype and layout keeps every
// bit; a NaN in one kv head's far value row stops only that kv head's skip;
// keys laid out by head, one kv head, or no ALiBi measure nothing.
TEST(AttentionFlushedTiles, WholePositionsMeasureTheFarBlocks) {
  const std::int64_t h = 8, hk = 4, d = 32, cached = 700, i = 40;
  // The steepest slope of each kv head (query heads 2g, 2g + 1): 2, 1, 0.5
  // and 4: every block 82 keys or more from the queries is far for all.
  const AttentionBias alibi =
      AttentionBias::alibi({2.0f, 0.01f, 0.1f, 1.0f, 0.5f, 0.02f, 4.0f, 0.004f});
  const Tensor q = test::random_tensor({1, i, h, d}, 60);
  const Tensor seqlens = ints({1}, {cached});
  const auto measured = [](const Forward& f) {
    const std::int64_t before = detail::block_norms_measured();
    (void)f();
    return detail::block_norms_measured() - before;
  };
  const auto cache_call = [&](const Tensor& kc, const Tensor& vc, const Tensor& bt) -> Forward {
    return [=] {
      AttentionForwardResult r;
      r.out = attention_kvcache_forward(q, kc, vc, seqlens, bt, alibi, AttentionOptions{});
      return r;
    };
  };
  for (const DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const std::int64_t bs : {1, 16, 37, 0}) {  // 0: a slab cache, no block table
      const std::int64_t blocks = bs == 0 ? 1 : (cached + bs - 1) / bs;
      const std::int64_t rows = bs == 0 ? cached : bs;
      const Tensor kc = test::random_tensor({blocks, rows, hk, d}, 61).to(dt);
      const Tensor vc = test::random_tensor({blocks, rows, hk, d}, 62).to(dt);
      std::vector<std::int64_t> table;
      for (std::int64_t x = 0; x < blocks; ++x) table.push_back(blocks - 1 - x);
      const Tensor bt = bs == 0 ? Tensor() : ints({1, blocks}, table);
      const std::string what =
          std::string(dtype_name(dt)) + (bs == 0 ? " slab" : " block " + std::to_string(bs));
      ExpectSameBits(what, cache_call(kc, vc, bt), Skip::kMust);
      EXPECT_GT(measured(cache_call(kc, vc, bt)), 0) << what;
    }
  }
  // Kv head 1's value row of key 3 (far from every query) holds a NaN: the
  // rows of its query heads (2 and 3) get it through 0 * NaN, the others
  // skip the block and stay finite.
  const std::int64_t bs = 16, blocks = (cached + bs - 1) / bs;
  std::vector<std::int64_t> table;
  for (std::int64_t x = 0; x < blocks; ++x) table.push_back(blocks - 1 - x);
  const Tensor bt = ints({1, blocks}, table);
  const Tensor kc = test::random_tensor({blocks, bs, hk, d}, 63);
  std::vector<float> vv = test::random_tensor({blocks, bs, hk, d}, 64).to_float_vector();
  vv[static_cast<std::size_t>(((table[0] * bs + 3) * hk + 1) * d + 5)] =
      std::numeric_limits<float>::quiet_NaN();
  const Tensor vc = Tensor::from_vector({blocks, bs, hk, d}, vv);
  ExpectSameBits("NaN in kv head 1's far value row", cache_call(kc, vc, bt), Skip::kMust);
  EXPECT_GT(measured(cache_call(kc, vc, bt)), 0);
  const std::vector<float> out = cache_call(kc, vc, bt)().out.to_float_vector();  // [1, i, h, d]
  for (std::int64_t hh = 0; hh < h; ++hh) {
    const float x = out[static_cast<std::size_t>(((i - 1) * h + hh) * d + 5)];
    EXPECT_EQ(std::isnan(x), hh / 2 == 1) << "head " << hh << ": " << x;
  }
  // A packed batch (FlashAttention's varlen layout [total, hk, d]: by
  // position too) of two sequences of 400 and 500 keys, each with its last
  // 40 positions as queries. (A prefill, whose queries span its keys,
  // computes each block near some query and takes its norms from the
  // packing: nothing to measure.)
  const Tensor qv = test::random_tensor({80, h, d}, 70);
  const Tensor kv = test::random_tensor({900, hk, d}, 71);
  const Tensor vv2 = test::random_tensor({900, hk, d}, 72);
  const Tensor cu_q = ints({3}, {0, 40, 80}), cu_k = ints({3}, {0, 400, 900});
  AttentionOptions varlen_causal;
  varlen_causal.causal = true;
  const Forward varlen = [=] {
    AttentionForwardResult r;
    r.out = attention_varlen_forward(qv, kv, vv2, cu_q, cu_k, alibi, varlen_causal);
    return r;
  };
  ExpectSameBits("varlen", varlen, Skip::kMust);
  EXPECT_GT(measured(varlen), 0);
  // Dense calls: keys [1, len, hk, d] seen as [1, hk, len, d] are measured;
  // the same keys laid out by head are not (each kv head's rows are a
  // stream already), nor are they without ALiBi or with one kv head.
  const Tensor qd = test::random_tensor({1, h, i, d}, 65);
  const Tensor kp = test::random_tensor({1, cached, hk, d}, 66);
  const Tensor vp = test::random_tensor({1, cached, hk, d}, 67);
  const Tensor k_view = kp.transpose(1, 2), v_view = vp.transpose(1, 2);
  const Tensor k_heads = k_view.contiguous_copy(), v_heads = v_view.contiguous_copy();
  AttentionOptions causal;
  causal.causal = true;
  ExpectSameBits("dense by position", Dense(qd, k_view, v_view, alibi, causal), Skip::kMust);
  EXPECT_GT(measured(Dense(qd, k_view, v_view, alibi, causal)), 0);
  EXPECT_EQ(measured(Dense(qd, k_heads, v_heads, alibi, causal)), 0);
  EXPECT_EQ(measured(Dense(qd, k_view, v_view, AttentionBias::none(), causal)), 0);
  const Tensor k1 = test::random_tensor({1, cached, 1, d}, 68).transpose(1, 2);
  const Tensor v1 = test::random_tensor({1, cached, 1, d}, 69).transpose(1, 2);
  EXPECT_EQ(measured(Dense(qd, k1, v1, alibi, causal)), 0);
}

// A soft-capped score is at most min(bound, cap): the skip holds (and a
// key row with an infinity, whose norm bounds nothing, is never skipped:
// 0 * inf in q . k is a NaN score). A distance table's largest value over a
// block is not at hand: nothing is skipped.
TEST(AttentionFlushedTiles, SoftcapSkipsAndTablesDoNot) {
  const std::int64_t h = 2, n = 700, d = 64;
  const Tensor q = test::random_tensor({1, h, n, d}, 30);
  const Tensor k = test::random_tensor({1, h, n, d}, 31);
  const Tensor v = test::random_tensor({1, h, n, d}, 32);
  for (const bool causal : {false, true}) {
    AttentionOptions capped;
    capped.softcap = 30.0;
    capped.causal = causal;
    ExpectSameBits("softcap causal " + std::to_string(causal),
                   Dense(q, k, v, AttentionBias::alibi(MixedSlopes(h)), capped), Skip::kMust);
    capped.softcap = 0.5;
    ExpectSameBits("softcap 0.5 causal " + std::to_string(causal),
                   Dense(q, k, v, AttentionBias::alibi(MixedSlopes(h)), capped), Skip::kMust);
  }
  // q with a zero where key 5 holds an infinity: q . k is NaN there.
  std::vector<float> qv = q.to_float_vector(), kv = k.to_float_vector();
  for (std::int64_t r = 0; r < n; ++r) qv[static_cast<std::size_t>(r * d + 7)] = 0.0f;
  kv[static_cast<std::size_t>(5 * d + 7)] = test::kInf;
  const Tensor qz = Tensor::from_vector({1, h, n, d}, qv),
               kinf = Tensor::from_vector({1, h, n, d}, kv);
  AttentionOptions capped;
  capped.softcap = 30.0;
  ExpectSameBits("softcap, inf key",
                 Dense(qz, kinf, v, AttentionBias::alibi(MixedSlopes(h)), capped), Skip::kMay);
  const std::vector<float> out =
      attention_forward(qz, kinf, v, AttentionBias::alibi(MixedSlopes(h)), capped)
          .to_float_vector();
  EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(600 * d)]));  // head 0, row 600
  std::vector<float> table(static_cast<std::size_t>(h * (2 * n + 1)));
  for (std::size_t x = 0; x < table.size(); ++x) table[x] = -0.5f * static_cast<float>(x % 97);
  const AttentionBias tb =
      AttentionBias::distance_table(Tensor::from_vector({h, 2 * n + 1}, table));
  ExpectSameBits("table", Dense(q, k, v, tb, AttentionOptions{}), Skip::kMustNot);
}

// The skipping call against the reference formula, steep slopes.
TEST(AttentionFlushedTiles, SteepAlibiMatchesTheReference) {
  const std::int64_t h = 6, n = 900, d = 48;
  const Tensor q = test::random_tensor({1, h, n, d}, 40, -2.0f, 2.0f);
  const Tensor k = test::random_tensor({1, h, n, d}, 41, -2.0f, 2.0f);
  const Tensor v = test::random_tensor({1, h, n, d}, 42);
  const AttentionBias alibi = AttentionBias::alibi(MixedSlopes(h));
  for (const bool causal : {false, true}) {
    AttentionOptions opt;
    opt.causal = causal;
    const std::int64_t before = detail::flushed_tiles_skipped();
    const std::vector<float> got = attention_forward(q, k, v, alibi, opt).to_float_vector();
    EXPECT_GT(detail::flushed_tiles_skipped(), before);
    test::expect_close(got, attention_reference(q, k, v, alibi, opt).to_float_vector(),
                       "causal " + std::to_string(causal), 2e-6, 2e-5);
  }
}

}  // namespace
}  // namespace posbias
