// The options of issue 16 on dense calls (q_offset, window, softcap,
// key_mask, per-sequence slopes, centred tables), composed with every bias
// kind, grouped-query heads, dtype pairs and strided views: the fused forward,
// its lse and attention_reference() against the independent naive formula of
// attention_naive.h. And the bad input of the options, one test each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_naive.h"
#include "attention_test_util.h"
#include "posbias/attention.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::NaiveOut;
using test::NaiveSeq;
using test::Shape;

enum class Mask { kNone, kLeftPad, kRightPad, kZeroRow, kRandom };
enum class Bias { kNone, kAlibi, kAlibiPerSeq, kTable, kDense };

struct DenseCase {
  std::int64_t b = 1, h = 1, hk = 1, i = 1, j = 1, d = 1;
  DType qt = DType::kFloat32, kvt = DType::kFloat32;
  bool causal = false;
  std::optional<std::int64_t> q_offset;
  std::int64_t left = -1, right = -1;
  float softcap = 0.0f;
  Mask mask = Mask::kNone;
  Bias bias = Bias::kNone;
  bool strided = false;
  std::uint32_t seed = 1;

  std::string name() const {
    return "b" + std::to_string(b) + " h" + std::to_string(h) + " hk" + std::to_string(hk) + " i" +
           std::to_string(i) + " j" + std::to_string(j) + " d" + std::to_string(d) + " " +
           dtype_name(qt) + "/" + dtype_name(kvt) + " causal " + std::to_string(causal) +
           " q_offset " + (q_offset ? std::to_string(*q_offset) : "default") + " window {" +
           std::to_string(left) + ", " + std::to_string(right) + "} softcap " +
           std::to_string(softcap) + " mask " + std::to_string(int(mask)) + " bias " +
           std::to_string(int(bias)) + (strided ? " strided" : "");
  }
};

DenseCase make_case(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                    std::int64_t d) {
  DenseCase c;
  c.b = b, c.h = h, c.hk = hk, c.i = i, c.j = j, c.d = d;
  return c;
}

Tensor make_input(const Shape& shape, std::uint32_t seed, bool strided, DType dtype) {
  Tensor t = strided ? test::random_bhld_strided(shape, seed) : test::random_tensor(shape, seed);
  if (dtype == DType::kFloat32) return t;
  // A strided 16-bit view: convert the [b, len, h, d] storage, then transpose.
  return strided ? t.transpose(1, 2).to(dtype).transpose(1, 2) : t.to(dtype);
}

std::vector<std::uint8_t> make_mask(const DenseCase& c) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(c.b * c.j), 1);
  std::mt19937 gen(c.seed + 77);
  for (std::int64_t s = 0; s < c.b; ++s) {
    const std::int64_t pad = c.j == 0 ? 0 : static_cast<std::int64_t>(gen() % (c.j + 1));
    for (std::int64_t x = 0; x < c.j; ++x) {
      std::uint8_t& e = m[static_cast<std::size_t>(s * c.j + x)];
      switch (c.mask) {
        case Mask::kLeftPad:
          e = x >= pad;
          break;
        case Mask::kRightPad:
          e = x < c.j - pad;
          break;
        case Mask::kZeroRow:
          e = s == 0 ? 0 : 1;
          break;
        case Mask::kRandom:
          e = (gen() % 3) != 0;
          break;
        case Mask::kNone:
          break;
      }
    }
  }
  return m;
}

// Runs one case through attention_forward, attention_forward_lse and
// attention_reference and compares each with the naive formula.
void check_dense_case(const DenseCase& c) {
  SCOPED_TRACE(c.name());
  const Tensor q = make_input({c.b, c.h, c.i, c.d}, c.seed, c.strided, c.qt);
  const Tensor k = make_input({c.b, c.hk, c.j, c.d}, c.seed + 1, c.strided, c.kvt);
  const Tensor v = make_input({c.b, c.hk, c.j, c.d}, c.seed + 2, c.strided, c.kvt);
  const std::vector<float> qv = q.to_float_vector(), kv = k.to_float_vector(),
                           vv = v.to_float_vector();

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.q_offset = c.q_offset;
  opt.window = {c.left, c.right};
  opt.softcap = c.softcap;
  std::vector<std::uint8_t> mask;
  if (c.mask != Mask::kNone) {
    mask = make_mask(c);
    std::vector<float> mf(mask.begin(), mask.end());
    // Every other case as bool, the others uint8; a transposed view for strides.
    const DType mt = c.seed % 2 ? DType::kBool : DType::kUInt8;
    if (c.strided) {  // stored [j, b], passed as the [b, j] view
      std::vector<float> mt_(mf.size());
      for (std::int64_t s = 0; s < c.b; ++s) {
        for (std::int64_t x = 0; x < c.j; ++x) {
          mt_[static_cast<std::size_t>(x * c.b + s)] = mf[static_cast<std::size_t>(s * c.j + x)];
        }
      }
      opt.key_mask = Tensor::from_vector({c.j, c.b}, mt_).to(mt).transpose(0, 1);
    } else {
      opt.key_mask = Tensor::from_vector({c.b, c.j}, mf).to(mt);
    }
  }
  const std::int64_t qoff = c.q_offset ? *c.q_offset : c.j - c.i;

  AttentionBias bias;
  std::vector<float> slopes, table, dense;
  std::int64_t n = 0;
  std::mt19937 gen(c.seed + 5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  switch (c.bias) {
    case Bias::kNone:
      break;
    case Bias::kAlibi:
    case Bias::kAlibiPerSeq: {
      const std::int64_t count = c.bias == Bias::kAlibi ? c.h : c.b * c.h;
      for (std::int64_t x = 0; x < count; ++x) slopes.push_back(0.05f + 0.3f * (u(gen) + 1.0f));
      bias = AttentionBias::alibi(slopes);
      break;
    }
    case Bias::kTable: {
      // Centred and longer than needed: covers every |rel| plus 3.
      n = 2 * (std::llabs(qoff) + c.i + c.j + 3) + 1;
      for (std::int64_t x = 0; x < c.h * n; ++x) table.push_back(u(gen));
      bias = AttentionBias::distance_table(Tensor::from_vector({c.h, n}, table));
      break;
    }
    case Bias::kDense: {
      for (std::int64_t x = 0; x < c.b * c.h * c.i * c.j; ++x) dense.push_back(u(gen));
      bias = AttentionBias::dense_bias(Tensor::from_vector({c.b, c.h, c.i, c.j}, dense));
      break;
    }
  }

  std::vector<double> want, want_lse;
  for (std::int64_t s = 0; s < c.b; ++s) {
    NaiveSeq a;
    a.h = c.h, a.hk = c.hk, a.i = c.i, a.j = c.j, a.d = c.d;
    const auto part = [](const std::vector<float>& all, std::int64_t s_, std::int64_t per) {
      return std::vector<float>(all.begin() + s_ * per, all.begin() + (s_ + 1) * per);
    };
    a.q = part(qv, s, c.h * c.i * c.d);
    a.k = part(kv, s, c.hk * c.j * c.d);
    a.v = part(vv, s, c.hk * c.j * c.d);
    a.q_offset = qoff;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    a.causal = c.causal;
    a.left = c.left, a.right = c.right;
    a.softcap = c.softcap;
    if (!mask.empty()) a.key_mask.assign(mask.begin() + s * c.j, mask.begin() + (s + 1) * c.j);
    if (c.bias == Bias::kAlibi) a.slopes = slopes;
    if (c.bias == Bias::kAlibiPerSeq) a.slopes = part(slopes, s, c.h);
    if (c.bias == Bias::kTable) a.table = table, a.table_n = n;
    if (c.bias == Bias::kDense) a.dense = part(dense, s, c.h * c.i * c.j);
    const NaiveOut o = test::naive_attention(a);
    want.insert(want.end(), o.out.begin(), o.out.end());
    want_lse.insert(want_lse.end(), o.lse.begin(), o.lse.end());
  }
  std::vector<float> wantf(want.begin(), want.end());
  // The naive value rounded to the output dtype, then the tolerance.
  if (c.qt != DType::kFloat32) {
    wantf = Tensor::from_vector({static_cast<std::int64_t>(wantf.size())}, wantf)
                .to(c.qt)
                .to_float_vector();
  }
  const double atol = test::naive_atol(c.qt), rtol = test::naive_rtol(c.qt);

  test::expect_close(attention_reference(q, k, v, bias, opt).to_float_vector(), wantf,
                     "attention_reference", atol, rtol);
  test::expect_close(attention_forward(q, k, v, bias, opt).to_float_vector(), wantf,
                     "attention_forward", atol, rtol);
  const AttentionForwardResult fl = attention_forward_lse(q, k, v, bias, opt);
  ASSERT_EQ(fl.out.shape(), (Shape{c.b, c.h, c.i, c.d}));
  ASSERT_EQ(fl.out.dtype(), c.qt);
  test::expect_close(fl.out.to_float_vector(), wantf, "attention_forward_lse out", atol, rtol);
  ASSERT_NO_FATAL_FAILURE(test::expect_lse_near(fl.lse, want_lse));
}

struct ShapeCase {
  std::int64_t b, h, hk, i, j, d;
};

const std::vector<ShapeCase>& shapes() {
  static const std::vector<ShapeCase> s = {
      {1, 1, 1, 1, 1, 1},   {2, 4, 2, 5, 9, 33},   {1, 3, 1, 7, 4, 8},     {2, 2, 2, 0, 5, 4},
      {2, 2, 1, 3, 0, 4},   {1, 4, 4, 33, 70, 80}, {1, 2, 1, 17, 40, 128}, {3, 8, 2, 2, 64, 16},
      {2, 6, 3, 12, 12, 1}, {1, 4, 1, 1, 130, 64}};
  return s;
}

const DType kDtypes[5][2] = {{DType::kFloat32, DType::kFloat32},
                             {DType::kBFloat16, DType::kBFloat16},
                             {DType::kFloat16, DType::kFloat16},
                             {DType::kFloat32, DType::kBFloat16},
                             {DType::kFloat32, DType::kFloat16}};

// Every (q_offset, window, causal, softcap) on every shape, with the mask,
// bias, dtype and strides turning over with the case number.
TEST(AttentionOptions, EveryOptionCombinationMatchesTheNaiveFormula) {
  std::uint32_t seed = 100;
  for (const ShapeCase& sh : shapes()) {
    const std::vector<std::optional<std::int64_t>> offsets = {std::nullopt, -3, 0, sh.j + 2};
    const std::int64_t windows[5][2] = {{-1, -1}, {2, -1}, {-1, 1}, {3, 2}, {0, 0}};
    for (const auto& off : offsets) {
      for (const auto& w : windows) {
        for (bool causal : {false, true}) {
          for (float cap : {0.0f, 1.5f}) {
            DenseCase c = make_case(sh.b, sh.h, sh.hk, sh.i, sh.j, sh.d);
            c.q_offset = off;
            c.left = w[0], c.right = w[1];
            c.causal = causal;
            c.softcap = cap;
            c.mask = static_cast<Mask>(seed % 5);
            c.bias = static_cast<Bias>((seed / 5) % 5);
            c.qt = kDtypes[(seed / 3) % 5][0];
            c.kvt = kDtypes[(seed / 3) % 5][1];
            c.strided = seed % 7 == 0;
            c.seed = seed++;
            check_dense_case(c);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Every (mask, bias, dtype pair, strides) on a grouped-query shape with
// random options.
TEST(AttentionOptions, EveryMaskBiasAndDtypeMatchesTheNaiveFormula) {
  std::mt19937 gen(7);
  std::uint32_t seed = 5000;
  for (int m = 0; m < 5; ++m) {
    for (int bi = 0; bi < 5; ++bi) {
      for (const auto& dt : kDtypes) {
        for (bool strided : {false, true}) {
          DenseCase c =
              make_case(2, 6, 2, 1 + std::int64_t(gen() % 9), 1 + std::int64_t(gen() % 20), 33);
          c.mask = static_cast<Mask>(m);
          c.bias = static_cast<Bias>(bi);
          c.qt = dt[0], c.kvt = dt[1];
          c.strided = strided;
          c.causal = gen() % 2;
          if (gen() % 2) c.q_offset = std::int64_t(gen() % 9) - 4;
          c.left = std::int64_t(gen() % 6) - 1;
          c.right = std::int64_t(gen() % 6) - 1;
          c.softcap = gen() % 2 ? 0.0f : 0.7f;
          c.seed = seed++;
          check_dense_case(c);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// MQA (hk = 1) decode rows and long rows with every option at once.
TEST(AttentionOptions, MultiQueryDecodeAndLongRowsWithAllOptions) {
  std::uint32_t seed = 9000;
  for (std::int64_t i : {1, 4}) {
    for (std::int64_t j : {1, 31, 257}) {
      DenseCase c = make_case(2, 8, 1, i, j, 64);
      c.causal = true;
      c.left = 40;
      c.softcap = 5.0f;
      c.mask = Mask::kRandom;
      c.bias = Bias::kAlibiPerSeq;
      c.seed = seed++;
      check_dense_case(c);
      c.bias = Bias::kTable;
      c.qt = DType::kFloat32, c.kvt = DType::kFloat16;
      c.seed = seed++;
      check_dense_case(c);
    }
  }
}

// A key whose mask is 0 is never read: NaN in its k and v rows does not
// reach any row.
TEST(AttentionOptions, MaskedKeysAreNeverRead) {
  std::vector<float> kd = test::random_tensor({1, 2, 6, 4}, 3).to_float_vector();
  std::vector<float> vd = test::random_tensor({1, 2, 6, 4}, 4).to_float_vector();
  for (std::int64_t x = 0; x < 2; ++x) {
    for (std::int64_t e = 0; e < 4; ++e) {
      kd[static_cast<std::size_t>((x * 6 + 2) * 4 + e)] = std::nanf("");
      vd[static_cast<std::size_t>((x * 6 + 2) * 4 + e)] = std::nanf("");
    }
  }
  const Tensor q = test::random_tensor({1, 2, 3, 4}, 5);
  const Tensor k = Tensor::from_vector({1, 2, 6, 4}, kd), v = Tensor::from_vector({1, 2, 6, 4}, vd);
  AttentionOptions opt;
  opt.key_mask = Tensor::from_vector({1, 6}, {1, 1, 0, 1, 1, 1}).to(DType::kBool);
  for (const Tensor& out :
       {attention_forward(q, k, v, {}, opt), attention_reference(q, k, v, {}, opt)}) {
    for (float x : out.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
  }
}

// ------------------------------------------------------------ bad input

const Tensor& q4() {
  static const Tensor t = test::random_tensor({2, 4, 3, 8}, 1);
  return t;
}
const Tensor& k4() {
  static const Tensor t = test::random_tensor({2, 2, 5, 8}, 2);
  return t;
}

template <typename Fn>
void expect_bad(Fn fn, const std::string& needle) {
  test::expect_throw_with<std::invalid_argument>([&] { fn(); }, needle);
}

TEST(AttentionOptionsErrors, WindowEntryBelowMinusOne) {
  for (const AttentionWindow w : {AttentionWindow{-2, -1}, AttentionWindow{3, -5}}) {
    AttentionOptions opt;
    opt.window = w;
    expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); },
               "{" + std::to_string(w.left) + ", " + std::to_string(w.right) + "}");
    expect_bad([&] { attention_reference(q4(), k4(), k4(), {}, opt); }, "window");
  }
}

TEST(AttentionOptionsErrors, NegativeOrNonFiniteSoftcap) {
  const std::pair<double, const char*> caps[] = {
      {-1.0, "got -1"}, {std::numeric_limits<double>::infinity(), "got inf"}, {NAN, "got nan"}};
  for (const auto& [cap, shown] : caps) {
    AttentionOptions opt;
    opt.softcap = cap;
    expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); }, "softcap");
    expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); }, shown);
  }
}

TEST(AttentionOptionsErrors, KeyMaskOfWrongShapeOrDtype) {
  AttentionOptions opt;
  opt.key_mask = Tensor::full({2, 4}, 1.0f, DType::kBool);  // j is 5
  expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); }, "[2, 4]");
  opt.key_mask = Tensor::full({3, 5}, 1.0f, DType::kUInt8);  // b is 2
  expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); }, "[3, 5]");
  opt.key_mask = Tensor::full({2, 5}, 1.0f, DType::kFloat32);
  expect_bad([&] { attention_forward(q4(), k4(), k4(), {}, opt); }, "float32");
  opt.key_mask = Tensor::full({10}, 1.0f, DType::kBool);
  expect_bad([&] { attention_reference(q4(), k4(), k4(), {}, opt); }, "[10]");
}

TEST(AttentionOptionsErrors, PerSequenceSlopesWithTheWrongBatch) {
  // h = 4, b = 2: 4 or 8 slopes; 12 is [3, h].
  expect_bad(
      [&] {
        attention_forward(q4(), k4(), k4(), AttentionBias::alibi(std::vector<float>(12, 0.1f)));
      },
      "12");
  expect_bad(
      [&] {
        attention_forward(q4(), k4(), k4(), AttentionBias::alibi(std::vector<float>(3, 0.1f)));
      },
      "h = 4");
}

TEST(AttentionOptionsErrors, TableOfEvenLengthOrTooShort) {
  expect_bad(
      [&] {
        attention_forward(q4(), k4(), k4(),
                          AttentionBias::distance_table(Tensor::full({4, 10}, 0.0f)));
      },
      "[4, 10]");
  // i = 3, j = 5, q_offset 2: the longest visible distance is 4 (row 0 to
  // key 4, or row 2 at 4 to key 0): n = 7 (centre 3) is too short.
  expect_bad(
      [&] {
        attention_forward(q4(), k4(), k4(),
                          AttentionBias::distance_table(Tensor::full({4, 7}, 0.0f)));
      },
      "distance 4");
  AttentionOptions far;
  far.q_offset = 100;  // distances up to 102
  expect_bad(
      [&] {
        attention_reference(q4(), k4(), k4(),
                            AttentionBias::distance_table(Tensor::full({4, 9}, 0.0f)), far);
      },
      "distance 102");
}

TEST(AttentionOptionsErrors, MixedDtypes) {
  const Tensor qb = q4().to(DType::kBFloat16), kh = k4().to(DType::kFloat16);
  expect_bad([&] { attention_forward(qb, kh, kh); }, "bfloat16, float16, float16");
  const Tensor kb = k4().to(DType::kBFloat16);
  expect_bad([&] { attention_forward(q4(), kb, kh); }, "float32, bfloat16, float16");
  expect_bad([&] { attention_forward(q4().to(DType::kFloat16), k4(), k4()); }, "float16, float32");
}

}  // namespace
}  // namespace posbias
