// DynamicPositionBias forward numerics: the distance table against the
// double-precision reference over many shapes, both variants and every dtype;
// the expansion into [heads, i, j] bit for bit from the table (large calls
// with streaming stores, few rows written in tiles, forward_into).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpb_reference.h"
#include "kernels/toeplitz.h"
#include "posbias/dpb.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::describe;
using test::expect_bits_equal;
using test::expect_close;
using test::naive_bias;
using test::randomise_norms;
using test::RefMlp;
using test::round_to;
using test::to_floats;
using test::variants;
using test::xt_options;

using Shape = std::vector<std::int64_t>;

// forward(i, j, dtype) against the double reference (tolerance), and exactly
// the distance table rounded once (the gather must not change a bit).
TEST(DynamicPositionBias, MatchesNaiveReferenceForAllShapesVariantsAndDtypes) {
  std::uint64_t seed = 1;
  for (std::int64_t dim : {1, 4, 16}) {
    for (std::int64_t heads : {1, 3, 8}) {
      for (const DpbOptions& o : variants(dim, heads)) {
        DynamicPositionBias m(o, seed++);
        if (o.norm) randomise_norms(m, seed);
        const RefMlp ref(m);
        for (std::int64_t j : {1, 2, 5, 64, 100}) {
          const Tensor dt = m.distance_table(j);
          ASSERT_EQ(dt.shape(), (Shape{heads, 2 * j - 1}));
          const std::vector<float> table = dt.to_float_vector();
          {
            // The table itself against the reference (i = j covers all of it).
            const std::vector<double> want = naive_bias(ref, heads, j, j);
            std::vector<float> from_table;
            for (std::int64_t h = 0; h < heads; ++h) {
              for (std::int64_t r = 0; r < j; ++r) {
                for (std::int64_t c = 0; c < j; ++c) {
                  from_table.push_back(table[h * (2 * j - 1) + r - c + j - 1]);
                }
              }
            }
            expect_close(from_table, to_floats(want), describe(o) + " table j" + std::to_string(j),
                         2e-6, 2e-5);
          }
          for (std::int64_t i : {0, 1, 2, 17}) {
            if (i > j) continue;
            for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
              const Tensor out = m.forward(i, j, dtype);
              const std::string what = describe(o) + " i" + std::to_string(i) + " j" +
                                       std::to_string(j) + " " + dtype_name(dtype);
              ASSERT_EQ(out.shape(), (Shape{heads, i, j})) << what;
              ASSERT_EQ(out.dtype(), dtype) << what;
              const std::vector<float> got = out.to_float_vector();
              for (std::int64_t h = 0; h < heads; ++h) {
                for (std::int64_t r = 0; r < i; ++r) {
                  for (std::int64_t c = 0; c < j; ++c) {
                    const float want =
                        round_to(dtype, table[h * (2 * j - 1) + (j - i + r) - c + j - 1]);
                    const float g = got[(h * i + r) * j + c];
                    ASSERT_EQ(float_bits(g), float_bits(want))
                        << what << " at [" << h << ", " << r << ", " << c << "]: " << g << " vs "
                        << want;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DynamicPositionBias, ZetaTableIsIndexedByAbsoluteDistance) {
  DynamicPositionBias m(8, 3, 7);
  const Tensor t = m.table(9);
  ASSERT_EQ(t.shape(), (Shape{3, 9}));
  const Tensor dt = m.distance_table(9);
  const RefMlp ref(m);
  for (std::int64_t d = 0; d < 9; ++d) {
    const std::vector<double> want = ref.forward(static_cast<double>(d));
    for (std::int64_t h = 0; h < 3; ++h) {
      EXPECT_NEAR(t.at({h, d}), want[h], 1e-6 + 1e-5 * std::fabs(want[h]));
      // Mirrored, bit for bit, in the attention's form.
      EXPECT_EQ(float_bits(dt.at({h, 8 + d})), float_bits(t.at({h, d})));
      EXPECT_EQ(float_bits(dt.at({h, 8 - d})), float_bits(t.at({h, d})));
    }
  }
  // x-transformers: table() is the signed distance table.
  DynamicPositionBias x(xt_options(8, 3, 2, true, true), 7);
  EXPECT_EQ(x.table(9).shape(), (Shape{3, 17}));
  EXPECT_EQ(x.table(9).to_float_vector(), x.distance_table(9).to_float_vector());
}

// Large enough for the threaded MLP and expansion, and (67 MB) for streaming
// stores: still the table bit for bit.
TEST(DynamicPositionBias, LargeCallsUseEveryPathAndStayExact) {
  for (const DpbOptions& o : {DpbOptions{64, 8}, xt_options(64, 8, 2, true, true)}) {
    DynamicPositionBias m(o, 3);
    const std::int64_t i = 1450, j = 1450;
    const std::vector<float> table = m.distance_table(j).to_float_vector();
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const Tensor out = m.forward(i, j, dtype);
      const std::vector<float> got = out.to_float_vector();
      for (std::int64_t h = 0; h < 8; ++h) {
        for (std::int64_t r = 0; r < i; r += 13) {
          for (std::int64_t c = 0; c < j; ++c) {
            const float want = round_to(dtype, table[h * (2 * j - 1) + (j - i + r) - c + j - 1]);
            ASSERT_EQ(float_bits(got[(h * i + r) * j + c]), float_bits(want))
                << describe(o) << " " << h << " " << r << " " << c;
          }
        }
      }
    }
    // Against the reference at a few distances.
    const RefMlp ref(m);
    for (std::int64_t s : {-1449, -1, 0, 1, 700, 1449}) {
      const std::vector<double> want = ref.forward(ref.input(s));
      for (std::int64_t h = 0; h < 8; ++h) {
        const float got = table[h * (2 * j - 1) + s + j - 1];
        EXPECT_NEAR(got, want[h], 2e-6 + 2e-5 * std::fabs(want[h])) << describe(o) << " s" << s;
      }
    }
  }
}

// Few rows (decode steps): the whole table would be about as large as the
// output, so it is produced and written kTableTile columns at a time; every
// distance's value is still the table's, bit for bit, across tile
// boundaries, for both variants (zeta mirrors |distance| within each tile).
TEST(DynamicPositionBias, FewRowsAreWrittenInTilesAndStayExact) {
  const std::int64_t j = 2 * detail::kTableTile + 7;
  for (const DpbOptions& o : {DpbOptions{8, 3}, xt_options(8, 3, 2, true, false)}) {
    DynamicPositionBias m(o, 5);
    const std::vector<float> table = m.distance_table(j).to_float_vector();
    for (std::int64_t i : {1, 3}) {
      ASSERT_FALSE(detail::whole_table_is_small(i, j, DType::kFloat32));
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        const std::vector<float> got = m.forward(i, j, dtype).to_float_vector();
        for (std::int64_t h = 0; h < 3; ++h) {
          for (std::int64_t r = 0; r < i; ++r) {
            for (std::int64_t c = 0; c < j; ++c) {
              const float want = round_to(dtype, table[h * (2 * j - 1) + (j - i + r) - c + j - 1]);
              ASSERT_EQ(float_bits(got[(h * i + r) * j + c]), float_bits(want))
                  << describe(o) << " " << dtype_name(dtype) << " i" << i << " " << h << " " << r
                  << " " << c;
            }
          }
        }
      }
    }
  }
}

TEST(DynamicPositionBias, ForwardIntoWritesTheSameBytes) {
  DynamicPositionBias m(16, 5, 11);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Tensor a = m.forward(6, 9, dtype);
    Tensor b = Tensor::full({5, 6, 9}, 123.0f, dtype);
    m.forward_into(6, 9, dtype, b.raw_mutable_data());
    const std::vector<float> va = a.to_float_vector();
    const std::vector<float> vb = b.to_float_vector();
    for (std::size_t k = 0; k < va.size(); ++k) ASSERT_EQ(float_bits(va[k]), float_bits(vb[k]));
  }
  m.forward_into(0, 4, DType::kFloat32, nullptr);  // nothing to write
  EXPECT_THROW(m.forward_into(2, 4, DType::kFloat32, nullptr), std::invalid_argument);
}

// 16-bit outputs are the float32 values rounded once, to nearest even
// (include/posbias/dtype.h; ALiBi's own cases: alibi_precision_test.cc).
TEST(Precision, DpbSixteenBitOutputsAreTheFloat32ValuesRoundedOnce) {
  const DynamicPositionBias dpb(8, 3, /*seed=*/11);
  const std::int64_t i = 3, j = 3000;
  const std::vector<float> f32 = dpb.forward(i, j).to_float_vector();
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> want(f32.size());
    for (std::size_t e = 0; e < f32.size(); ++e) want[e] = round_to(dt, f32[e]);
    expect_bits_equal(dpb.forward(i, j, dt).to_float_vector(), want, "dpb " + dtype_name(dt));
  }
}

}  // namespace
}  // namespace posbias
