// expand_distance_table / reduce_distance_table (posbias/distance_table.h)
// against naive loops over many shapes (i < j, i = j, i > j, decode rows,
// tall and wide outputs that take the tiled path), tables longer than needed,
// strided and stride-0 tables, every table and output dtype; and their
// errors.
#include "posbias/distance_table.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace posbias {
namespace {

struct Case {
  std::int64_t heads, i, j;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (std::int64_t heads : {1, 3, 8}) {
    for (auto ij : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0},
                                                                      {0, 5},
                                                                      {5, 0},
                                                                      {1, 1},
                                                                      {1, 9},
                                                                      {4, 4},
                                                                      {5, 9},
                                                                      {9, 5},
                                                                      {16, 31},
                                                                      {31, 16},
                                                                      {3, 100},
                                                                      {100, 3},
                                                                      {1, 1500},
                                                                      {1500, 1},
                                                                      {64, 64}}) {
      c.push_back({heads, ij.first, ij.second});
    }
  }
  return c;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, bool small_integers) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
    x = small_integers ? static_cast<float>(static_cast<int>(u * 17.0) - 8)
                       : static_cast<float>(4.0 * u - 2.0);
  }
  return v;
}

// The rule, written out: bias[h][r][c] = table[h][(n - 1) / 2 + (j - i + r - c)].
std::vector<float> naive_expand(const Tensor& table, std::int64_t i, std::int64_t j) {
  const std::int64_t heads = table.size(0), centre = (table.size(1) - 1) / 2;
  std::vector<float> out;
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) out.push_back(table.at({h, centre + (j - i + r - c)}));
    }
  }
  return out;
}

// The adjoint, written out (in double; the test gradients make it exact).
std::vector<float> naive_reduce(const Tensor& grad, std::int64_t n) {
  const std::int64_t heads = grad.size(0), i = grad.size(1), j = grad.size(2);
  const std::int64_t centre = (n - 1) / 2;
  std::vector<double> acc(static_cast<std::size_t>(heads * n), 0.0);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        acc[static_cast<std::size_t>(h * n + centre + (j - i + r - c))] += grad.at({h, r, c});
      }
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

float round_to(float x, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return to_float(to_bfloat16(x));
    case DType::kFloat16:
      return to_float(to_float16(x));
    default:  // float32: nothing to round
      break;
  }
  return x;
}

std::string where(const Case& c, std::int64_t n, DType dtype) {
  return "heads " + std::to_string(c.heads) + " i " + std::to_string(c.i) + " j " +
         std::to_string(c.j) + " n " + std::to_string(n) + " " + dtype_name(dtype);
}

TEST(DistanceTable, ExpandMatchesNaiveForEveryShapeAndDtype) {
  std::uint64_t seed = 1;
  for (const Case& c : cases()) {
    const std::int64_t need = std::max<std::int64_t>(2 * std::max(c.i, c.j) - 1, 1);
    for (std::int64_t extra : {0, 3}) {
      const std::int64_t n = need + 2 * extra;  // longer tables are read at their centre
      const Tensor table = Tensor::from_vector(
          {c.heads, n}, random_values(static_cast<std::size_t>(c.heads * n), seed++, false));
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(where(c, n, dtype));
        const Tensor got = expand_distance_table(table, c.i, c.j, dtype);
        ASSERT_EQ(got.shape(), (std::vector<std::int64_t>{c.heads, c.i, c.j}));
        ASSERT_EQ(got.dtype(), dtype);
        ASSERT_TRUE(got.is_contiguous());
        std::vector<float> want = naive_expand(table, c.i, c.j);
        for (float& x : want) x = round_to(x, dtype);
        ASSERT_EQ(got.to_float_vector(), want);
        // The _into form writes the same bytes into caller memory.
        Tensor into = Tensor::full({c.heads, c.i, c.j}, 7.0f, dtype);
        expand_distance_table_into(table, c.i, c.j, dtype, into.raw_mutable_data());
        ASSERT_EQ(into.to_float_vector(), want);
      }
    }
  }
}

TEST(DistanceTable, ExpandReadsStridedStrideZeroAnd16BitTables) {
  const std::int64_t heads = 3, i = 7, j = 12, n = 2 * 12 - 1 + 4;
  // Every other entry of a [heads, 2n + 5] buffer: entry stride 2, head stride 2n + 5.
  std::vector<float> buffer =
      random_values(static_cast<std::size_t>(heads * (2 * n + 5)), 9, false);
  const Tensor strided =
      Tensor::from_blob(buffer.data(), {heads, n}, {2 * n + 5, 2}, DType::kFloat32);
  // One head's table shared by all heads (stride 0).
  const Tensor broadcast = Tensor::from_blob(buffer.data(), {heads, n}, {0, 1}, DType::kFloat32);
  // A transposed [n, heads] buffer read as [heads, n].
  const Tensor transposed =
      Tensor::from_vector({n, heads},
                          std::vector<float>(buffer.begin(), buffer.begin() + n * heads))
          .transpose(0, 1);
  for (const Tensor& t : {strided, broadcast, transposed, strided.to(DType::kBFloat16),
                          strided.to(DType::kFloat16)}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(dtype_name(t.dtype()) + " table, output " + dtype_name(dtype));
      std::vector<float> want = naive_expand(t, i, j);
      for (float& x : want) x = round_to(x, dtype);
      EXPECT_EQ(expand_distance_table(t, i, j, dtype).to_float_vector(), want);
      // Decode rows (the tiled path) from the same strided table.
      std::vector<float> want1 = naive_expand(t, 1, j);
      for (float& x : want1) x = round_to(x, dtype);
      EXPECT_EQ(expand_distance_table(t, 1, j, dtype).to_float_vector(), want1);
    }
  }
}

TEST(DistanceTable, ReduceIsTheExactAdjointForEveryShape) {
  std::uint64_t seed = 100;
  for (const Case& c : cases()) {
    const std::int64_t need = std::max<std::int64_t>(2 * std::max(c.i, c.j) - 1, 1);
    for (std::int64_t extra : {0, 2}) {
      const std::int64_t n = need + 2 * extra;
      SCOPED_TRACE(where(c, n, DType::kFloat32));
      // Small integers: every sum is exact in float32, so the comparison is too.
      const Tensor grad = Tensor::from_vector(
          {c.heads, c.i, c.j},
          random_values(static_cast<std::size_t>(c.heads * c.i * c.j), seed++, true));
      const Tensor got = reduce_distance_table(grad, n);
      ASSERT_EQ(got.shape(), (std::vector<std::int64_t>{c.heads, n}));
      ASSERT_EQ(got.dtype(), DType::kFloat32);
      ASSERT_EQ(got.to_float_vector(), naive_reduce(grad, n));
      // 16-bit and non-contiguous gradients give the same sums.
      EXPECT_EQ(reduce_distance_table(grad.to(DType::kBFloat16), n).to_float_vector(),
                naive_reduce(grad, n));
      const Tensor swapped = grad.transpose(1, 2).contiguous_copy().transpose(1, 2);
      ASSERT_FALSE(swapped.is_contiguous() && c.i > 1 && c.j > 1);
      EXPECT_EQ(reduce_distance_table(swapped, n).to_float_vector(), naive_reduce(grad, n));
      // The stride-0 gradient of bias.sum(): every element 1.
      float one = 1.0f;
      const Tensor ones = Tensor::from_blob(&one, {c.heads, c.i, c.j}, {0, 0, 0}, DType::kFloat32);
      EXPECT_EQ(reduce_distance_table(ones, n).to_float_vector(), naive_reduce(ones, n));
    }
  }
}

TEST(DistanceTable, ReduceDoesNotDependOnTheThreadCount) {
  const Tensor grad = Tensor::from_vector({4, 300, 700}, random_values(4 * 300 * 700, 7, false));
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = reduce_distance_table(grad, 2 * 700 - 1).to_float_vector();
  omp_set_num_threads(3);
  const std::vector<float> three = reduce_distance_table(grad, 2 * 700 - 1).to_float_vector();
  omp_set_num_threads(before);
  EXPECT_EQ(one, three);
  const std::vector<float> want = naive_reduce(grad, 2 * 700 - 1);
  for (std::size_t k = 0; k < want.size(); ++k) ASSERT_NEAR(one[k], want[k], 1e-3f) << k;
}

template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const std::string& s : needles) {
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << " / " << s;
    }
  }
}

TEST(DistanceTable, BadArgumentsAreClearErrors) {
  const Tensor t7 = Tensor::full({2, 7}, 1.0f);
  using IA = std::invalid_argument;
  expect_error<IA>(
      [&] {
        expand_distance_table(Tensor::full({2, 8}, 1.0f), 2, 3);
      },
      {"expand_distance_table", "n = 8", "[2, 8]", "odd"});
  expect_error<IA>([&] { expand_distance_table(t7, 5, 5); },
                   {"too short for i = 5, j = 5", "centre 3", "n >= 2 max(i, j) - 1 = 9"});
  expect_error<IA>([&] { expand_distance_table(t7, 2, 5); }, {"i = 2, j = 5", "= 9"});
  expect_error<IA>([&] { expand_distance_table(t7, 6, 2); }, {"i = 6, j = 2", "= 11"});
  expect_error<IA>([&] { expand_distance_table(t7, -1, 3); }, {"i = -1, j = 3", ">= 0"});
  expect_error<IA>([&] { expand_distance_table(t7, 1, -3); }, {"i = 1, j = -3"});
  expect_error<IA>(
      [&] {
        expand_distance_table(Tensor::full({2, 7, 1}, 1.0f), 1, 1);
      },
      {"2-d", "[2, 7, 1]"});
  expect_error<IA>([&] { expand_distance_table(Tensor::full({2, 0}, 1.0f), 0, 0); }, {"n = 0"});
  expect_error<IA>([&] { expand_distance_table_into(t7, 2, 3, DType::kFloat32, nullptr); },
                   {"out is null for 12 elements"});
  // A stride-0 table claiming 2^41 entries: the bias would not fit.
  float one = 1.0f;
  const std::int64_t huge = (std::int64_t{1} << 41) + 1;
  const Tensor wide = Tensor::from_blob(&one, {4, huge}, {0, 0}, DType::kFloat32);
  expect_error<std::length_error>(
      [&] { expand_distance_table(wide, std::int64_t{1} << 40, 1 << 20); },
      {"expand_distance_table", "[4, 1099511627776, 1048576]"});
  // Lengths near int64's limit: the message's 2 max(i, j) - 1 must not overflow.
  expect_error<IA>([&] { expand_distance_table(t7, 1, INT64_MAX); }, {"beyond int64"});

  const Tensor g = Tensor::full({2, 3, 4}, 1.0f);
  expect_error<IA>([&] { reduce_distance_table(g, 6); }, {"reduce_distance_table", "n = 6", "odd"});
  expect_error<IA>([&] { reduce_distance_table(g, -7); }, {"n = -7"});
  expect_error<IA>([&] { reduce_distance_table(g, 5); },
                   {"too short for i = 3, j = 4", "[2, 3, 4]", "= 7"});
  expect_error<IA>(
      [&] {
        reduce_distance_table(Tensor::full({3, 4}, 1.0f), 7);
      },
      {"3-d", "[3, 4]"});
  expect_error<std::length_error>([&] { reduce_distance_table(g, huge * 1024 - 1); },
                                  {"reduce_distance_table", "[2, "});
  // Nothing needed from the table: any odd n is fine.
  EXPECT_EQ(reduce_distance_table(Tensor::full({2, 0, 4}, 1.0f), 1).to_float_vector(),
            (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(expand_distance_table(Tensor::full({2, 1}, 1.0f), 0, 9).shape(),
            (std::vector<std::int64_t>{2, 0, 9}));
}

}  // namespace
}  // namespace posbias
