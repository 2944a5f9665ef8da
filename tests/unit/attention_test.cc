// Attention with a positional bias: attention_reference against a naive
// double-precision transcription of docs/spec.md, the fused kernel against
// attention_reference over many shapes on every instruction set Highway
// compiled, and NaN containment (the golden vectors and bad input:
// attention_golden_errors_test.cc).
#include "posbias/attention.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention_fused.h"
#include "posbias/slopes.h"
#include "attention_test_util.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_close;
using test::kInf;
using test::random_bhld_strided;
using test::random_tensor;
using test::Shape;

// The tolerance of a result in `dtype`: the float32 one, plus one rounding
// of a 16-bit output.
void expect_attention_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  double rtol = 1e-4;
  if (got.dtype() == DType::kBFloat16) rtol = 1.0 / 128;
  if (got.dtype() == DType::kFloat16) rtol = 1.0 / 1024;
  expect_close(got.to_float_vector(), want.to_float_vector(), what, 1e-5, rtol);
}

// docs/spec.md "Attention with a positional bias", literally, in double: the full
// [i, j] bias matrix per (b, h), masked softmax, product.
std::vector<float> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionBias& bias, const AttentionOptions& opt) {
  const std::int64_t b = q.size(0), h = q.size(1), i = q.size(2), d = q.size(3);
  const std::int64_t hk = k.size(1), j = k.size(2);
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> out(static_cast<std::size_t>(b * h * i * d), 0.0f);
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t kvh = hh / (h / hk);
      for (std::int64_t r = 0; r < i; ++r) {
        const std::int64_t qr = j - i + r;
        std::vector<double> s(static_cast<std::size_t>(j));
        std::vector<bool> visible(static_cast<std::size_t>(j));
        double mx = -INFINITY;
        for (std::int64_t c = 0; c < j; ++c) {
          visible[c] = !opt.causal || c <= qr;
          double dot = 0;
          for (std::int64_t x = 0; x < d; ++x) {
            dot += static_cast<double>(q.at({bb, hh, r, x})) * k.at({bb, kvh, c, x});
          }
          double bias_value = 0;
          switch (bias.kind) {
            case AttentionBiasKind::kNone:
              break;
            case AttentionBiasKind::kAlibi:
              bias_value = -static_cast<double>(bias.slopes[hh]) * std::fabs(double(c - qr));
              break;
            case AttentionBiasKind::kDistanceTable:
              if (visible[c]) bias_value = bias.table.at({hh, (qr - c) + (bias.table.size(1) - 1) / 2});
              break;
            case AttentionBiasKind::kDense: {
              const Tensor& t = bias.dense;
              const Shape full = {bb, hh, r, c};
              Shape idx;
              for (std::int64_t x = 4 - t.dim(); x < 4; ++x) {
                idx.push_back(t.size(x - (4 - t.dim())) == 1 ? 0 : full[x]);
              }
              bias_value = t.at(idx);
              break;
            }
          }
          s[c] = scale * dot + bias_value;
          if (visible[c]) mx = std::max(mx, s[c]);
        }
        if (mx == -INFINITY) continue;  // zeros
        double sum = 0;
        std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
        for (std::int64_t c = 0; c < j; ++c) {
          if (!visible[c]) continue;
          const double p = std::exp(s[c] - mx);
          sum += p;
          for (std::int64_t x = 0; x < d; ++x) acc[x] += p * v.at({bb, kvh, c, x});
        }
        for (std::int64_t x = 0; x < d; ++x) {
          out[static_cast<std::size_t>(((bb * h + hh) * i + r) * d + x)] =
              static_cast<float>(acc[x] / sum);
        }
      }
    }
  }
  return out;
}

struct Case {
  std::int64_t b, h, hk, i, j, d;
  AttentionBiasKind kind;
  bool causal;
  DType dtype = DType::kFloat32;
  bool strided = false;
};

std::string name_of(const Case& c) {
  static const char* kinds[] = {"none", "alibi", "table", "dense"};
  return "b" + std::to_string(c.b) + " h" + std::to_string(c.h) + " hk" + std::to_string(c.hk) +
         " i" + std::to_string(c.i) + " j" + std::to_string(c.j) + " d" + std::to_string(c.d) +
         " " + kinds[static_cast<int>(c.kind)] + (c.causal ? " causal " : " full ") +
         dtype_name(c.dtype) + (c.strided ? " strided" : "");
}

AttentionBias make_bias(const Case& c, std::uint32_t seed) {
  switch (c.kind) {
    case AttentionBiasKind::kNone:
      return AttentionBias::none();
    case AttentionBiasKind::kAlibi:
      return AttentionBias::alibi(alibi_slopes(c.h));
    case AttentionBiasKind::kDistanceTable: {
      // Longer than 2j - 1 (odd: read at its centre (n - 1) / 2), and
      // strided (a transposed [n, h] buffer).
      const std::int64_t n = std::max<std::int64_t>(1, 2 * c.j - 1) + 4;
      return AttentionBias::distance_table(random_tensor({n, c.h}, seed, -2, 2).transpose(0, 1));
    }
    case AttentionBiasKind::kDense: {
      // Broadcast over the batch, with some -inf entries (a padding mask).
      Tensor t = random_tensor({c.h, c.i, c.j}, seed, -2, 2);
      float* p = t.mutable_data<float>();
      for (std::int64_t x = 0; x < t.numel(); x += 7) p[x] = -kInf;
      return AttentionBias::dense_bias(t);
    }
  }
  return AttentionBias::none();
}

struct Inputs {
  Tensor q, k, v;
  AttentionBias bias;
  AttentionOptions opt;
};

Inputs make_inputs(const Case& c, std::uint32_t seed) {
  Inputs in;
  const Shape qs = {c.b, c.h, c.i, c.d}, ks = {c.b, c.hk, c.j, c.d};
  in.q = c.strided ? random_bhld_strided(qs, seed) : random_tensor(qs, seed);
  in.k = c.strided ? random_bhld_strided(ks, seed + 1) : random_tensor(ks, seed + 1);
  in.v = c.strided ? random_bhld_strided(ks, seed + 2) : random_tensor(ks, seed + 2);
  if (c.dtype != DType::kFloat32) {
    in.q = in.q.to(c.dtype);
    in.k = in.k.to(c.dtype);
    in.v = in.v.to(c.dtype);
  }
  in.bias = make_bias(c, seed + 3);
  in.opt.causal = c.causal;
  return in;
}

constexpr AttentionBiasKind kKinds[] = {AttentionBiasKind::kNone, AttentionBiasKind::kAlibi,
                                        AttentionBiasKind::kDistanceTable,
                                        AttentionBiasKind::kDense};

// ------------------------------------------------------------ reference

TEST(AttentionReference, MatchesTheSpecFormula) {
  std::uint32_t seed = 1;
  for (auto [i, j] :
       {std::pair<std::int64_t, std::int64_t>{1, 1}, {1, 5}, {3, 7}, {5, 5}, {6, 2}}) {
    for (AttentionBiasKind kind : kKinds) {
      for (bool causal : {false, true}) {
        if (kind == AttentionBiasKind::kDistanceTable && !causal && i > j) continue;
        const Case c{2, 6, 2, i, j, 5, kind, causal};
        const Inputs in = make_inputs(c, seed += 10);
        const Tensor ref = attention_reference(in.q, in.k, in.v, in.bias, in.opt);
        expect_close(ref.to_float_vector(), naive_attention(in.q, in.k, in.v, in.bias, in.opt),
                     name_of(c), 1e-6, 1e-5);
      }
    }
  }
}

// ------------------------------------------------------- fused vs reference

// Every case on every instruction set Highway compiled, or on the best
// `max_targets` of them (long shapes: the block logic they exercise does not
// depend on the target, and the sanitizer build runs the kernels at -O0).
void check_fused(const std::vector<Case>& cases, int max_targets = 1 << 30) {
  int targets = 0;
  std::uint32_t seed = 100;
  std::vector<Inputs> inputs;
  std::vector<Tensor> refs;
  for (const Case& c : cases) {
    inputs.push_back(make_inputs(c, seed += 10));
    const Inputs& in = inputs.back();
    refs.push_back(attention_reference(in.q, in.k, in.v, in.bias, in.opt));
  }
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (targets == max_targets) break;
    hwy::SetSupportedTargetsForTest(target);
    ++targets;
    for (std::size_t x = 0; x < cases.size(); ++x) {
      const Inputs& in = inputs[x];
      const Tensor got = attention_forward(in.q, in.k, in.v, in.bias, in.opt);
      expect_attention_close(got, refs[x],
                             std::string(hwy::TargetName(target)) + " " + name_of(cases[x]));
      if (::testing::Test::HasFailure()) break;
    }
    if (::testing::Test::HasFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(targets, std::min(max_targets, 2));
}

TEST(AttentionFused, SmallShapesFullCrossProduct) {
  std::vector<Case> cases;
  for (std::int64_t i : {1, 2, 5}) {
    for (std::int64_t j : {1, 2, 5}) {
      for (std::int64_t d : {1, 8}) {
        for (AttentionBiasKind kind : kKinds) {
          for (bool causal : {false, true}) {
            if (kind == AttentionBiasKind::kDistanceTable && !causal && i > j) continue;
            cases.push_back({1, 3, 1, i, j, d, kind, causal});
          }
        }
      }
    }
  }
  check_fused(cases);
}

TEST(AttentionFused, BlockBoundariesHeadsAndGroups) {
  std::vector<Case> cases;
  const std::int64_t ds[] = {64, 80, 128, 8, 1};
  const std::pair<std::int64_t, std::int64_t> heads[] = {{1, 1}, {3, 3}, {8, 2}, {12, 4}};
  int n = 0;
  for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{63, 63},
                      {64, 64},
                      {65, 65},
                      {63, 130},
                      {65, 129},
                      {130, 65},
                      {2, 65}}) {
    for (AttentionBiasKind kind : kKinds) {
      for (bool causal : {false, true}) {
        if (kind == AttentionBiasKind::kDistanceTable && !causal && i > j) continue;
        const auto [h, hk] = heads[n % 4];
        cases.push_back({1 + n % 2, h, hk, i, j, ds[n % 5], kind, causal});
        ++n;
      }
    }
  }
  check_fused(cases);
}

// Lengths of 1000: one test per bias kind (ctest runs them in parallel), on
// the two best instruction sets.
std::vector<Case> long_cases(AttentionBiasKind kind) {
  std::vector<Case> cases;
  for (bool causal : {false, true}) {
    cases.push_back({1, 1, 1, 1000, 1000, 64, kind, causal});
    cases.push_back({1, 4, 2, 1, 1000, 128, kind, causal});  // decode
    cases.push_back({1, 8, 1, 2, 1000, 64, kind, causal});   // multi-query, two rows
    cases.push_back({2, 3, 3, 4, 1000, 80, kind, causal});   // short chunk
    cases.push_back({1, 2, 1, 65, 1000, 64, kind, causal});  // chunked prefill
    if (causal || kind != AttentionBiasKind::kDistanceTable) {
      cases.push_back({1, 1, 1, 1000, 63, 8, kind, causal});  // i > j
    }
  }
  return cases;
}

TEST(AttentionFused, LongSequencesNoBias) { check_fused(long_cases(AttentionBiasKind::kNone), 2); }
TEST(AttentionFused, LongSequencesAlibi) { check_fused(long_cases(AttentionBiasKind::kAlibi), 2); }
TEST(AttentionFused, LongSequencesDistanceTable) {
  check_fused(long_cases(AttentionBiasKind::kDistanceTable), 2);
}
TEST(AttentionFused, LongSequencesDenseBias) {
  check_fused(long_cases(AttentionBiasKind::kDense), 2);
}

TEST(AttentionFused, StridedAnd16BitInputs) {
  std::vector<Case> cases;
  int n = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (AttentionBiasKind kind : kKinds) {
      for (bool causal : {false, true}) {
        cases.push_back({2, 4, 2, 70, 140 - 70 * (n % 2), 64, kind, causal, dtype, true});
        cases.push_back({1, 3, 1, 1, 200, 8, kind, causal, dtype, n % 2 == 0});
        ++n;
      }
    }
  }
  check_fused(cases);
}

// The kernel with explicit (odd, tiny) block sizes and key splits, so that
// every block boundary, the diagonal masking, the shared head packing, the
// direct few-row path and the split merge meet on small shapes.
TEST(AttentionFused, ExplicitBlocksAndSplits) {
  struct Shape5 {
    std::int64_t h, hk, i, j, d;
  };
  std::uint32_t seed = 900;
  // The last shape has key blocks that every row of a tile sees whole: with
  // a block of 8, 16 or 64 keys (two, four or four vectors of SSE4, AVX2 or
  // AVX-512) the score tile does the rows' softmax on its registers.
  for (const Shape5& sh : {Shape5{3, 1, 13, 17, 5}, Shape5{2, 2, 17, 13, 16},
                           Shape5{4, 2, 1, 29, 7}, Shape5{1, 1, 9, 9, 33},
                           Shape5{2, 1, 20, 150, 24}}) {
    for (AttentionBiasKind kind : kKinds) {
      for (bool causal : {false, true}) {
        if (kind == AttentionBiasKind::kDistanceTable && !causal && sh.i > sh.j) continue;
        const Case c{2, sh.h, sh.hk, sh.i, sh.j, sh.d, kind, causal};
        const Inputs in = make_inputs(c, seed += 10);
        const Tensor ref = attention_reference(in.q, in.k, in.v, in.bias, in.opt);
        detail::AttentionParams p;
        p.q = in.q.raw_data();
        p.k = in.k.raw_data();
        p.v = in.v.raw_data();
        for (int x = 0; x < 4; ++x) {
          p.q_stride[x] = in.q.strides()[x];
          p.k_stride[x] = in.k.strides()[x];
          p.v_stride[x] = in.v.strides()[x];
        }
        p.b = c.b, p.h = c.h, p.hk = c.hk, p.i = c.i, p.j = c.j, p.d = c.d;
        const std::int64_t out_stride[4] = {c.h * c.i * c.d, c.i * c.d, c.d, 1};
        std::copy_n(out_stride, 4, p.out_stride);
        p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
        p.causal = causal;
        p.q_offset = c.j - c.i;
        std::vector<float> rtable;
        std::vector<float> dense;
        switch (kind) {
          case AttentionBiasKind::kNone:
            break;
          case AttentionBiasKind::kAlibi:
            p.bias = detail::FusedBias::kAlibi;
            p.slopes = in.bias.slopes.data();
            break;
          case AttentionBiasKind::kDistanceTable: {
            p.bias = detail::FusedBias::kTable;
            const std::int64_t centre = (in.bias.table.size(1) - 1) / 2;  // the user's
            p.rtable_stride = 2 * c.j - 1 + 64;
            rtable.assign(static_cast<std::size_t>(c.h * p.rtable_stride), 0.0f);
            for (std::int64_t hh = 0; hh < c.h; ++hh) {
              for (std::int64_t e = 0; e < 2 * c.j - 1; ++e) {
                rtable[hh * p.rtable_stride + e] = in.bias.table.at({hh, centre + (c.j - 1) - e});
              }
            }
            p.rtable = rtable.data();
            p.table_centre = c.j - 1;
            break;
          }
          case AttentionBiasKind::kDense:
            p.bias = detail::FusedBias::kDense;
            dense = in.bias.dense.to_float_vector();  // [h, i, j]
            p.dense = dense.data();
            p.dense_stride[1] = c.i * c.j;
            p.dense_stride[2] = c.j;
            p.dense_stride[3] = 1;
            break;
        }
        Tensor out = Tensor::empty({c.b, c.h, c.i, c.d}, DType::kFloat32);
        p.out = out.raw_mutable_data();
        for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
          hwy::SetSupportedTargetsForTest(target);
          for (auto [bq, bk, splits] : {std::tuple<int, int, int>{3, 5, 1},
                                        {1, 4, 3},
                                        {5, 3, 2},
                                        {4, 16, 1},
                                        {64, 2, 4},
                                        {2, 1, 7},
                                        {6, 8, 1},
                                        {7, 16, 2},
                                        {13, 64, 1}}) {
            detail::fused_attention_blocked(p, bq, bk, splits);
            expect_attention_close(out, ref,
                                   std::string(hwy::TargetName(target)) + " " + name_of(c) + " bq" +
                                       std::to_string(bq) + " bk" + std::to_string(bk) + " splits" +
                                       std::to_string(splits));
            if (::testing::Test::HasFailure()) {
              hwy::SetSupportedTargetsForTest(0);
              return;
            }
          }
        }
        hwy::SetSupportedTargetsForTest(0);
      }
    }
  }
}

// The fused kernel against the naive transcription of docs/spec.md directly (not
// through attention_reference, which shares the argument checks and the
// dense-bias broadcast strides with the kernel), on the best instruction set:
// grouped-query decode (one task reads a kv head for several query heads),
// 16-bit inputs, and dense biases in every broadcast form.
TEST(AttentionFused, MatchesTheNaiveFormulaDirectly) {
  std::vector<Case> cases;
  for (AttentionBiasKind kind : kKinds) {
    for (bool causal : {false, true}) {
      cases.push_back({1, 16, 2, 1, 300, 128, kind, causal});  // GQA decode, 8 heads per kv head
      cases.push_back({1, 40, 1, 3, 200, 64, kind, causal});   // MQA, 3 rows: 10 heads per task
      cases.push_back({2, 6, 3, 2, 150, 80, kind, causal, DType::kBFloat16, true});
      cases.push_back({1, 4, 2, 4, 130, 24, kind, causal, DType::kFloat16});
      cases.push_back({1, 3, 1, 100, 100, 32, kind, causal, DType::kFloat32, true});
    }
  }
  const int saved = omp_get_max_threads();
  std::uint32_t seed = 5000;
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, seed += 10);
    const std::vector<float> want = naive_attention(in.q, in.k, in.v, in.bias, in.opt);
    // The naive result is float32 from double: the float32 tolerance, plus
    // one rounding of a 16-bit output.
    double rtol = 1e-4;
    if (c.dtype == DType::kBFloat16) rtol = 1.0 / 128;
    if (c.dtype == DType::kFloat16) rtol = 1.0 / 1024;
    for (int threads : {1, 4}) {  // 4: decode splits the keys and merges the states
      omp_set_num_threads(threads);
      const Tensor got = attention_forward(in.q, in.k, in.v, in.bias, in.opt);
      expect_close(got.to_float_vector(), want, name_of(c) + " threads " + std::to_string(threads),
                   1e-5, rtol);
    }
    if (::testing::Test::HasFailure()) break;
  }
  omp_set_num_threads(saved);
}

// Dense biases in the shapes users pass: a key-padding mask [b, 1, 1, j], a
// per-row [1, h, i, 1], [i, 1], [j], a scalar, [h, 1, j], and a transposed
// (strided) [h, i, j]; each against the naive formula and the plain path.
TEST(AttentionFused, DenseBiasBroadcastsLikePyTorch) {
  const std::int64_t b = 2, h = 4, hk = 2, d = 16;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::uint32_t seed = 7000;
  for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{1, 90}, {3, 70}, {70, 70}, {9, 130}}) {
    for (bool causal : {false, true}) {
      const Inputs in =
          make_inputs({b, h, hk, i, j, d, AttentionBiasKind::kNone, causal}, seed += 10);
      Tensor padding = random_tensor({b, 1, 1, j}, seed + 1, -1, 1);
      for (std::int64_t x = 0; x < j; x += 5) padding.mutable_data<float>()[x] = -kInf;  // batch 0
      const std::vector<std::pair<std::string, Tensor>> biases = {
          {"[b, 1, 1, j] padding", padding},
          {"[1, h, i, 1]", random_tensor({1, h, i, 1}, seed + 2, -2, 2)},
          {"[i, 1]", random_tensor({i, 1}, seed + 3, -2, 2)},
          {"[j]", random_tensor({j}, seed + 4, -2, 2)},
          {"[1]", random_tensor({1}, seed + 5, -2, 2)},
          {"[h, 1, j]", random_tensor({h, 1, j}, seed + 6, -2, 2)},
          {"[h, i, j] transposed", random_tensor({h, j, i}, seed + 7, -2, 2).transpose(1, 2)}};
      for (const auto& [name, dense] : biases) {
        const AttentionBias bias = AttentionBias::dense_bias(dense);
        const std::string what = name + " i " + std::to_string(i) + " j " + std::to_string(j) +
                                 (causal ? " causal" : " full");
        const Tensor got = attention_forward(in.q, in.k, in.v, bias, in.opt);
        expect_close(got.to_float_vector(), naive_attention(in.q, in.k, in.v, bias, in.opt), what,
                     1e-5, 1e-4);
        expect_attention_close(got, attention_reference(in.q, in.k, in.v, bias, in.opt),
                               what + " vs reference");
        if (::testing::Test::HasFailure()) break;
      }
    }
  }
  omp_set_num_threads(saved);
}

// attention.h: block sizes and the key split follow the thread count, so
// results may differ in the last bits between thread counts (each within
// the tolerance), and for a given thread count they are deterministic.
TEST(AttentionFused, EveryThreadCountAgreesAndRepeatsBitForBit) {
  // Few (b, h, query block) tasks: the keys are split across threads.
  const Case c{1, 1, 1, 3, 3000, 64, AttentionBiasKind::kAlibi, true};
  const Inputs in = make_inputs(c, 7);
  const Tensor ref = attention_reference(in.q, in.k, in.v, in.bias, in.opt);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    const Tensor first = attention_forward(in.q, in.k, in.v, in.bias, in.opt);
    expect_attention_close(first, ref, "threads " + std::to_string(threads));
    for (int again = 0; again < 3; ++again) {
      EXPECT_EQ(attention_forward(in.q, in.k, in.v, in.bias, in.opt).to_float_vector(),
                first.to_float_vector())
          << "threads " << threads << ", call " << again + 2;
    }
  }
  omp_set_num_threads(saved);
}

TEST(AttentionFused, RowsThatSeeNoKeyAreZero) {
  const Case c{1, 2, 1, 6, 3, 4, AttentionBiasKind::kAlibi, true};
  const Inputs in = make_inputs(c, 3);
  const std::vector<float> out =
      attention_forward(in.q, in.k, in.v, in.bias, in.opt).to_float_vector();
  for (std::int64_t hh = 0; hh < 2; ++hh) {
    for (std::int64_t r = 0; r < 3; ++r) {  // q_r = r - 3 < 0
      for (std::int64_t x = 0; x < 4; ++x) EXPECT_EQ(out[(hh * 6 + r) * 4 + x], 0.0f);
    }
  }
  // A dense bias of -inf everywhere masks every key too.
  const Tensor all_masked = Tensor::full({1, 1}, -kInf);
  for (float x : attention_forward(in.q, in.k, in.v, AttentionBias::dense_bias(all_masked))
                     .to_float_vector()) {
    EXPECT_EQ(x, 0.0f);
  }
  // Empty key set.
  const Tensor k0 = Tensor::empty({1, 1, 0, 4}, DType::kFloat32);
  for (float x : attention_forward(in.q, k0, k0).to_float_vector()) EXPECT_EQ(x, 0.0f);
}

TEST(AttentionFused, NaNStaysInTheRowsItTouches) {
  const std::int64_t i = 70, j = 70, d = 16;
  Tensor q = random_tensor({1, 1, i, d}, 1);
  Tensor k = random_tensor({1, 1, j, d}, 2);
  Tensor v = random_tensor({1, 1, j, d}, 3);
  q.mutable_data<float>()[5 * d + 3] = NAN;   // query row 5
  v.mutable_data<float>()[40 * d + 1] = NAN;  // value of key 40: causal rows >= 40
  AttentionOptions opt;
  opt.causal = true;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::vector<float> out =
        attention_forward(q, k, v, AttentionBias::alibi({0.5f}), opt).to_float_vector();
    for (std::int64_t r = 0; r < i; ++r) {
      bool any_nan = false;
      for (std::int64_t x = 0; x < d; ++x) any_nan |= std::isnan(out[r * d + x]);
      EXPECT_EQ(any_nan, r == 5 || r >= 40) << hwy::TargetName(target) << " row " << r;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  // Decode with the keys split across threads: a NaN query stays NaN.
  Tensor q1 = random_tensor({1, 1, 2, d}, 4);
  q1.mutable_data<float>()[d + 2] = NAN;  // row 1 only
  const Tensor k1 = random_tensor({1, 1, 3000, d}, 5);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);
  const std::vector<float> out1 = attention_forward(q1, k1, k1).to_float_vector();
  omp_set_num_threads(saved);
  for (std::int64_t x = 0; x < d; ++x) {
    EXPECT_FALSE(std::isnan(out1[x]));
    EXPECT_TRUE(std::isnan(out1[d + x]));
  }
}

// A NaN score among finite ones (a NaN in one key, one dense-bias or table
// entry, or +inf - +inf from a +inf bias) reaches exactly the rows that see
// it. Highway's Exp maps NaN to 0, which used to drop such a score whenever
// the row's max was finite (the rows came out finite, the reference NaN).
TEST(AttentionFused, NaNInOneKeyOrBiasEntryReachesTheRowsThatSeeIt) {
  const std::int64_t d = 8;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);  // decode: the keys are split, the states merged
  struct Len {
    std::int64_t i, j;
  };
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    // i = 1 and 3: the direct few-row path (split across threads); 5 and 70:
    // the packed block path.
    for (const Len len : {Len{1, 300}, Len{3, 200}, Len{5, 90}, Len{70, 70}}) {
      for (bool causal : {false, true}) {
        const std::int64_t i = len.i, j = len.j;
        const std::int64_t c = j - 1 - i / 2;  // seen by the last rows only when causal
        const std::int64_t r0 = i - 1 - i / 3;
        AttentionOptions opt;
        opt.causal = causal;
        const Tensor q = random_tensor({1, 2, i, d}, 21);
        const Tensor v = random_tensor({1, 1, j, d}, 22);
        Tensor k = random_tensor({1, 1, j, d}, 23);
        k.mutable_data<float>()[c * d + 3] = NAN;
        Tensor dense = random_tensor({1, 2, i, j}, 24);
        dense.mutable_data<float>()[(i + r0) * j + 7] = NAN;  // head 1, row r0, key 7
        Tensor inf_dense = random_tensor({i, j}, 25);
        inf_dense.mutable_data<float>()[r0 * j + 7] = kInf;  // row r0 of both heads
        Tensor table = random_tensor({2, 2 * j - 1}, 26);
        table.mutable_data<float>()[j - 1 + 1] = NAN;  // head 0, q_r - c = 1
        const Tensor k_ok = random_tensor({1, 1, j, d}, 23);
        const std::string what = std::string(hwy::TargetName(target)) + " i " + std::to_string(i) +
                                 " j " + std::to_string(j) + (causal ? " causal" : " full");
        const std::vector<std::pair<std::string, Tensor>> runs = {
            {"NaN key", attention_forward(q, k, v, AttentionBias::none(), opt)},
            {"NaN dense", attention_forward(q, k_ok, v, AttentionBias::dense_bias(dense), opt)},
            {"+inf dense",
             attention_forward(q, k_ok, v, AttentionBias::dense_bias(inf_dense), opt)},
            {"NaN table",
             attention_forward(q, k_ok, v, AttentionBias::distance_table(table), opt)}};
        const std::vector<Tensor> refs = {
            attention_reference(q, k, v, AttentionBias::none(), opt),
            attention_reference(q, k_ok, v, AttentionBias::dense_bias(dense), opt),
            attention_reference(q, k_ok, v, AttentionBias::dense_bias(inf_dense), opt),
            attention_reference(q, k_ok, v, AttentionBias::distance_table(table), opt)};
        for (std::size_t x = 0; x < runs.size(); ++x) {
          expect_attention_close(runs[x].second, refs[x], what + " " + runs[x].first);
        }
        // The NaN key, spelled out: row r sees key c iff not causal or c <= j - i + r.
        const std::vector<float> out = runs[0].second.to_float_vector();
        for (std::int64_t r = 0; r < 2 * i; ++r) {
          const bool sees = !causal || c <= j - i + r % i;
          EXPECT_EQ(std::isnan(out[r * d]), sees) << what << " NaN key, row " << r;
        }
        if (::testing::Test::HasFailure()) break;
      }
    }
    if (::testing::Test::HasFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
  omp_set_num_threads(saved);
}

TEST(AttentionFused, ExplicitScaleAndLongAlibiDistances) {
  // Large slope * distance: the per-element distance form keeps float32
  // accuracy where "+slope * c" would round the scores.
  const Case c{1, 2, 2, 2, 20000, 16, AttentionBiasKind::kAlibi, true};
  Inputs in = make_inputs(c, 11);
  in.bias = AttentionBias::alibi({0.5f, 0.001f});
  in.opt.scale = 0.3f;
  expect_attention_close(attention_forward(in.q, in.k, in.v, in.bias, in.opt),
                         attention_reference(in.q, in.k, in.v, in.bias, in.opt), "long alibi");
  // Non-causal, i > j: the first rows sit up to 1935 positions before the
  // first key (bias around -slope * 1935 on every key).
  const Case far{1, 2, 2, 2000, 65, 16, AttentionBiasKind::kAlibi, false};
  Inputs fin = make_inputs(far, 12);
  fin.bias = AttentionBias::alibi({0.5f, 0.25f});
  expect_attention_close(attention_forward(fin.q, fin.k, fin.v, fin.bias, fin.opt),
                         attention_reference(fin.q, fin.k, fin.v, fin.bias, fin.opt),
                         "alibi rows before the first key");
}

}  // namespace
}  // namespace posbias
