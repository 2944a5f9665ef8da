// Distance tables (see posbias/distance_table.h): argument checks, then the
// Toeplitz kernels.
//
// The kernels read and write their table in the other direction: row r of
// the expansion is the window starting at entry (i - 1) - r of a table R
// whose entry m holds distance j - 1 - m (kernels/toeplitz.h). With the
// public table read at its centre C, R[m] = table[C + j - 1 - m] for
// m < i + j - 1. The expansion produces R (reversed, widened to float32)
// through expand_generated_table, which also tiles it when it would be about
// as large as the output; the reduction writes R into the output's window
// [C + 1 - i, C + j - 1] and reverses it there.
#include "posbias/distance_table.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "dtype_dispatch.h"
#include "kernels/toeplitz.h"
#include "kernels/toeplitz_reduce.h"

namespace posbias {
namespace {

constexpr const char* kExpand = "expand_distance_table";

std::string with_shape(const Tensor& t) { return detail::shape_string(t.shape()); }

// "n >= 2 max(i, j) - 1 = 9" (or the formula alone when that overflows).
std::string needed_length(std::int64_t i, std::int64_t j) {
  const std::int64_t m = std::max(i, j);
  std::int64_t twice = 0;
  if (__builtin_mul_overflow(m, std::int64_t{2}, &twice)) {
    return "n >= 2 max(i, j) - 1 (beyond int64)";
  }
  return "n >= 2 max(i, j) - 1 = " + std::to_string(twice - 1);
}

// The checks shared by the expansion and the reduction: n odd and long
// enough for the distances 1 - i .. j - 1 of a call (i, j) (i, j >= 0).
// Returns the centre (n - 1) / 2.
std::int64_t checked_centre(const char* who, const std::string& table_desc, std::int64_t n,
                            std::int64_t i, std::int64_t j) {
  if (n < 1 || n % 2 == 0) {
    throw std::invalid_argument(std::string(who) + ": the table length n = " + std::to_string(n) +
                                " (" + table_desc +
                                ") must be odd and >= 1: the table is read at its centre "
                                "(n - 1) / 2");
  }
  const std::int64_t centre = (n - 1) / 2;
  if (i > 0 && j > 0 && (i - 1 > centre || j - 1 > centre)) {
    throw std::invalid_argument(
        std::string(who) + ": the table (" + table_desc + ", centre " + std::to_string(centre) +
        ") is too short for i = " + std::to_string(i) + ", j = " + std::to_string(j) +
        ": the distances 1 - i .. j - 1 "
        "need " +
        needed_length(i, j));
  }
  return centre;
}

void check_lengths(const char* who, std::int64_t i, std::int64_t j) {
  if (i < 0 || j < 0) {
    throw std::invalid_argument(std::string(who) + ": i and j must be >= 0, got i = " +
                                std::to_string(i) + ", j = " + std::to_string(j));
  }
}

struct ExpandShape {
  std::int64_t centre;
  std::int64_t count;  // heads * i * j
};

ExpandShape check_expand(const Tensor& table, std::int64_t i, std::int64_t j, DType dtype) {
  check_float_dtype(dtype, kExpand);
  if (!is_output_dtype(table.dtype()) && table.dtype() != DType::kFloat64) {
    throw std::invalid_argument(std::string(kExpand) +
                                ": the table must be float32, bfloat16, float16 or float64, got " +
                                dtype_name(table.dtype()));
  }
  if (table.dim() != 2) {
    throw std::invalid_argument(std::string(kExpand) +
                                ": the table must be 2-d [heads, n], got shape " +
                                with_shape(table));
  }
  check_lengths(kExpand, i, j);
  ExpandShape shape;
  shape.centre = checked_centre(kExpand, "table " + with_shape(table), table.size(1), i, j);
  const std::vector<std::int64_t> bias_shape = {table.size(0), i, j};
  try {
    shape.count = detail::checked_numel(bias_shape, dtype);
  } catch (const std::length_error& e) {
    throw std::length_error(std::string(kExpand) + ": the bias [heads, i, j] = " +
                            detail::shape_string(bias_shape) + ": " + e.what());
  }
  return shape;
}

// Entries [k0, k0 + count) of R (R[m] = table[centre + j - 1 - m]) for every
// head, as float32 at dst[h * count + k].
template <typename T>
void fill_reversed(const T* base, std::int64_t heads, std::int64_t head_stride,
                   std::int64_t entry_stride, std::int64_t top, std::int64_t k0, std::int64_t count,
                   float* dst) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const T* src = base + h * head_stride + (top - k0) * entry_stride;
    float* d = dst + h * count;
    for (std::int64_t k = 0; k < count; ++k) {
      if constexpr (std::is_same_v<T, float>) {
        d[k] = src[-k * entry_stride];
      } else {
        d[k] = to_float(src[-k * entry_stride]);
      }
    }
  }
}

// Rows [0, rows) of a 3-d tensor with any strides, widened to contiguous
// float32 at dst (threaded over rows). Tensor::to() walks element by element;
// this is the gradient's copy when it is not contiguous float32, e.g. the
// stride-0 gradient of bias.sum(), so it runs at memory speed.
template <typename T>
void widen_rows(const T* base, const std::vector<std::int64_t>& shape,
                const std::vector<std::int64_t>& strides, float* dst) {
  const std::int64_t i = shape[1], j = shape[2];
  const std::int64_t rows = shape[0] * i;
  const bool parallel = rows * j >= (std::int64_t{1} << 16) && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* src = base + (row / i) * strides[0] + (row % i) * strides[1];
    float* d = dst + row * j;
    for (std::int64_t c = 0; c < j; ++c) {
      if constexpr (std::is_same_v<T, float>) {
        d[c] = src[c * strides[2]];
      } else {
        d[c] = to_float(src[c * strides[2]]);
      }
    }
  }
}

// The gradient as contiguous float32 (itself when it already is).
Tensor contiguous_float32(const Tensor& g) {
  if (g.dtype() == DType::kFloat32 && g.is_contiguous()) return g;
  Tensor out = Tensor::empty(g.shape(), DType::kFloat32);
  float* d = out.mutable_data<float>();
  detail::with_float_type(g.dtype(), "distance table gradient", [&](auto tag) {
    using T = decltype(tag);
    widen_rows(g.data<T>(), g.shape(), g.strides(), d);
  });
  return out;
}

// The float64 reference path of the expansion (a float64 table or output):
// out[h][r][c] = table[h][centre + (j - i + r) - c], read in double and
// stored in dtype (the double itself, or rounded once through float32).
void expand_f64(const Tensor& table, std::int64_t i, std::int64_t j, std::int64_t centre,
                DType dtype, void* out) {
  const std::int64_t heads = table.size(0), rows = heads * i;
  const std::int64_t s0 = table.strides()[0], s1 = table.strides()[1];
#pragma omp parallel for schedule(static) if (rows * j >= (1 << 16))
  for (std::int64_t flat = 0; flat < rows; ++flat) {
    const std::int64_t h = flat / i, q = j - i + flat % i;
    for (std::int64_t c = 0; c < j; ++c) {
      const double v =
          detail::load_element(table.raw_data(), table.dtype(), h * s0 + (centre + q - c) * s1);
      const std::int64_t at = flat * j + c;
      if (dtype == DType::kFloat64) {
        static_cast<double*>(out)[at] = v;
      } else {
        const float f = static_cast<float>(v);
        detail::convert_floats(&f, 1, dtype, static_cast<char*>(out) + at * dtype_size(dtype));
      }
    }
  }
}

// The float64 reference path of the reduction (a float64 gradient): the
// double sums, each diagonal in row order, into a float64 [heads, n].
Tensor reduce_f64(const Tensor& grad, std::int64_t n, std::int64_t centre) {
  const std::int64_t heads = grad.size(0), i = grad.size(1), j = grad.size(2);
  Tensor out = Tensor::full({heads, n}, 0.0f, DType::kFloat64);
  double* o = out.mutable_data<double>();
  const double* g = grad.data<double>();
  const auto& st = grad.strides();
#pragma omp parallel for schedule(static) if (heads * i * j >= (1 << 16))
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        o[h * n + centre + (j - i + r) - c] += g[h * st[0] + r * st[1] + c * st[2]];
      }
    }
  }
  return out;
}

}  // namespace

void expand_distance_table_into(const Tensor& table, std::int64_t i, std::int64_t j, DType dtype,
                                void* out) {
  const ExpandShape shape = check_expand(table, i, j, dtype);
  if (shape.count == 0) return;
  if (out == nullptr) {
    throw std::invalid_argument(std::string(kExpand) + ": out is null for " +
                                std::to_string(shape.count) + " elements");
  }
  if (table.dtype() == DType::kFloat64 || dtype == DType::kFloat64) {
    expand_f64(table, i, j, shape.centre, dtype, out);
    return;
  }
  const std::int64_t heads = table.size(0);
  const std::int64_t head_stride = table.strides()[0];
  const std::int64_t entry_stride = table.strides()[1];
  const std::int64_t top = shape.centre + j - 1;  // R[0]
  const detail::TableFill fill = [&](std::int64_t k0, std::int64_t n, float* dst) {
    detail::with_float_type(table.dtype(), "distance table", [&](auto tag) {
      using T = decltype(tag);
      fill_reversed(table.data<T>(), heads, head_stride, entry_stride, top, k0, n, dst);
    });
  };
  const std::size_t bytes = static_cast<std::size_t>(shape.count) * dtype_size(dtype);
  detail::expand_generated_table(heads, i, j, dtype, out, bytes >= detail::stream_threshold_bytes(),
                                 fill);
}

Tensor expand_distance_table(const Tensor& table, std::int64_t i, std::int64_t j, DType dtype) {
  check_expand(table, i, j, dtype);  // before allocating (the _into form repeats it, cheaply)
  Tensor out = Tensor::empty({table.size(0), i, j}, dtype);
  expand_distance_table_into(table, i, j, dtype, out.raw_mutable_data());
  return out;
}

Tensor reduce_distance_table(const Tensor& grad, std::int64_t n) {
  const char* who = "reduce_distance_table";
  if (grad.dim() != 3) {
    throw std::invalid_argument(std::string(who) +
                                ": the gradient must be 3-d [heads, i, j], got shape " +
                                with_shape(grad));
  }
  const std::int64_t heads = grad.size(0);
  const std::int64_t i = grad.size(1);
  const std::int64_t j = grad.size(2);
  const std::int64_t centre = checked_centre(
      who, "n = " + std::to_string(n) + " for the gradient " + with_shape(grad), n, i, j);
  try {
    detail::checked_numel({heads, n}, DType::kFloat32);
  } catch (const std::length_error& e) {
    throw std::length_error(std::string(who) + ": the table [heads, n] = " +
                            detail::shape_string({heads, n}) + ": " + e.what());
  }
  if (grad.dtype() == DType::kFloat64) return reduce_f64(grad, n, centre);
  Tensor out = Tensor::full({heads, n}, 0.0f);
  if (heads == 0 || i == 0 || j == 0) return out;
  const Tensor g = contiguous_float32(grad);
  float* o = out.mutable_data<float>();
  const std::int64_t window = centre + 1 - i;  // where R's entry 0 lands before the reversal
  detail::ToeplitzReduceParams p;
  p.grad = g.data<float>();
  p.heads = heads;
  p.rows = i;
  p.cols = j;
  p.table = o + window;
  p.table_stride = n;
  p.row_offset0 = i - 1;
  detail::toeplitz_reduce(p);
  const std::int64_t span = i + j - 1;
  for (std::int64_t h = 0; h < heads; ++h) {
    float* w = o + h * n + window;
    std::reverse(w, w + span);
  }
  return out;
}

}  // namespace posbias
