// T5 relative position bias: the bucket function against the golden vectors
// (PyTorch) and its defining properties, the module's forward against a naive
// triple loop (bitwise, every dtype, many shapes), the distance table against
// forward, initialisation, state dicts and bad arguments.
#include "posbias/t5.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/toeplitz.h"
#include "posbias/safetensors.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;
using test::golden_dir;
using test::round_to;

namespace fs = std::filesystem;

std::string golden_json_path() {
  for (const char* dir : {POSBIAS_GOLDEN_COPY_DIR, POSBIAS_GOLDEN_SHARED_DIR}) {
    const fs::path p = fs::path(dir) / "golden.json";
    if (fs::exists(p)) return p.string();
  }
  return "";
}

// x-transformers' _relative_position_bucket, transcribed line by line for
// one value (float32 tensor arithmetic, Python scalars as float32).
std::int64_t reference_bucket(std::int64_t relative_position, bool causal, std::int64_t num_buckets,
                              std::int64_t max_distance) {
  std::int64_t ret = 0;
  std::int64_t n = -relative_position;
  if (!causal) {
    num_buckets /= 2;
    ret += (n < 0 ? 1 : 0) * num_buckets;
    n = std::llabs(n);
  } else {
    n = std::max<std::int64_t>(n, 0);
  }
  const std::int64_t max_exact = num_buckets / 2;
  const bool is_small = n < max_exact;
  if (is_small) return ret + n;
  const float log_ratio = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  std::int64_t val_if_large =
      max_exact +
      static_cast<std::int64_t>(std::log(static_cast<float>(n) / static_cast<float>(max_exact)) /
                                log_ratio * static_cast<float>(num_buckets - max_exact));
  val_if_large = std::min(val_if_large, num_buckets - 1);
  return ret + val_if_large;
}

// Straight from docs/spec.md: q_r = j - i + r, bias = E[bucket(c - q_r)][h] * scale.
std::vector<float> naive_forward(const RelativePositionBias& m, std::int64_t i, std::int64_t j,
                                 DType dtype) {
  const std::vector<float> e = m.embedding().to_float_vector();
  std::vector<float> out;
  for (std::int64_t h = 0; h < m.heads(); ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        const std::int64_t q = j - i + r;
        const std::int64_t b =
            reference_bucket(c - q, m.causal(), m.num_buckets(), m.max_distance());
        out.push_back(round_to(dtype, e[static_cast<std::size_t>(b * m.heads() + h)] * m.scale()));
      }
    }
  }
  return out;
}

struct Config {
  bool causal;
  std::int64_t num_buckets, max_distance;
};

const std::vector<Config>& configs() {
  static const std::vector<Config> c = {
      {false, 32, 128}, {true, 32, 128}, {false, 16, 64}, {true, 8, 20},
      {false, 4, 2},    {true, 2, 2},    {false, 33, 50}, {true, 64, 1000},
  };
  return c;
}

std::string describe(const Config& c) {
  return std::string(c.causal ? "causal" : "two-sided") + " nb" + std::to_string(c.num_buckets) +
         " md" + std::to_string(c.max_distance);
}

// ------------------------------------------------------------------ buckets

TEST(T5Bucket, GoldenCasesMatchExactly) {
  const std::string path = golden_json_path();
  if (path.empty()) GTEST_SKIP() << "golden.json not found";
  std::ifstream in(path);
  const nlohmann::json golden = nlohmann::json::parse(in);
  int cases = 0;
  int values = 0;
  for (const auto& c : golden.at("cases")) {
    if (c.at("kind") != "t5_bucket") continue;
    ++cases;
    const bool causal = c.at("causal").get<bool>();
    const auto nb = c.at("num_buckets").get<std::int64_t>();
    const auto md = c.at("max_distance").get<std::int64_t>();
    const auto rel = c.at("rel").get<std::vector<std::int64_t>>();
    const auto buckets = c.at("buckets").get<std::vector<std::int64_t>>();
    ASSERT_EQ(rel.size(), buckets.size());
    for (std::size_t k = 0; k < rel.size(); ++k) {
      ++values;
      EXPECT_EQ(t5_relative_position_bucket(rel[k], causal, nb, md), buckets[k])
          << "case " << cases << " (causal " << causal << ", num_buckets " << nb
          << ", max_distance " << md << "): rel " << rel[k];
    }
  }
  EXPECT_GE(cases, 3);
  EXPECT_GE(values, 90);
}

TEST(T5Bucket, EqualsTheTranscribedReference) {
  for (const Config& c : configs()) {
    for (std::int64_t rel = -3000; rel <= 3000; ++rel) {
      ASSERT_EQ(t5_relative_position_bucket(rel, c.causal, c.num_buckets, c.max_distance),
                reference_bucket(rel, c.causal, c.num_buckets, c.max_distance))
          << describe(c) << " rel " << rel;
    }
  }
}

TEST(T5Bucket, Properties) {
  for (const Config& c : configs()) {
    const std::int64_t nb = c.causal ? c.num_buckets : c.num_buckets / 2;
    const std::int64_t max_exact = nb / 2;
    const auto bucket = [&](std::int64_t rel) {
      return t5_relative_position_bucket(rel, c.causal, c.num_buckets, c.max_distance);
    };
    // Each direction: exact below max_exact, non-decreasing in |rel|, and
    // the direction's last bucket from max_distance on.
    for (int side : {-1, 1}) {
      if (c.causal && side == 1) continue;
      const std::int64_t base = side == 1 ? nb : 0;  // future keys, two-sided
      std::int64_t previous = -1;
      for (std::int64_t d = 0; d <= 4 * c.max_distance + 10; ++d) {
        const std::int64_t b = bucket(side * d);
        if (d == 0) {
          EXPECT_EQ(b, 0) << describe(c);
          continue;
        }
        if (d < max_exact) {
          EXPECT_EQ(b, base + d) << describe(c) << " d " << d;
        }
        EXPECT_GE(b, previous) << describe(c) << " side " << side << " d " << d;
        EXPECT_GE(b, base) << describe(c);
        EXPECT_LT(b, base + nb) << describe(c);
        if (d >= c.max_distance) {
          EXPECT_EQ(b, base + nb - 1) << describe(c) << " d " << d;
        }
        previous = b;
      }
    }
    if (c.causal) {
      for (std::int64_t rel : {1, 2, 7, 1000, 1 << 30}) EXPECT_EQ(bucket(rel), 0) << describe(c);
    }
    // Every int64, including the extremes.
    const std::int64_t lo = std::numeric_limits<std::int64_t>::min();
    const std::int64_t hi = std::numeric_limits<std::int64_t>::max();
    EXPECT_EQ(bucket(lo), nb - 1) << describe(c);
    EXPECT_EQ(bucket(hi), c.causal ? 0 : 2 * nb - 1) << describe(c);
  }
  // The SPEC example configuration.
  EXPECT_EQ(t5_relative_position_bucket(-7, false), 7);
  EXPECT_EQ(t5_relative_position_bucket(7, false), 23);
  EXPECT_EQ(t5_relative_position_bucket(-128, true), 31);
}

TEST(T5Bucket, BadArgumentsNameTheValues) {
  const auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_NE(message([] { t5_relative_position_bucket(0, true, 1, 10); }).find("got 1"),
            std::string::npos);
  EXPECT_NE(message([] { t5_relative_position_bucket(0, false, 3, 10); }).find(">= 4"),
            std::string::npos);
  EXPECT_NE(message([] {
              t5_relative_position_bucket(0, false, 32, 8);
            }).find("max_distance must be > max_exact = 8"),
            std::string::npos);
  EXPECT_NE(message([] { t5_relative_position_bucket(0, true, 32, 16); }).find("got 16"),
            std::string::npos);
  EXPECT_NO_THROW(t5_relative_position_bucket(0, true, 32, 17));
  EXPECT_NO_THROW(t5_relative_position_bucket(0, true, 2, 2));
  EXPECT_THROW(t5_relative_position_bucket(0, true, 2, 1), std::invalid_argument);
}

// ------------------------------------------------------------------- module

TEST(RelativePositionBias, ForwardMatchesNaiveReferenceBitwise) {
  int checked = 0;
  for (const Config& c : configs()) {
    for (std::int64_t heads : {1, 3, 8}) {
      const RelativePositionBias m(0.125f * static_cast<float>(heads), c.causal, c.num_buckets,
                                   c.max_distance, heads,
                                   /*seed=*/static_cast<std::uint64_t>(heads));
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        for (auto [i, j] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0},
                                                                              {0, 5},
                                                                              {5, 0},
                                                                              {1, 1},
                                                                              {1, 9},
                                                                              {1, 300},
                                                                              {4, 4},
                                                                              {7, 3},
                                                                              {3, 70},
                                                                              {33, 33},
                                                                              {16, 129},
                                                                              {50, 10},
                                                                              {130, 131}}) {
          const Tensor t = m.forward(i, j, dtype);
          ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{heads, i, j}));
          ASSERT_EQ(t.dtype(), dtype);
          ASSERT_TRUE(t.is_contiguous());
          expect_bits_equal(t.to_float_vector(), naive_forward(m, i, j, dtype),
                            describe(c) + " h" + std::to_string(heads) + " " + dtype_name(dtype) +
                                " i" + std::to_string(i) + " j" + std::to_string(j));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 8 * 3 * 3 * 13);
}

// Large enough for the streaming, multi-threaded expansion.
TEST(RelativePositionBias, LargeOutputIsExact) {
  const RelativePositionBias m(1.0f, false, 32, 128, 8, 7);
  const std::int64_t i = 1024;
  const std::int64_t j = 1025;  // 33.6 MB of float32, past the 32 MiB streaming threshold
  expect_bits_equal(m.forward(i, j).to_float_vector(), naive_forward(m, i, j, DType::kFloat32),
                    "large");
}

// Outputs with few columns or few rows, whose whole table (i + j - 1 values
// per head) would be about as large as the output, are written tile by tile
// (kernels/toeplitz.h, kTableTile rows or columns at a time): still exact,
// across tile boundaries, for every dtype, and threaded (omp threads > 1).
TEST(RelativePositionBias, TallAndWideOutputsAreWrittenInExactTiles) {
  const std::int64_t tile = detail::kTableTile;
  const RelativePositionBias m(0.75f, false, 32, 128, 3, 5);
  const RelativePositionBias causal(1.0f, true, 16, 64, 2, 6);
  for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{2 * tile + 5, 1},
                      {2 * tile + 5, 3},
                      {1, 2 * tile + 7},
                      {3, tile + 1}}) {
    ASSERT_FALSE(detail::whole_table_is_small(i, j, DType::kFloat32)) << i << " x " << j;
    for (const RelativePositionBias* mod : {&m, &causal}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        expect_bits_equal(mod->forward(i, j, dtype).to_float_vector(),
                          naive_forward(*mod, i, j, dtype),
                          dtype_name(dtype) + " i" + std::to_string(i) + " j" + std::to_string(j));
      }
    }
  }
}

TEST(RelativePositionBias, DistanceTableAgreesWithForward) {
  for (const Config& c : configs()) {
    const RelativePositionBias m(0.5f, c.causal, c.num_buckets, c.max_distance, 5, 11);
    for (std::int64_t j : {1, 2, 9, 64, 300}) {
      const Tensor table = m.distance_table(j);
      ASSERT_EQ(table.shape(), (std::vector<std::int64_t>{5, 2 * j - 1}));
      ASSERT_EQ(table.dtype(), DType::kFloat32);
      for (std::int64_t i : {j, std::int64_t{1}, (j + 1) / 2}) {
        const Tensor bias = m.forward(i, j);
        for (std::int64_t h = 0; h < 5; ++h) {
          for (std::int64_t r = 0; r < i; ++r) {
            for (std::int64_t col = 0; col < j; ++col) {
              const std::int64_t q = j - i + r;
              ASSERT_EQ(float_bits(bias.at({h, r, col})),
                        float_bits(table.at({h, (q - col) + (j - 1)})))
                  << describe(c) << " j" << j << " i" << i << " h" << h << " r" << r << " c" << col;
            }
          }
        }
      }
      // Entry k is the bucket of rel = (j - 1) - k.
      const std::vector<float> e = m.embedding().to_float_vector();
      for (std::int64_t k = 0; k < 2 * j - 1; ++k) {
        const std::int64_t b =
            t5_relative_position_bucket((j - 1) - k, c.causal, c.num_buckets, c.max_distance);
        ASSERT_EQ(float_bits(table.at({2, k})), float_bits(e[b * 5 + 2] * 0.5f));
      }
    }
  }
}

// The embedding gradient against a naive loop: every table entry k adds
// grad[h][k] * scale to its bucket's row (double here, float32 in the core).
TEST(RelativePositionBias, BackwardDistanceTableIsTheNaiveScatterAdd) {
  for (const Config& c : configs()) {
    const float scale = 0.75f;
    const std::int64_t heads = 3;
    const RelativePositionBias m(scale, c.causal, c.num_buckets, c.max_distance, heads, 5);
    for (std::int64_t j : {1, 2, 9, 64, 300}) {
      const std::int64_t len = 2 * j - 1;
      // A strided gradient: every other column of [heads, 2 len].
      std::vector<float> wide(static_cast<std::size_t>(heads * 2 * len));
      for (std::size_t e = 0; e < wide.size(); ++e) {
        wide[e] = std::sin(0.37f * static_cast<float>(e)) + 0.25f;
      }
      Tensor base = Tensor::from_vector({heads, 2 * len}, wide);
      const Tensor grad = Tensor::from_blob(base.raw_mutable_data(), {heads, len}, {2 * len, 2},
                                            DType::kFloat32, nullptr);
      std::vector<double> want(static_cast<std::size_t>(c.num_buckets * heads), 0.0);
      for (std::int64_t k = 0; k < len; ++k) {
        const std::int64_t b =
            t5_relative_position_bucket((j - 1) - k, c.causal, c.num_buckets, c.max_distance);
        for (std::int64_t h = 0; h < heads; ++h) {
          want[static_cast<std::size_t>(b * heads + h)] +=
              static_cast<double>(grad.at({h, k})) * scale;
        }
      }
      const Tensor got = m.backward_distance_table(j, grad);
      ASSERT_EQ(got.shape(), (std::vector<std::int64_t>{c.num_buckets, heads}));
      ASSERT_EQ(got.dtype(), DType::kFloat32);
      const std::vector<float> g = got.to_float_vector();
      for (std::size_t e = 0; e < g.size(); ++e) {
        EXPECT_NEAR(g[e], want[e], 1e-5 * (1.0 + static_cast<double>(len)))
            << describe(c) << " j" << j << " entry " << e;
      }
      // bfloat16 gradients are widened first: the same sums of their values.
      const Tensor g16 = grad.to(DType::kBFloat16);
      const std::vector<float> from16 = m.backward_distance_table(j, g16).to_float_vector();
      const std::vector<float> direct =
          m.backward_distance_table(j, g16.to(DType::kFloat32)).to_float_vector();
      expect_bits_equal(from16, direct, describe(c) + " bfloat16 j" + std::to_string(j));
    }
  }
  const RelativePositionBias m(1.0f);
  expect_throw_with<std::invalid_argument>(
      [&] {
        m.backward_distance_table(0, Tensor::full({8, 1}, 0.0f));
      },
      "j must be >= 1, got 0");
  expect_throw_with<std::invalid_argument>(
      [&] {
        m.backward_distance_table(3, Tensor::full({8, 4}, 0.0f));
      },
      "grad has shape [8, 4], expected [8, 5]");
}

TEST(RelativePositionBias, CausalFutureKeysShareBucketZero) {
  const RelativePositionBias m(1.0f, true, 32, 128, 2, 3);
  const Tensor bias = m.forward(4, 10);  // q_r = 6 + r
  for (std::int64_t h = 0; h < 2; ++h) {
    const float bucket0 = m.embedding().at({0, h});
    for (std::int64_t r = 0; r < 4; ++r) {
      for (std::int64_t c = 6 + r; c < 10; ++c) EXPECT_EQ(bias.at({h, r, c}), bucket0);
    }
  }
}

TEST(RelativePositionBias, InitialisationIsSeededStandardNormal) {
  const RelativePositionBias a(1.0f, false, 512, 1024, 64, 42);
  const RelativePositionBias b(1.0f, false, 512, 1024, 64, 42);
  const RelativePositionBias other(1.0f, false, 512, 1024, 64, 43);
  const std::vector<float> ea = a.embedding().to_float_vector();
  EXPECT_EQ(ea, b.embedding().to_float_vector());
  EXPECT_NE(ea, other.embedding().to_float_vector());
  ASSERT_EQ(a.embedding().shape(), (std::vector<std::int64_t>{512, 64}));
  ASSERT_EQ(a.embedding().dtype(), DType::kFloat32);
  double sum = 0.0;
  double sum_sq = 0.0;
  int beyond_3sigma = 0;
  for (float v : ea) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    if (std::fabs(v) > 3.0f) ++beyond_3sigma;
  }
  const double n = static_cast<double>(ea.size());
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.04);
  EXPECT_NEAR(beyond_3sigma / n, 0.0027, 0.0012);  // two-sided 3-sigma tail
  // The stream is pinned (mt19937_64 + Box-Muller): the same numbers on every
  // platform, up to the last bit of libm's log/sin/cos.
  const RelativePositionBias pinned(1.0f, true, 2, 2, 2, 0);
  const std::vector<float> p = pinned.embedding().to_float_vector();
  const std::vector<float> expect = {1.91280448f, -0.0944795609f, -2.07940793f, -1.46132815f};
  for (std::size_t k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(p[k], expect[k]) << k;
}

TEST(RelativePositionBias, StateDictRoundTripAndStrictLoad) {
  RelativePositionBias m(2.0f, false, 16, 64, 4, 1);
  const TensorMap sd = m.state_dict();
  ASSERT_EQ(sd.size(), 1u);
  ASSERT_TRUE(sd.count("relative_attention_bias.weight"));
  EXPECT_EQ(sd.at("relative_attention_bias.weight").shape(), (std::vector<std::int64_t>{16, 4}));
  EXPECT_TRUE(sd.at("relative_attention_bias.weight").shares_storage_with(m.embedding()));

  // Through a safetensors file, into a module with another seed.
  const std::string path = ::testing::TempDir() + "posbias_t5_state.safetensors";
  save_safetensors(path, sd);
  RelativePositionBias n(2.0f, false, 16, 64, 4, 99);
  n.load_state_dict(load_safetensors(path));
  std::remove(path.c_str());
  expect_bits_equal(n.forward(9, 12).to_float_vector(), m.forward(9, 12).to_float_vector(),
                    "loaded");

  // 16-bit weights load, converted exactly.
  TensorMap half = {
      {"relative_attention_bias.weight", Tensor::full({16, 4}, 0.5f, DType::kBFloat16)}};
  n.load_state_dict(half);
  EXPECT_EQ(n.embedding().dtype(), DType::kFloat32);
  EXPECT_EQ(n.forward(1, 1).at({3, 0, 0}), 1.0f);

  // Every rejection names the problem and changes nothing.
  const std::vector<float> before = m.embedding().to_float_vector();
  Tensor nan_weight = Tensor::full({16, 4}, 0.0f);
  nan_weight.mutable_data<float>()[4 * 5 + 2] = std::nanf("");
  Tensor inf_weight = Tensor::full({16, 4}, 0.0f);
  inf_weight.mutable_data<float>()[63] = -INFINITY;
  const struct {
    TensorMap state;
    std::string part;
  } bad[] = {
      {{}, "missing \"relative_attention_bias.weight\""},
      {{{"weight", Tensor::full({16, 4}, 0.0f)}}, "got \"weight\""},
      {{{"relative_attention_bias.weight", Tensor::full({16, 4}, 0.0f)},
        {"extra", Tensor::full({1}, 0.0f)}},
       "unexpected \"extra\""},
      {{{"relative_attention_bias.weight", Tensor::full({4, 16}, 0.0f)}},
       "shape [4, 16], expected [16, 4]"},
      {{{"relative_attention_bias.weight", Tensor::full({16}, 0.0f)}}, "shape [16]"},
      {{{"relative_attention_bias.weight", nan_weight}}, "non-finite value nan at [5, 2]"},
      {{{"relative_attention_bias.weight", inf_weight}}, "non-finite value -inf at [15, 3]"},
  };
  for (const auto& b : bad) {
    try {
      m.load_state_dict(b.state);
      ADD_FAILURE() << "accepted: " << b.part;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(b.part), std::string::npos) << e.what();
    }
    EXPECT_EQ(m.embedding().to_float_vector(), before) << b.part;
  }
}

TEST(RelativePositionBias, MutableEmbeddingIsUsedAndChecked) {
  RelativePositionBias m(1.0f, true, 8, 20, 2, 5);
  m.mutable_embedding().mutable_data<float>()[0 * 2 + 1] = 3.5f;  // bucket 0, head 1
  EXPECT_EQ(m.forward(1, 1).at({1, 0, 0}), 3.5f);
  // A view or another dtype of the right shape works; another shape is refused.
  m.mutable_embedding() = Tensor::full({8, 2}, -1.0f, DType::kFloat16);
  EXPECT_EQ(m.forward(2, 2).at({0, 1, 0}), -1.0f);
  m.mutable_embedding() = Tensor::full({8, 3}, 0.0f);
  EXPECT_THROW(m.forward(2, 2), std::invalid_argument);
  EXPECT_THROW(m.distance_table(2), std::invalid_argument);
}

TEST(RelativePositionBias, BadArgumentsThrowWithValues) {
  const auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_NE(message([] {
              RelativePositionBias(1.0f, false, 32, 128, 0);
            }).find("heads must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(
      message([] { RelativePositionBias(1.0f, true, 1, 128, 8); }).find("num_buckets must be >= 2"),
      std::string::npos);
  EXPECT_NE(message([] { RelativePositionBias(1.0f, false, 2, 128, 8); }).find("got 2"),
            std::string::npos);
  EXPECT_NE(message([] { RelativePositionBias(1.0f, true, 32, 16, 8); }).find("got 16"),
            std::string::npos);
  EXPECT_NE(message([] {
              RelativePositionBias(std::nanf(""), false, 32, 128, 8);
            }).find("scale must be finite, got nan"),
            std::string::npos);
  EXPECT_NE(message([] { RelativePositionBias(INFINITY, false, 32, 128, 8); }).find("inf"),
            std::string::npos);
  const RelativePositionBias m(1.0f);
  EXPECT_NE(message([&] { m.forward(-1, 4); }).find("i = -1, j = 4"), std::string::npos);
  EXPECT_NE(message([&] { m.forward(4, -2); }).find("j = -2"), std::string::npos);
  EXPECT_NE(message([&] { m.distance_table(0); }).find("j must be >= 1, got 0"), std::string::npos);
  // Too large to allocate: refused before allocating, with the shape.
  EXPECT_THROW(m.forward(std::int64_t{1} << 40, std::int64_t{1} << 40), std::length_error);
  EXPECT_THROW(m.distance_table(std::int64_t{1} << 61), std::length_error);
}

// 16-bit outputs are the float32 values rounded once, to nearest even
// (include/posbias/dtype.h): past float16's range that is an infinity.
TEST(Precision, T5SixteenBitOutputsAreTheFloat32ValuesRoundedOnce) {
  // T5 with a scale that carries some buckets past float16's range.
  RelativePositionBias t5(3e4f, /*causal=*/false, 32, 128, 2, /*seed=*/5);
  const std::vector<float> t32 = t5.forward(2, 2500).to_float_vector();
  bool saw_inf = false;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> want(t32.size());
    for (std::size_t e = 0; e < t32.size(); ++e) want[e] = round_to(dt, t32[e]);
    const std::vector<float> got = t5.forward(2, 2500, dt).to_float_vector();
    expect_bits_equal(got, want, "t5 " + dtype_name(dt));
    for (float x : got) saw_inf = saw_inf || std::isinf(x);
  }
  EXPECT_TRUE(saw_inf) << "the T5 case no longer reaches float16's limit";
}


}  // namespace
}  // namespace posbias
