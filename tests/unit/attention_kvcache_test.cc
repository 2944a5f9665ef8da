// KV caches (issue 17): attention_kvcache_forward and its reference against
// the naive formula per sequence, paged with block sizes 1, 7, 16 and 256
// through shuffled block tables, and slabs; unused cache rows hold NaN and
// unused block-table entries garbage, so a read outside a sequence's keys
// shows. kvcache_append then attend equals the dense call. And the bad input
// of the cache calls, one test each.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_naive.h"
#include "attention_test_util.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::Shape;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor ints(const Shape& shape, const std::vector<std::int64_t>& v) {
  return Tensor::from_vector(shape, std::vector<float>(v.begin(), v.end())).to(DType::kInt32);
}

// A cache of b sequences: their keys and values [hk, j_s, d] (the truth),
// laid out paged (block_size > 0) or as slabs (block_size 0).
struct Cache {
  std::int64_t hk = 1, d = 1, block_size = 0, max_blocks = 0, num_blocks = 0, max_len = 0;
  std::vector<std::int64_t> lens;
  std::vector<std::vector<float>> k, v;  // per sequence [hk, j_s, d]
  Tensor k_cache, v_cache, table, seqlens;
};

// The cache tensor of `values` (shape [.., d]) in dtype: contiguous, or a
// slice of a wider last dimension (strided rows).
Tensor cache_tensor(const Shape& shape, const std::vector<float>& values, DType dt, bool strided) {
  if (!strided) return Tensor::from_vector(shape, values).to(dt);
  const std::int64_t d = shape.back();
  Shape wide = shape;
  wide.back() = d + 2;
  std::vector<float> w;
  for (std::size_t x = 0; x < values.size(); x += static_cast<std::size_t>(d)) {
    w.push_back(-5.0f);
    w.insert(w.end(), values.begin() + static_cast<std::ptrdiff_t>(x),
             values.begin() + static_cast<std::ptrdiff_t>(x) + d);
    w.push_back(7.0f);
  }
  return Tensor::from_vector(wide, w).to(dt).slice(3, 1, 1 + d);
}

Cache make_cache(const std::vector<std::int64_t>& lens, std::int64_t hk, std::int64_t d,
                 std::int64_t block_size, DType dt, std::uint32_t seed, bool strided = false) {
  Cache c;
  c.hk = hk, c.d = d, c.block_size = block_size, c.lens = lens;
  const auto b = static_cast<std::int64_t>(lens.size());
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t s = 0; s < b; ++s) {
    std::vector<float> ks, vs;
    for (std::int64_t x = 0; x < hk * lens[s] * d; ++x) ks.push_back(u(gen)), vs.push_back(u(gen));
    // The values the cache dtype holds.
    c.k.push_back(Tensor::from_vector({std::int64_t(ks.size())}, ks).to(dt).to_float_vector());
    c.v.push_back(Tensor::from_vector({std::int64_t(vs.size())}, vs).to(dt).to_float_vector());
  }
  const std::int64_t longest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  std::vector<float> kc, vc;
  if (block_size > 0) {
    c.max_blocks = (longest + block_size - 1) / block_size + 1;  // one spare entry
    std::vector<std::int64_t> need;
    for (std::int64_t s = 0; s < b; ++s) need.push_back((lens[s] + block_size - 1) / block_size);
    c.num_blocks = std::accumulate(need.begin(), need.end(), std::int64_t{0}) + 2;  // 2 unused
    std::vector<std::int64_t> ids(static_cast<std::size_t>(c.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), gen);
    std::vector<std::int64_t> tab(static_cast<std::size_t>(b * c.max_blocks));
    std::size_t next = 0;
    for (std::int64_t s = 0; s < b; ++s) {
      for (std::int64_t m = 0; m < c.max_blocks; ++m) {
        // Entries a sequence does not use hold garbage (never read).
        tab[static_cast<std::size_t>(s * c.max_blocks + m)] =
            m < need[s] ? ids[next++] : (m % 2 ? -7 : c.num_blocks + 1000);
      }
    }
    kc.assign(static_cast<std::size_t>(c.num_blocks * block_size * hk * d), kNaN);
    vc = kc;
    for (std::int64_t s = 0; s < b; ++s) {
      for (std::int64_t pos = 0; pos < lens[s]; ++pos) {
        const std::int64_t blk = tab[static_cast<std::size_t>(s * c.max_blocks + pos / block_size)];
        for (std::int64_t x = 0; x < hk; ++x) {
          for (std::int64_t e = 0; e < d; ++e) {
            const auto at =
                static_cast<std::size_t>(((blk * block_size + pos % block_size) * hk + x) * d + e);
            const auto from = static_cast<std::size_t>((x * lens[s] + pos) * d + e);
            kc[at] = c.k[s][from];
            vc[at] = c.v[s][from];
          }
        }
      }
    }
    c.k_cache = cache_tensor({c.num_blocks, block_size, hk, d}, kc, dt, strided);
    c.v_cache = cache_tensor({c.num_blocks, block_size, hk, d}, vc, dt, strided);
    c.table = ints({b, c.max_blocks}, tab);
  } else {
    c.max_len = longest + 3;
    kc.assign(static_cast<std::size_t>(b * c.max_len * hk * d), kNaN);
    vc = kc;
    for (std::int64_t s = 0; s < b; ++s) {
      for (std::int64_t pos = 0; pos < lens[s]; ++pos) {
        for (std::int64_t x = 0; x < hk; ++x) {
          for (std::int64_t e = 0; e < d; ++e) {
            const auto at = static_cast<std::size_t>(((s * c.max_len + pos) * hk + x) * d + e);
            const auto from = static_cast<std::size_t>((x * lens[s] + pos) * d + e);
            kc[at] = c.k[s][from];
            vc[at] = c.v[s][from];
          }
        }
      }
    }
    c.k_cache = cache_tensor({b, c.max_len, hk, d}, kc, dt, strided);
    c.v_cache = cache_tensor({b, c.max_len, hk, d}, vc, dt, strided);
    c.table = Tensor();
  }
  c.seqlens = ints({b}, lens);
  return c;
}

struct CacheCase {
  std::vector<std::int64_t> lens;
  std::int64_t i = 1, h = 4, hk = 2, d = 16, block_size = 16;
  DType qt = DType::kFloat32, kvt = DType::kFloat32;
  bool causal = true;
  std::int64_t left = -1, right = -1;
  float softcap = 0.0f;
  int bias = 0;          // 0 none, 1 ALiBi [h], 2 ALiBi [b, h], 3 centred table
  bool strided = false;  // cache rows and q with gaps (slices of a wider d)
  std::uint32_t seed = 1;
};

void check_cache_case(const CacheCase& cc) {
  const auto b = static_cast<std::int64_t>(cc.lens.size());
  SCOPED_TRACE("lens " + ::testing::PrintToString(cc.lens) + " i " + std::to_string(cc.i) + " h " +
               std::to_string(cc.h) + " hk " + std::to_string(cc.hk) + " d " +
               std::to_string(cc.d) + " block_size " + std::to_string(cc.block_size) + " " +
               dtype_name(cc.qt) + "/" + dtype_name(cc.kvt) + " causal " +
               std::to_string(cc.causal) + (cc.strided ? " strided" : "") + " window {" +
               std::to_string(cc.left) + ", " + std::to_string(cc.right) + "} softcap " +
               std::to_string(cc.softcap) + " bias " + std::to_string(cc.bias));
  const Cache c = make_cache(cc.lens, cc.hk, cc.d, cc.block_size, cc.kvt, cc.seed, cc.strided);
  const Tensor q =
      cc.strided ? test::random_tensor({b, cc.h, cc.i, cc.d}, cc.seed + 3).to(cc.qt).transpose(1, 2)
                 : test::random_tensor({b, cc.i, cc.h, cc.d}, cc.seed + 3).to(cc.qt);
  const std::vector<float> qv = q.to_float_vector();
  AttentionOptions opt;
  opt.causal = cc.causal;
  opt.window = {cc.left, cc.right};
  opt.softcap = cc.softcap;
  std::mt19937 gen(cc.seed + 4);
  std::uniform_real_distribution<float> u(0.05f, 0.6f);
  std::vector<float> slopes, table;
  const std::int64_t longest = *std::max_element(cc.lens.begin(), cc.lens.end());
  const std::int64_t n = 2 * (longest + cc.i + 2) + 1;
  AttentionBias bias;
  if (cc.bias == 1 || cc.bias == 2) {
    for (std::int64_t x = 0; x < (cc.bias == 1 ? cc.h : b * cc.h); ++x) slopes.push_back(u(gen));
    bias = AttentionBias::alibi(slopes);
  } else if (cc.bias == 3) {
    for (std::int64_t x = 0; x < cc.h * n; ++x) table.push_back(u(gen) - 0.3f);
    bias = AttentionBias::distance_table(Tensor::from_vector({cc.h, n}, table));
  }
  std::vector<float> want(static_cast<std::size_t>(b * cc.i * cc.h * cc.d));
  std::vector<double> want_lse(static_cast<std::size_t>(b * cc.h * cc.i));  // [b, h, i]
  for (std::int64_t s = 0; s < b; ++s) {
    test::NaiveSeq a;
    a.h = cc.h, a.hk = cc.hk, a.i = cc.i, a.j = cc.lens[s], a.d = cc.d;
    for (std::int64_t x = 0; x < cc.h; ++x) {
      for (std::int64_t r = 0; r < cc.i; ++r) {
        for (std::int64_t e = 0; e < cc.d; ++e) {
          a.q.push_back(qv[static_cast<std::size_t>(((s * cc.i + r) * cc.h + x) * cc.d + e)]);
        }
      }
    }
    a.k = c.k[s], a.v = c.v[s];
    a.q_offset = a.j - a.i;
    a.scale = 1.0f / std::sqrt(static_cast<float>(cc.d));
    a.causal = cc.causal, a.left = cc.left, a.right = cc.right, a.softcap = cc.softcap;
    if (cc.bias == 1) a.slopes = slopes;
    if (cc.bias == 2) a.slopes.assign(slopes.begin() + s * cc.h, slopes.begin() + (s + 1) * cc.h);
    if (cc.bias == 3) a.table = table, a.table_n = n;
    const test::NaiveOut o = test::naive_attention(a);
    for (std::int64_t x = 0; x < cc.h; ++x) {
      for (std::int64_t r = 0; r < cc.i; ++r) {
        want_lse[static_cast<std::size_t>((s * cc.h + x) * cc.i + r)] =
            o.lse[static_cast<std::size_t>(x * cc.i + r)];
        for (std::int64_t e = 0; e < cc.d; ++e) {
          want[static_cast<std::size_t>(((s * cc.i + r) * cc.h + x) * cc.d + e)] =
              static_cast<float>(o.out[static_cast<std::size_t>((x * cc.i + r) * cc.d + e)]);
        }
      }
    }
  }
  if (cc.qt != DType::kFloat32) {
    want = Tensor::from_vector({std::int64_t(want.size())}, want).to(cc.qt).to_float_vector();
  }
  const double atol = test::naive_atol(cc.qt), rtol = test::naive_rtol(cc.qt);
  const Tensor out =
      attention_kvcache_forward(q, c.k_cache, c.v_cache, c.seqlens, c.table, bias, opt);
  ASSERT_EQ(out.shape(), (Shape{b, cc.i, cc.h, cc.d}));
  test::expect_close(out.to_float_vector(), want, "kvcache_forward", atol, rtol);
  test::expect_close(
      attention_kvcache_reference(q, c.k_cache, c.v_cache, c.seqlens, c.table, bias, opt)
          .to_float_vector(),
      want, "kvcache_reference", atol, rtol);
  // With the lse: out the same bits, lse [b, h, i] the naive formula's.
  const AttentionForwardResult fl =
      attention_kvcache_forward_lse(q, c.k_cache, c.v_cache, c.seqlens, c.table, bias, opt);
  ASSERT_EQ(fl.out.shape(), out.shape());
  ASSERT_EQ(fl.lse.shape(), (Shape{b, cc.h, cc.i}));
  ASSERT_EQ(fl.lse.dtype(), DType::kFloat32);
  EXPECT_EQ(fl.out.to_float_vector(), out.to_float_vector()) << "out of kvcache_forward_lse";
  ASSERT_NO_FATAL_FAILURE(test::expect_lse_near(fl.lse, want_lse));
}

const DType kPairs[5][2] = {{DType::kFloat32, DType::kFloat32},
                            {DType::kBFloat16, DType::kBFloat16},
                            {DType::kFloat16, DType::kFloat16},
                            {DType::kFloat32, DType::kBFloat16},
                            {DType::kFloat32, DType::kFloat16}};

TEST(AttentionKvcache, PagedAndSlabsMatchTheNaiveFormula) {
  std::uint32_t seed = 700;
  const std::int64_t windows[3][2] = {{-1, -1}, {5, -1}, {0, 0}};
  for (std::int64_t bs : {1, 7, 16, 256, 0}) {
    for (std::int64_t i : {1, 3}) {
      for (const auto& w : windows) {
        for (int bias = 0; bias < 4; ++bias) {
          CacheCase cc;
          cc.lens = {5, 0, 40, 17, 1};
          cc.i = i, cc.block_size = bs;
          cc.left = w[0], cc.right = w[1];
          cc.bias = bias;
          cc.causal = seed % 4 != 0;
          cc.softcap = seed % 3 == 0 ? 4.0f : 0.0f;
          cc.hk = seed % 2 ? 1 : 2;
          cc.d = seed % 5 == 0 ? 33 : 16;
          cc.qt = kPairs[seed % 5][0], cc.kvt = kPairs[seed % 5][1];
          cc.strided = seed % 3 == 2;
          cc.seed = seed++;
          check_cache_case(cc);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionKvcache, LongCachesHeadDimension128AndChunks) {
  std::uint32_t seed = 900;
  for (std::int64_t bs : {7, 16, 256}) {
    CacheCase cc;
    cc.lens = {300, 129, 2};
    cc.i = 2, cc.h = 8, cc.hk = 2, cc.d = 128, cc.block_size = bs, cc.bias = 2;
    cc.seed = seed++;
    check_cache_case(cc);
    cc.i = 5, cc.d = 80, cc.bias = 3, cc.kvt = DType::kFloat16, cc.left = 64;
    cc.seed = seed++;
    check_cache_case(cc);
  }
}

// A decode task holds every kv head of a key position (their rows side by
// side) and walks keys in blocks cut to its heads' bytes and the machine's
// L2 (for 8 heads of d = 128: 64 keys of float32 rows with 512 KiB of L2,
// 128 with 1 MiB, at most 256; twice as many 16-bit ones): sequences over
// several such blocks and a partial last one, pages across block edges.
// On AVX-512 (float32, four query rows a kv head) a group of 16 keys within
// one page is read by stride (DecScoresRunTiles); with pages of 24 keys
// the groups alternate between one page and two, so that path stops
// within a block and the general one goes on from there; of 7, no group
// is within a page.
TEST(AttentionKvcache, DecodeOverManyKvHeadsInShortKeyBlocks) {
  std::uint32_t seed = 950;
  for (std::int64_t bs : {16, 24, 7, 0}) {
    for (DType kvt : {DType::kFloat32, DType::kBFloat16}) {
      CacheCase cc;
      cc.lens = {1100, 300, 129, 64, 2};
      cc.h = 32, cc.hk = 8, cc.d = 128, cc.block_size = bs, cc.bias = 1;
      cc.kvt = kvt;
      cc.seed = seed++;
      check_cache_case(cc);
      if (HasFatalFailure()) return;
      cc.i = 2, cc.bias = 3, cc.left = 100;  // two rows (4 kv heads a task), a window
      cc.seed = seed++;
      check_cache_case(cc);
      if (HasFatalFailure()) return;
    }
  }
}

// A decode task of several kv heads walks its value rows key-major
// (DecValuesKeyMajor: groups of 4 keys, then single keys, each for every kv
// head with its tiles of four, two and one query rows): every number of
// query rows a kv head from 1 to 8, key counts that leave 0 to 3 keys
// after the groups, d a multiple of every vector width or not (the general
// value pass), in a paged cache and in slabs, both dtypes of rows; in
// every instruction set this CPU and build have (the tiles' widths differ).
TEST(AttentionKvcache, DecodeKeyMajorOverEveryQueryGroup) {
  const std::int64_t heads[5][2] = {{8, 8}, {6, 2}, {12, 2}, {16, 2}, {15, 3}};
  const auto every_case = [&] {
    std::uint32_t seed = 980;
    for (const auto& hh : heads) {
      for (std::int64_t d : {128, 64, 40}) {
        for (std::int64_t bs : {16, 7, 0}) {
          CacheCase cc;
          cc.lens = {37, 5, 130, 1, 258};
          cc.h = hh[0], cc.hk = hh[1], cc.d = d, cc.block_size = bs, cc.bias = seed % 2 ? 1 : 3;
          cc.kvt = seed % 3 == 0 ? DType::kFloat16 : DType::kFloat32;
          cc.left = seed % 4 == 0 ? 50 : -1;
          cc.seed = seed++;
          check_cache_case(cc);
          if (HasFatalFailure()) return;
        }
      }
    }
  };
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    every_case();
    if (HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Append n new keys to a cache, then attend with the lengths + n: the same
// as one dense call over the whole keys (bottom-right).
TEST(AttentionKvcache, AppendThenAttendEqualsDense) {
  for (std::int64_t bs : {1, 7, 16, 0}) {
    // k_new float32: copied into a float32 cache, rounded into a 16-bit one.
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE("block_size " + std::to_string(bs) + " " + dtype_name(dt));
      const std::int64_t hk = 2, h = 4, d = 8, n = 3;
      const std::vector<std::int64_t> lens = {4, 0, 9};
      // Built with room: lengths + n, then the lens reset to the old ones.
      const std::vector<std::int64_t> full = {lens[0] + n, lens[1] + n, lens[2] + n};
      Cache c = make_cache(full, hk, d, bs, dt, 41);
      const auto b = static_cast<std::int64_t>(lens.size());
      // The new rows [b, n, hk, d] are the last n keys of each sequence.
      std::vector<float> kn, vn;
      for (std::int64_t s = 0; s < b; ++s) {
        for (std::int64_t t = 0; t < n; ++t) {
          for (std::int64_t x = 0; x < hk; ++x) {
            for (std::int64_t e = 0; e < d; ++e) {
              const auto from = static_cast<std::size_t>((x * full[s] + lens[s] + t) * d + e);
              kn.push_back(c.k[s][from]);
              vn.push_back(c.v[s][from]);
            }
          }
        }
      }
      // Wipe those slots in the cache: the append must write them.
      Tensor kc = c.k_cache.contiguous_copy(), vc = c.v_cache.contiguous_copy();
      {
        std::vector<float> kw = kc.to_float_vector(), vw = vc.to_float_vector();
        const Shape shape = kc.shape();
        const std::vector<float> tab = bs > 0 ? c.table.to_float_vector() : std::vector<float>();
        for (std::int64_t s = 0; s < b; ++s) {
          for (std::int64_t t = lens[s]; t < full[s]; ++t) {
            const std::int64_t base =
                bs > 0
                    ? std::int64_t(tab[static_cast<std::size_t>(s * c.max_blocks + t / bs)]) * bs +
                          t % bs
                    : s * c.max_len + t;
            for (std::int64_t x = 0; x < hk * d; ++x) {
              kw[static_cast<std::size_t>(base * hk * d + x)] = kNaN;
              vw[static_cast<std::size_t>(base * hk * d + x)] = kNaN;
            }
          }
        }
        kc = Tensor::from_vector(shape, kw).to(dt);
        vc = Tensor::from_vector(shape, vw).to(dt);
      }
      const Tensor old_lens = ints({b}, lens);
      // v_new in the cache's dtype with its elements hk apart (a view of a
      // [b, n, d, hk] tensor): converted element by element, not copied.
      const Tensor v_new = Tensor::from_vector({b, n, hk, d}, vn)
                               .to(dt)
                               .transpose(2, 3)
                               .contiguous_copy()
                               .transpose(2, 3);
      kvcache_append(kc, vc, old_lens, c.table, Tensor::from_vector({b, n, hk, d}, kn), v_new);
      const Tensor q = test::random_tensor({b, 2, h, d}, 5).to(dt);
      AttentionOptions opt;
      opt.causal = true;
      const std::vector<float> got =
          attention_kvcache_forward(q, kc, vc, c.seqlens, c.table,
                                    AttentionBias::alibi({0.1f, 0.2f, 0.3f, 0.4f}), opt)
              .to_float_vector();
      const std::vector<float> qv = q.to_float_vector();
      for (std::int64_t s = 0; s < b; ++s) {
        // The dense call of sequence s: q [1, h, 2, d] from [2, h, d].
        std::vector<float> qs;
        for (std::int64_t x = 0; x < h; ++x) {
          for (std::int64_t r = 0; r < 2; ++r) {
            for (std::int64_t e = 0; e < d; ++e)
              qs.push_back(qv[static_cast<std::size_t>(((s * 2 + r) * h + x) * d + e)]);
          }
        }
        const Tensor dense =
            attention_forward(Tensor::from_vector({1, h, 2, d}, qs).to(dt),
                              Tensor::from_vector({1, hk, full[s], d}, c.k[s]).to(dt),
                              Tensor::from_vector({1, hk, full[s], d}, c.v[s]).to(dt),
                              AttentionBias::alibi({0.1f, 0.2f, 0.3f, 0.4f}), opt);
        const std::vector<float> dv = dense.to_float_vector();
        std::vector<float> mine, theirs;
        for (std::int64_t x = 0; x < h; ++x) {
          for (std::int64_t r = 0; r < 2; ++r) {
            for (std::int64_t e = 0; e < d; ++e) {
              mine.push_back(got[static_cast<std::size_t>(((s * 2 + r) * h + x) * d + e)]);
              theirs.push_back(dv[static_cast<std::size_t>((x * 2 + r) * d + e)]);
            }
          }
        }
        test::expect_close(mine, theirs, "append then attend, sequence " + std::to_string(s),
                           test::naive_atol(dt), test::naive_rtol(dt));
      }
    }
  }
}

// ------------------------------------------------------------ bad input

struct Small {
  Cache c = make_cache({5, 9}, 1, 4, 4, DType::kFloat32, 3);  // max_blocks 4, num_blocks 6
  Tensor q = test::random_tensor({2, 1, 2, 4}, 9);
};

template <typename Fn>
void expect_bad(Fn fn, const std::string& needle) {
  test::expect_throw_with<std::invalid_argument>([&] { fn(); }, needle);
}

TEST(AttentionKvcacheErrors, BlockIndexOutsideTheCache) {
  Small s;
  std::vector<float> tab = s.c.table.to_float_vector();
  // Sequence 0 uses entries 0 and 1 (5 keys, blocks of 4); 7 blocks.
  ASSERT_EQ(s.c.num_blocks, 7);
  tab[1] = 7;
  const Tensor bad = Tensor::from_vector(s.c.table.shape(), tab).to(DType::kInt32);
  expect_bad([&] { attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens, bad); },
             "block_table[0][1] = 7");
  tab[1] = -1;
  const Tensor neg = Tensor::from_vector(s.c.table.shape(), tab).to(DType::kInt32);
  expect_bad([&] { attention_kvcache_reference(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens, neg); },
             "-1");
}

TEST(AttentionKvcacheErrors, SeqlensAboveTheCacheOrNegative) {
  Small s;  // max_blocks 4 * block_size 4 = 16
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, ints({2}, {5, 17}), s.c.table);
      },
      "17");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, ints({2}, {-2, 9}), s.c.table);
      },
      "-2");
  const Cache slab = make_cache({5, 9}, 1, 4, 0, DType::kFloat32, 3);  // max_len 12
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, slab.k_cache, slab.v_cache, ints({2}, {13, 9}), Tensor());
      },
      "13");
}

TEST(AttentionKvcacheErrors, TableOrSeqlensNotInt32) {
  Small s;
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens,
                                  s.c.table.to(DType::kFloat32));
      },
      "float32");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens.to(DType::kUInt8),
                                  s.c.table);
      },
      "uint8");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, ints({3}, {1, 2, 3}), s.c.table);
      },
      "[3]");
}

TEST(AttentionKvcacheErrors, DtypePairs) {
  Small s;
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q.to(DType::kBFloat16), s.c.k_cache.to(DType::kFloat16),
                                  s.c.v_cache.to(DType::kFloat16), s.c.seqlens, s.c.table);
      },
      "bfloat16, float16, float16");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache.to(DType::kBFloat16),
                                  s.c.v_cache.to(DType::kFloat16), s.c.seqlens, s.c.table);
      },
      "float32, bfloat16, float16");
}

TEST(AttentionKvcacheErrors, AppendPastTheEnd) {
  Small s;  // capacity 16 per sequence
  Tensor kc = s.c.k_cache.contiguous_copy(), vc = s.c.v_cache.contiguous_copy();
  const Tensor kn = test::random_tensor({2, 8, 1, 4}, 1);
  const Tensor full_table = ints({2, 4}, {0, 1, 2, 3, 4, 5, 6, 0});  // every entry valid
  expect_bad(
      [&] {
        kvcache_append(kc, vc, ints({2}, {5, 9}), full_table, kn, kn);
      },
      "cache_seqlens[1] = 9 plus the 8");
  // An entry the append would write that lies outside the cache.
  expect_bad([&] { kvcache_append(kc, vc, ints({2}, {5, 2}), s.c.table, kn, kn); }, "outside");
  const Tensor other = test::random_tensor({2, 1, 1, 3}, 1);  // d 3, the cache's is 4
  expect_bad(
      [&] {
        kvcache_append(kc, vc, ints({2}, {5, 9}), s.c.table, other, other);
      },
      "[2, 1, 1, 3]");
}

TEST(AttentionKvcacheErrors, RefusedOptionsAndDenseBias) {
  Small s;
  AttentionOptions off;
  off.q_offset = 0;
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens, s.c.table, {}, off);
      },
      "q_offset");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache, s.c.seqlens, s.c.table,
                                  AttentionBias::dense_bias(Tensor::full({1, 2, 1, 9}, 0.0f)));
      },
      "dense");
  expect_bad(
      [&] {
        attention_kvcache_forward(s.q, s.c.k_cache, s.c.v_cache.slice(3, 0, 3), s.c.seqlens,
                                  s.c.table);
      },
      "v_cache");
}

}  // namespace
}  // namespace posbias
