// The DynamicPositionBias kernels on every instruction set Highway compiled
// them for: the MLP against the double-precision reference, and the
// Toeplitz reduction of the backward pass against naive sums.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dpb_reference.h"
#include "kernels/dpb_mlp.h"
#include "kernels/toeplitz_reduce.h"
#include "posbias/dpb.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::describe;
using test::expect_close;
using test::random_floats;
using test::randomise_norms;
using test::RefMlp;
using test::to_floats;
using test::xt_options;

// ------------------------------------------------ kernels, every target

TEST(DpbKernels, MlpOnEveryTargetMatchesReference) {
  for (const DpbOptions& o : {DpbOptions{5, 3}, DpbOptions{33, 9}, xt_options(20, 2, 3, true, true),
                              xt_options(1, 1, 1, false, true)}) {
    DynamicPositionBias m(o, 5);
    if (o.norm) randomise_norms(m, 9);
    const RefMlp ref(m);
    const detail::DpbMlp k = test::kernel_view(m);  // as dpb.cc builds it
    const std::int64_t n = 131;  // two full blocks and a ragged one
    std::vector<float> x(n);
    for (std::int64_t r = 0; r < n; ++r) x[r] = static_cast<float>(ref.input(r - 60));
    std::vector<double> want;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::vector<double> y = ref.forward(x[r]);
      want.insert(want.end(), y.begin(), y.end());
    }
    std::vector<float> first;
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> y(o.heads * n, -1.0f);
      detail::dpb_mlp_forward_serial(k, x.data(), n, y.data(), n);
      std::vector<float> got;  // [n][heads] like want
      for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t h = 0; h < o.heads; ++h) got.push_back(y[h * n + r]);
      }
      expect_close(got, to_floats(want), describe(o) + " " + hwy::TargetName(target), 2e-6, 2e-5);
      // A row's value does not depend on which rows run with it.
      std::vector<float> one(o.heads);
      detail::dpb_mlp_forward_serial(k, x.data() + 77, 1, one.data(), 1);
      for (std::int64_t h = 0; h < o.heads; ++h) {
        EXPECT_EQ(float_bits(one[h]), float_bits(y[h * n + 77])) << hwy::TargetName(target);
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(DpbKernels, ToeplitzReduceOnEveryTargetMatchesNaiveSums) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (auto [heads, rows, cols] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1},
                                     {3, 5, 5},
                                     {2, 17, 40},
                                     {5, 70, 33},
                                     {1, 200, 3}}) {
      const std::vector<float> g =
          random_floats(static_cast<std::size_t>(heads * rows * cols), heads * 100 + rows);
      const std::int64_t len = rows + cols - 1;
      const std::int64_t stride = len + 3;  // untouched entries at the end
      std::vector<float> table(static_cast<std::size_t>(heads * stride), 42.0f);
      detail::ToeplitzReduceParams p;
      p.grad = g.data();
      p.heads = heads;
      p.rows = rows;
      p.cols = cols;
      p.table = table.data();
      p.table_stride = stride;
      p.row_offset0 = rows - 1;
      detail::toeplitz_reduce(p);
      for (std::int64_t h = 0; h < heads; ++h) {
        std::vector<double> want(static_cast<std::size_t>(len), 0.0);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t c = 0; c < cols; ++c) {
            want[rows - 1 - r + c] += g[(h * rows + r) * cols + c];
          }
        }
        for (std::int64_t e = 0; e < len; ++e) {
          ASSERT_NEAR(table[h * stride + e], want[e], 1e-5)
              << hwy::TargetName(target) << " h" << h << " rows" << rows << " e" << e;
        }
        for (std::int64_t e = len; e < stride; ++e) ASSERT_EQ(table[h * stride + e], 42.0f);
      }
      // The inner step on its own, unaligned.
      std::vector<float> acc(cols + 1, 1.0f);
      detail::toeplitz_reduce_add_row(g.data() + 1, acc.data() + 1, cols - 1);
      for (std::int64_t c = 1; c < cols; ++c) ASSERT_EQ(acc[c], 1.0f + g[c]);
      ASSERT_EQ(acc[0], 1.0f);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace posbias
