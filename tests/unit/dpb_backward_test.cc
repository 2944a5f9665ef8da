// DynamicPositionBias backward: the double-precision reference against
// central differences, the library against the reference over shapes and
// variants, threaded large calls, thread-count independence, the table
// gradients, strided and 16-bit gradients, empty calls and wrong shapes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dpb_reference.h"
#include "posbias/dpb.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::describe;
using test::expect_grads_close;
using test::naive_backward;
using test::naive_bias;
using test::random_floats;
using test::randomise_norms;
using test::RefMlp;
using test::variants;
using test::xt_options;

// ----------------------------------------------------------------- backward

// The double-precision reference backward, checked against central
// differences of the double-precision forward; then the library against it.
TEST(DpbBackward, MatchesFiniteDifferences) {
  for (const DpbOptions& o :
       {DpbOptions{4, 3}, xt_options(4, 2, 2, true, true), xt_options(3, 2, 1, false, false)}) {
    DynamicPositionBias m(o, 21);
    if (o.norm) randomise_norms(m, 4);
    const std::int64_t i = 3, j = 5;
    const std::vector<float> g = random_floats(static_cast<std::size_t>(o.heads * i * j), 8);
    RefMlp ref(m);
    const auto loss = [&](const RefMlp& r) {
      const std::vector<double> b = naive_bias(r, o.heads, i, j);
      double s = 0.0;
      for (std::size_t k = 0; k < b.size(); ++k) s += b[k] * g[k];
      return s;
    };
    const auto analytic = naive_backward(ref, o.heads, i, j, g);
    const TensorMap got = m.backward(i, j, Tensor::from_vector({o.heads, i, j}, g));
    for (const std::string& name : m.parameter_names()) {
      std::vector<double>* p = ref.parameter(name);
      ASSERT_NE(p, nullptr) << name;
      const std::vector<float> mine = got.at(name).to_float_vector();
      for (std::size_t k = 0; k < p->size(); ++k) {
        const double keep = (*p)[k];
        const double h = 1e-5;
        (*p)[k] = keep + h;
        const double up = loss(ref);
        (*p)[k] = keep - h;
        const double down = loss(ref);
        (*p)[k] = keep;
        const double fd = (up - down) / (2 * h);
        ASSERT_NEAR(analytic.at(name)[k], fd, 1e-6 + 1e-5 * std::fabs(fd))
            << describe(o) << " reference " << name << "[" << k << "]";
        ASSERT_NEAR(mine[k], fd, 1e-5 + 1e-4 * std::fabs(fd))
            << describe(o) << " " << name << "[" << k << "]";
      }
    }
  }
}

TEST(DpbBackward, MatchesNaiveReductionOverShapes) {
  std::uint64_t seed = 100;
  for (const DpbOptions& o : variants(6, 3)) {
    DynamicPositionBias m(o, seed++);
    if (o.norm) randomise_norms(m, seed);
    const RefMlp ref(m);
    for (auto [i, j] :
         {std::pair<std::int64_t, std::int64_t>{1, 1}, {1, 9}, {4, 4}, {7, 20}, {17, 64}}) {
      const std::vector<float> g = random_floats(static_cast<std::size_t>(3 * i * j), seed++);
      const TensorMap got = m.backward(i, j, Tensor::from_vector({3, i, j}, g));
      expect_grads_close(got, naive_backward(ref, 3, i, j, g), m, 1e-4,
                         describe(o) + " i" + std::to_string(i) + " j" + std::to_string(j));
    }
  }
}

// Threaded reduction and MLP backward at a size where both run in parallel,
// against the reference and against the table-gradient path.
TEST(DpbBackward, LargeCallMatchesReferenceAndTablePath) {
  for (const DpbOptions& o : {DpbOptions{64, 8}, xt_options(32, 4, 2, true, true)}) {
    DynamicPositionBias m(o, 5);
    const RefMlp ref(m);
    const std::int64_t i = 400, j = 500;
    const std::vector<float> g = random_floats(static_cast<std::size_t>(o.heads * i * j), 77);
    const Tensor gt = Tensor::from_vector({o.heads, i, j}, g);
    const TensorMap got = m.backward(i, j, gt);
    expect_grads_close(got, naive_backward(ref, o.heads, i, j, g), m, 2e-4, describe(o));
    // Same thing through the distance-table gradient, reduced naively.
    std::vector<float> gd(static_cast<std::size_t>(o.heads * (2 * j - 1)), 0.0f);
    {
      std::vector<double> acc(gd.size(), 0.0);
      for (std::int64_t h = 0; h < o.heads; ++h) {
        for (std::int64_t r = 0; r < i; ++r) {
          for (std::int64_t c = 0; c < j; ++c) {
            acc[h * (2 * j - 1) + (j - i + r) - c + j - 1] += g[(h * i + r) * j + c];
          }
        }
      }
      for (std::size_t k = 0; k < gd.size(); ++k) gd[k] = static_cast<float>(acc[k]);
    }
    const TensorMap via_table =
        m.backward_distance_table(j, Tensor::from_vector({o.heads, 2 * j - 1}, gd));
    for (const std::string& name : m.parameter_names()) {
      const std::vector<float> a = got.at(name).to_float_vector();
      const std::vector<float> b = via_table.at(name).to_float_vector();
      double scale = 0.0;
      for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      for (std::size_t k = 0; k < a.size(); ++k) {
        ASSERT_NEAR(a[k], b[k], 1e-4 * scale + 1e-6) << describe(o) << " " << name << k;
      }
    }
    // Deterministic: the same call gives the same bits.
    const TensorMap again = m.backward(i, j, gt);
    for (const std::string& name : m.parameter_names()) {
      EXPECT_EQ(again.at(name).to_float_vector(), got.at(name).to_float_vector()) << name;
    }
  }
}

// The header promises gradients (and forward values) that do not depend on
// the number of threads: fixed blocks, summed in a fixed order.
TEST(DpbBackward, ResultsDoNotDependOnTheThreadCount) {
  const int saved = omp_get_max_threads();
  for (const DpbOptions& o : {DpbOptions{64, 8}, xt_options(48, 3, 2, true, true)}) {
    DynamicPositionBias m(o, 12);
    const std::int64_t i = 700, j = 900;
    const Tensor g = Tensor::from_vector(
        {o.heads, i, j}, random_floats(static_cast<std::size_t>(o.heads * i * j), 3));
    std::vector<TensorMap> grads;
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3, 5}) {
      omp_set_num_threads(threads);
      grads.push_back(m.backward(i, j, g));
      outs.push_back(m.forward(i, j).to_float_vector());
    }
    omp_set_num_threads(saved);
    for (std::size_t k = 1; k < grads.size(); ++k) {
      EXPECT_EQ(outs[k], outs[0]) << describe(o) << " run " << k;
      for (const std::string& name : m.parameter_names()) {
        EXPECT_EQ(grads[k].at(name).to_float_vector(), grads[0].at(name).to_float_vector())
            << describe(o) << " " << name << " run " << k;
      }
    }
  }
}

TEST(DpbBackward, TableGradientsAgreeWithEachOther) {
  // zeta: backward_table on [heads, j] and backward_distance_table on the
  // mirrored gradient (split between +d and -d) give the same gradients.
  DynamicPositionBias m(8, 2, 3);
  const std::int64_t j = 12;
  const std::vector<float> gt = random_floats(2 * j, 5);
  const TensorMap a = m.backward_table(j, Tensor::from_vector({2, j}, gt));
  std::vector<float> gd(2 * (2 * j - 1), 0.0f);
  for (std::int64_t h = 0; h < 2; ++h) {
    gd[h * (2 * j - 1) + j - 1] = gt[h * j];
    for (std::int64_t d = 1; d < j; ++d) {
      // Halves are exact in binary floating point.
      gd[h * (2 * j - 1) + j - 1 + d] = gt[h * j + d] * 0.5f;
      gd[h * (2 * j - 1) + j - 1 - d] = gt[h * j + d] * 0.5f;
    }
  }
  const TensorMap b = m.backward_distance_table(j, Tensor::from_vector({2, 2 * j - 1}, gd));
  for (const std::string& name : m.parameter_names()) {
    EXPECT_EQ(a.at(name).to_float_vector(), b.at(name).to_float_vector()) << name;
  }
  // backward(i = j) with a gradient concentrated on one distance equals the
  // table gradient of that distance.
  const RefMlp ref(m);
  std::vector<float> g(2 * 5 * 5, 0.0f);
  g[(0 * 5 + 4) * 5 + 1] = 1.0f;  // head 0, distance 3
  const TensorMap c = m.backward(5, 5, Tensor::from_vector({2, 5, 5}, g));
  std::vector<float> one(2 * 5, 0.0f);
  one[3] = 1.0f;
  const TensorMap d = m.backward_table(5, Tensor::from_vector({2, 5}, one));
  for (const std::string& name : m.parameter_names()) {
    EXPECT_EQ(c.at(name).to_float_vector(), d.at(name).to_float_vector()) << name;
  }
}

TEST(DpbBackward, StridedAndHalfPrecisionGradients) {
  DynamicPositionBias m(xt_options(8, 3, 2, false, true), 2);
  const std::int64_t i = 6, j = 9;
  const std::vector<float> g = random_floats(3 * 10 * j, 31);
  const Tensor big = Tensor::from_vector({3, 10, j}, g);
  const Tensor view = big.slice(1, 2, 2 + i);  // not contiguous
  ASSERT_FALSE(view.is_contiguous());
  const TensorMap a = m.backward(i, j, view);
  const TensorMap b = m.backward(i, j, view.contiguous_copy());
  for (const std::string& name : m.parameter_names()) {
    EXPECT_EQ(a.at(name).to_float_vector(), b.at(name).to_float_vector()) << name;
  }
  // bfloat16 gradients are converted (exactly) to float32 first.
  const Tensor g16 = view.to(DType::kBFloat16);
  const TensorMap c = m.backward(i, j, g16);
  const TensorMap d = m.backward(i, j, g16.to(DType::kFloat32));
  for (const std::string& name : m.parameter_names()) {
    EXPECT_EQ(c.at(name).to_float_vector(), d.at(name).to_float_vector()) << name;
  }
}

TEST(DpbBackward, EmptyCallsGiveZeroGradientsOfEveryShape) {
  DynamicPositionBias m(xt_options(4, 2, 2, true, true), 1);
  const TensorMap g = m.backward(0, 7, Tensor::empty({2, 0, 7}, DType::kFloat32));
  ASSERT_EQ(g.size(), m.parameter_names().size());
  for (const std::string& name : m.parameter_names()) {
    EXPECT_EQ(g.at(name).shape(), m.parameter(name).shape());
    for (float v : g.at(name).to_float_vector()) EXPECT_EQ(v, 0.0f);
  }
  EXPECT_EQ(m.backward(0, 0, Tensor::empty({2, 0, 0}, DType::kFloat32)).size(), g.size());
}

TEST(DpbBackward, RejectsGradientsOfTheWrongShape) {
  DynamicPositionBias m(8, 4);
  try {
    m.backward(3, 5, Tensor::full({4, 5, 3}, 0.0f));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 3, 5]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 5, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.backward(3, 5, Tensor::full({3, 5}, 0.0f)), std::invalid_argument);
  EXPECT_THROW(m.backward(6, 5, Tensor::full({4, 6, 5}, 0.0f)), std::invalid_argument);
  EXPECT_THROW(m.backward_table(5, Tensor::full({4, 9}, 0.0f)), std::invalid_argument);
  EXPECT_THROW(m.backward_distance_table(5, Tensor::full({4, 5}, 0.0f)), std::invalid_argument);
  EXPECT_THROW(m.backward_table(0, Tensor::full({4, 0}, 0.0f)), std::invalid_argument);
  DynamicPositionBias x(xt_options(8, 4, 2, false, false));
  EXPECT_THROW(x.backward_table(5, Tensor::full({4, 5}, 0.0f)), std::invalid_argument);
  EXPECT_NO_THROW(x.backward_table(5, Tensor::full({4, 9}, 0.0f)));
}

}  // namespace
}  // namespace posbias
