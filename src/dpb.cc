// Front functions of Dynamic Position Bias: options and argument checks,
// parameters (initialisation, state dict, files), and the three steps of
// every call: the MLP on the distances (kernels/dpb_mlp.h), the table in the
// output dtype, and its Toeplitz expansion (kernels/toeplitz.h, the table
// produced tile by tile as the expansion needs it) or, going backward, the
// reduction onto the distance table (reduce_distance_table, public).
//
// Tables by signed distance. For a call (i, j) the bias needs the distances
// s = q_r - c from 1 - i to j - 1. The expansion reads row r of head h as a
// window of a table R[h][m], m in [0, i + j - 1), with R[m] = value at
// distance s = j - 1 - m and row_offset0 = i - 1:
//
//     out[h][r][c] = R[h][i - 1 - r + c],  j - 1 - (i - 1 - r + c) = j - i + r - c = q_r - c.
//
// The x-transformers MLP therefore runs on exactly those i + j - 1 signed
// distances, in the order of R (a decode step, i = 1, costs j inputs, not
// 2j - 1); zeta's runs on the j distances 0..j-1 and R mirrors them.
#include "posbias/dpb.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "checks.h"
#include "dpb_params.h"
#include "kernels/dpb_mlp.h"
#include "kernels/toeplitz.h"
#include "posbias/distance_table.h"

namespace posbias {
namespace {

using ParamKind = detail::DpbParamKind;
using ParamSpec = detail::DpbParamSpec;

const char* variant_name(DpbVariant v) {
  return v == DpbVariant::kZeta ? "zeta" : "x-transformers";
}

void check_options(const DpbOptions& o) {
  detail::check_at_least("DynamicPositionBias: dim", o.dim, 1);
  detail::check_at_least("DynamicPositionBias: heads", o.heads, 1);
  if (o.variant != DpbVariant::kZeta && o.variant != DpbVariant::kXTransformers) {
    throw std::invalid_argument("DynamicPositionBias: unknown variant " +
                                std::to_string(static_cast<int>(o.variant)));
  }
  detail::check_at_least("DynamicPositionBias: depth", o.depth, 1);
  if (o.variant == DpbVariant::kZeta && (o.depth != 2 || o.log_distance || o.norm)) {
    std::ostringstream msg;
    msg << "DynamicPositionBias: the zeta variant has depth 2, no log_distance and no norm; got "
           "depth = "
        << o.depth << ", log_distance = " << o.log_distance << ", norm = " << o.norm
        << " (use DpbVariant::kXTransformers)";
    throw std::invalid_argument(msg.str());
  }
  // The float32 kernels use eps's float rounding: it must stay finite.
  if (o.norm && !(std::isfinite(static_cast<float>(o.layernorm_eps)) && o.layernorm_eps >= 0.0)) {
    std::ostringstream msg;
    msg << "DynamicPositionBias: layernorm_eps must be finite and >= 0, got " << o.layernorm_eps;
    throw std::invalid_argument(msg.str());
  }
}

// Bytes a module needs per parameter tensor besides its values, at the peak
// of a forward call: the Tensor (shape and strides vectors, storage handle
// and control block), its name, the allocator's rounding to 64 bytes, and
// the parameter list a call builds again (ParamSpec, the kernel's
// pointers). Measured about 600 (depth 3e6, dim 4: 3.6 GB peak).
constexpr double kBytesPerParameterTensor = 768;

// Checks, before anything is built, that the module fits in memory: its
// parameters (counted with overflow-checked arithmetic), the per-tensor
// overhead, and one thread's working memory for a forward call. A depth
// of 1e12 made the constructor list 2e12 parameter names (a hang). Returns
// the estimated bytes.
double check_module_size(const DpbOptions& o) {
  const std::int64_t blocks = o.variant == DpbVariant::kZeta ? 2 : o.depth;
  // Per block after the first: Linear(dim, dim) (+ LayerNorm); first:
  // Linear(1, dim); output: Linear(dim, heads).
  std::int64_t per_block = 0;
  std::int64_t values = 0;
  std::int64_t tensors = 0;
  const bool overflow =
      __builtin_mul_overflow(o.dim, o.dim + 1 + (o.norm ? 2 : 0), &per_block) ||
      __builtin_mul_overflow(per_block, blocks - 1, &values) ||
      __builtin_add_overflow(values, 2 * o.dim + (o.norm ? 2 * o.dim : 0), &values) ||
      __builtin_add_overflow(values, o.heads, &values) ||
      __builtin_mul_overflow(o.heads, o.dim, &per_block) ||
      __builtin_add_overflow(values, per_block, &values) ||
      __builtin_mul_overflow(blocks, o.norm ? 4 : 2, &tensors) ||
      __builtin_add_overflow(tensors, 2, &tensors);
  std::ostringstream what;
  what << "DynamicPositionBias: dim " << o.dim << ", heads " << o.heads << ", depth " << o.depth
       << (o.norm ? " with norm" : "");
  if (overflow) {
    throw std::length_error(what.str() + ": the parameter count overflows int64");
  }
  const double bytes =
      static_cast<double>(values) * sizeof(float) +
      static_cast<double>(tensors) * kBytesPerParameterTensor +
      detail::dpb_mlp_scratch_bytes(o.dim, o.heads, blocks, o.norm, /*backward=*/false);
  if (bytes > static_cast<double>(detail::physical_memory_bytes())) {
    what << ": " << values << " parameters in " << tensors << " tensors need about ";
    // bytes may exceed 2^64 (a depth near INT64_MAX): converting it to an
    // integer would be undefined, so print it as a double there.
    if (bytes < 1e18) {
      what << static_cast<std::uint64_t>(bytes);
    } else {
      what << bytes;
    }
    what << " bytes (with the MLP's working memory), more than this machine's "
         << detail::physical_memory_bytes() << " bytes of memory";
    throw std::length_error(what.str());
  }
  return bytes;
}

// The parameters in module (state-dict) order.
std::vector<ParamSpec> param_specs(const DpbOptions& o) {
  std::vector<ParamSpec> s;
  const auto linear = [&](const std::string& prefix, std::int64_t in, std::int64_t out) {
    s.push_back({prefix + ".weight", {out, in}, ParamKind::kLinearWeight, in});
    s.push_back({prefix + ".bias", {out}, ParamKind::kLinearBias, in});
  };
  if (o.variant == DpbVariant::kZeta) {
    // nn.Sequential(Linear, SiLU, Linear, SiLU, Linear): indices 0, 2, 4.
    linear("mlp.0", 1, o.dim);
    linear("mlp.2", o.dim, o.dim);
    linear("mlp.4", o.dim, o.heads);
    return s;
  }
  // ModuleList of depth Sequential(Linear, [LayerNorm], SiLU), then a Linear.
  for (std::int64_t b = 0; b < o.depth; ++b) {
    const std::string block = "mlp." + std::to_string(b);
    linear(block + ".0", b == 0 ? 1 : o.dim, o.dim);
    if (o.norm) {
      s.push_back({block + ".1.weight", {o.dim}, ParamKind::kNormWeight, 0});
      s.push_back({block + ".1.bias", {o.dim}, ParamKind::kNormBias, 0});
    }
  }
  linear("mlp." + std::to_string(o.depth), o.dim, o.heads);
  return s;
}

// Uniform in [-bound, bound] from 53 random bits, in double, rounded once
// to float: the same numbers on every platform and standard library
// (std::uniform_real_distribution is not specified bit for bit).
float uniform(std::mt19937_64& rng, double bound) {
  const double u = static_cast<double>(rng() >> 11) * 0x1p-53;  // [0, 1)
  return static_cast<float>(bound * (2.0 * u - 1.0));
}

void check_lengths(const char* who, std::int64_t i, std::int64_t j) {
  if (i < 0 || j < 0 || i > j) {
    throw std::invalid_argument(std::string("DynamicPositionBias::") + who +
                                ": need 0 <= i <= j (i and j are lengths), got i = " +
                                std::to_string(i) + ", j = " + std::to_string(j));
  }
}

// Checks j (>= 1) and that a float32 [heads, 2j - 1] table (signed = true)
// or [heads, j] table fits in memory, before 2j - 1 is formed (it overflows
// int64 for j > 2^62); returns the table's length per head.
std::int64_t checked_table_length(const char* who, std::int64_t heads, std::int64_t j,
                                  bool signed_distances) {
  if (j < 1) {
    throw std::invalid_argument(std::string("DynamicPositionBias::") + who +
                                ": j must be >= 1, got " + std::to_string(j));
  }
  std::int64_t len = j;
  if (signed_distances && __builtin_mul_overflow(j, std::int64_t{2}, &len)) {
    throw std::length_error(std::string("DynamicPositionBias::") + who +
                            ": j = " + std::to_string(j) +
                            " is too large: the table's 2j - 1 entries per head overflow int64");
  }
  if (signed_distances) len -= 1;
  try {
    detail::checked_numel({heads, len}, DType::kFloat32);
  } catch (const std::length_error& e) {
    throw std::length_error(std::string("DynamicPositionBias::") + who +
                            ": j = " + std::to_string(j) + ": " + e.what());
  }
  return len;
}

void check_grad_shape(const char* who, const Tensor& grad,
                      const std::vector<std::int64_t>& expected) {
  if (grad.shape() != expected) {
    throw std::invalid_argument(std::string("DynamicPositionBias::") + who +
                                ": gradient must have shape " + detail::shape_string(expected) +
                                ", got " + detail::shape_string(grad.shape()));
  }
}

// The gradient as contiguous float32 (a copy only when needed).
Tensor contiguous_float(const Tensor& t) {
  if (t.dtype() == DType::kFloat32 && t.is_contiguous()) return t;
  return t.to(DType::kFloat32);
}

// The MLP input for signed distance s (x-transformers: optionally
// sign(s) ln(|s| + 1), evaluated in double and rounded once).
float mlp_input(const DpbOptions& o, std::int64_t s) {
  if (o.log_distance && s != 0) {
    const double a = std::log(static_cast<double>(s < 0 ? -s : s) + 1.0);
    return static_cast<float>(s < 0 ? -a : a);
  }
  return static_cast<float>(s);
}

}  // namespace

namespace detail {

void dpb_check_options(const DpbOptions& o) { check_options(o); }

std::vector<DpbParamSpec> dpb_param_specs(const DpbOptions& o) { return param_specs(o); }

}  // namespace detail

// ------------------------------------------------------------ construction

namespace {

// Parameters initialised as the constructor says, in state-dict order.
void init_parameters(const DpbOptions& options, std::uint64_t seed, std::vector<std::string>& names,
                     std::vector<Tensor>& params) {
  const std::vector<ParamSpec> specs = param_specs(options);
  std::mt19937_64 rng(seed);
  for (const ParamSpec& s : specs) {
    names.push_back(s.name);
    Tensor t = Tensor::empty(s.shape, DType::kFloat32);
    float* p = t.mutable_data<float>();
    const std::int64_t n = t.numel();
    switch (s.kind) {
      case ParamKind::kLinearWeight:
      case ParamKind::kLinearBias: {
        // nn.Linear.reset_parameters: kaiming_uniform_(a = sqrt(5)) for the
        // weight, i.e. bound sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in),
        // and the same bound for the bias.
        const double bound = 1.0 / std::sqrt(static_cast<double>(s.fan_in));
        for (std::int64_t k = 0; k < n; ++k) p[k] = uniform(rng, bound);
        break;
      }
      case ParamKind::kNormWeight:
        std::fill(p, p + n, 1.0f);
        break;
      case ParamKind::kNormBias:
        std::fill(p, p + n, 0.0f);
        break;
    }
    params.push_back(std::move(t));
  }
}

}  // namespace

DynamicPositionBias::DynamicPositionBias(std::int64_t dim, std::int64_t heads, std::uint64_t seed)
    : DynamicPositionBias(
          [&] {
            DpbOptions o;
            o.dim = dim;
            o.heads = heads;
            return o;
          }(),
          seed) {}

DynamicPositionBias::DynamicPositionBias(const DpbOptions& options, std::uint64_t seed)
    : options_(options) {
  check_options(options_);
  const double bytes = check_module_size(options_);
  try {
    init_parameters(options_, seed, names_, params_);
  } catch (const std::bad_alloc&) {
    // Within the memory bound, but the allocator said no (an address-space
    // limit, memory taken by others): the same error as any failed
    // allocation, with the module's estimated size.
    std::ostringstream what;
    what << "the parameters of DynamicPositionBias (dim " << options_.dim << ", heads "
         << options_.heads << ", depth " << options_.depth << ")";
    throw detail::allocation_error(static_cast<std::size_t>(bytes), what.str());
  }
}

// ------------------------------------------------------------------- the MLP

namespace {

// A view of the parameters for the kernels, after checking that none was
// replaced (through mutable_parameter) by a tensor of another shape, dtype or
// layout.
detail::DpbMlp mlp_view(const DpbOptions& o, const std::vector<Tensor>& params) {
  const std::vector<ParamSpec> specs = param_specs(o);
  detail::DpbMlp m;
  m.dim = o.dim;
  m.heads = o.heads;
  m.depth = o.depth;
  m.norm = o.norm;
  m.eps = static_cast<float>(o.layernorm_eps);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const Tensor& t = params[k];
    if (t.shape() != specs[k].shape || t.dtype() != DType::kFloat32 || !t.is_contiguous()) {
      throw std::invalid_argument(
          "DynamicPositionBias: parameter " + specs[k].name + " must be contiguous float32 " +
          detail::shape_string(specs[k].shape) + ", but it is " + dtype_name(t.dtype()) + " " +
          detail::shape_string(t.shape()) + (t.is_contiguous() ? "" : " (strided)") +
          " (replaced through mutable_parameter?)");
    }
    detail::dpb_add_to_view(m, specs[k].kind, t.data<float>());
  }
  return m;
}

// MLP outputs for the signed distances s_k = s0 + k * step, k < n, into
// y[h * y_stride + k].
void run_mlp(const DpbOptions& o, const detail::DpbMlp& m, std::int64_t s0, std::int64_t step,
             std::int64_t n, float* y, std::int64_t y_stride) {
  std::vector<float> x;
  detail::resize_scratch(x, n, "the DynamicPositionBias MLP's inputs");
  for (std::int64_t k = 0; k < n; ++k) x[static_cast<std::size_t>(k)] = mlp_input(o, s0 + k * step);
  detail::dpb_mlp_forward(m, x.data(), n, y, y_stride);
}

// zeta's table mirrored into signed order: dst[h][e] = t[h][|e - center|]
// for e < len, where t is [heads][j] (t_stride apart).
void mirror(const float* t, std::int64_t t_stride, std::int64_t heads, std::int64_t center,
            std::int64_t len, float* dst) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* th = t + h * t_stride;
    float* dh = dst + h * len;
    for (std::int64_t e = 0; e < len; ++e) dh[e] = th[e < center ? center - e : e - center];
  }
}

// Gradient of the j-entry zeta table from a signed one: gT[d] = gS[c + d] +
// gS[c - d] (d > 0), gT[0] = gS[c], c = center; entries outside [0, len)
// count as zero.
void fold(const float* gs, std::int64_t heads, std::int64_t center, std::int64_t len,
          std::int64_t j, float* gt) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* sh = gs + h * len;
    float* th = gt + h * j;
    for (std::int64_t dd = 0; dd < j; ++dd) {
      const std::int64_t up = center + dd;
      const std::int64_t down = center - dd;
      float v = up < len ? sh[up] : 0.0f;
      if (dd > 0 && down >= 0) v += sh[down];
      th[dd] = v;
    }
  }
}

// Gradient tensors shaped like the parameters, and the kernel's view of them.
TensorMap make_grads(const DpbOptions& o, detail::DpbMlpGrads& view) {
  TensorMap out;
  for (const ParamSpec& s : param_specs(o)) {
    Tensor t = Tensor::full(s.shape, 0.0f);
    detail::dpb_add_to_view(view, s.kind, t.mutable_data<float>());
    out.emplace(s.name, std::move(t));
  }
  return out;
}

// Parameter gradients of sum_{h,k} g[h][k] * MLP(x(s0 + k * step))[h].
TensorMap mlp_backward(const DpbOptions& o, const detail::DpbMlp& m, std::int64_t s0,
                       std::int64_t step, std::int64_t n, const float* g, std::int64_t g_stride) {
  detail::DpbMlpGrads view;
  TensorMap grads = make_grads(o, view);
  if (n == 0) return grads;
  std::vector<float> x;
  detail::resize_scratch(x, n, "the DynamicPositionBias MLP's inputs");
  for (std::int64_t k = 0; k < n; ++k) x[static_cast<std::size_t>(k)] = mlp_input(o, s0 + k * step);
  detail::dpb_mlp_backward(m, x.data(), n, g, g_stride, view);
  return grads;
}

}  // namespace

// ------------------------------------------------------------------- forward

DynamicPositionBias DynamicPositionBias::clone() const {
  DynamicPositionBias copy = *this;
  for (Tensor& p : copy.params_) p = p.contiguous_copy();
  return copy;
}

void DynamicPositionBias::forward_into(std::int64_t i, std::int64_t j, DType dtype,
                                       void* out) const {
  check_lengths("forward_into", i, j);
  check_output_dtype(dtype, "DynamicPositionBias::forward_into");
  const std::int64_t n = detail::checked_numel({options_.heads, i, j}, dtype);
  if (n == 0) return;
  if (out == nullptr) {
    throw std::invalid_argument("DynamicPositionBias::forward_into: out is null for " +
                                std::to_string(n) + " elements");
  }
  const detail::DpbMlp m = mlp_view(options_, params_);
  // Entry k of the table is the signed distance j - 1 - k (k < i + j - 1).
  // The table is produced whole, or tile by tile when it would be about as
  // large as the output (few rows), each entry from the MLP about once.
  const detail::TableFill fill = [&](std::int64_t k0, std::int64_t count, float* dst) {
    const std::int64_t top = (j - 1) - k0;  // distance of entry k0
    if (options_.variant != DpbVariant::kZeta) {
      run_mlp(options_, m, top, -1, count, dst, count);
      return;
    }
    // zeta: |distance|. Entries [0, a) have distances top .. 0; the negative
    // ones after them mirror those (|d| <= top) and the MLP runs only on
    // the rest (|d| > top).
    const std::int64_t a = top >= 0 ? std::min(count, top + 1) : 0;
    if (a > 0) run_mlp(options_, m, top, -1, a, dst, count);
    const std::int64_t mirrored = top >= 0 ? std::min(count - a, top) : 0;
    for (std::int64_t h = 0; h < options_.heads; ++h) {
      float* row = dst + h * count;
      for (std::int64_t t = 0; t < mirrored; ++t) row[a + t] = row[top - 1 - t];
    }
    const std::int64_t rest = a + mirrored;
    if (rest < count) run_mlp(options_, m, rest - top, 1, count - rest, dst + rest, count);
  };
  detail::expand_generated_table(
      options_.heads, i, j, dtype, out,
      static_cast<std::size_t>(n) * dtype_size(dtype) >= detail::stream_threshold_bytes(), fill);
}

Tensor DynamicPositionBias::forward(std::int64_t i, std::int64_t j, DType dtype) const {
  check_lengths("forward", i, j);
  check_output_dtype(dtype, "DynamicPositionBias::forward");
  Tensor out = Tensor::empty({options_.heads, i, j}, dtype);
  forward_into(i, j, dtype, out.raw_mutable_data());
  return out;
}

Tensor DynamicPositionBias::table(std::int64_t j) const {
  if (options_.variant != DpbVariant::kZeta) return distance_table(j);
  checked_table_length("table", options_.heads, j, false);
  Tensor out = Tensor::empty({options_.heads, j}, DType::kFloat32);
  run_mlp(options_, mlp_view(options_, params_), 0, 1, j, out.mutable_data<float>(), j);
  return out;
}

Tensor DynamicPositionBias::distance_table(std::int64_t j) const {
  const std::int64_t len = checked_table_length("distance_table", options_.heads, j, true);
  Tensor out = Tensor::empty({options_.heads, len}, DType::kFloat32);
  const detail::DpbMlp m = mlp_view(options_, params_);
  if (options_.variant == DpbVariant::kZeta) {
    std::vector<float> t(static_cast<std::size_t>(options_.heads * j));
    run_mlp(options_, m, 0, 1, j, t.data(), j);
    mirror(t.data(), j, options_.heads, j - 1, len, out.mutable_data<float>());
  } else {
    run_mlp(options_, m, -(j - 1), 1, len, out.mutable_data<float>(), len);
  }
  return out;
}

// ------------------------------------------------------------------ backward

TensorMap DynamicPositionBias::backward(std::int64_t i, std::int64_t j,
                                        const Tensor& grad_bias) const {
  check_lengths("backward", i, j);
  check_grad_shape("backward", grad_bias, {options_.heads, i, j});
  const detail::DpbMlp m = mlp_view(options_, params_);
  if (i == 0) return mlp_backward(options_, m, 0, 1, 0, nullptr, 0);
  // The gradient of distance_table(j): entry e is distance e - (j - 1).
  const std::int64_t len = checked_table_length("backward", options_.heads, j, true);
  const Tensor gs = reduce_distance_table(grad_bias, len);
  const float* g = gs.data<float>();
  if (options_.variant == DpbVariant::kZeta) {
    std::vector<float> gt(static_cast<std::size_t>(options_.heads * j));
    fold(g, options_.heads, j - 1, len, j, gt.data());
    return mlp_backward(options_, m, 0, 1, j, gt.data(), j);
  }
  // Only the distances 1 - i .. j - 1 occur (entries j - i .. 2j - 2): the
  // MLP backward runs on those i + j - 1 inputs (a decode step costs j).
  return mlp_backward(options_, m, 1 - i, 1, i + j - 1, g + (j - i), len);
}

TensorMap DynamicPositionBias::backward_table(std::int64_t j, const Tensor& grad_table) const {
  const bool signed_distances = options_.variant != DpbVariant::kZeta;
  const std::int64_t len =
      checked_table_length("backward_table", options_.heads, j, signed_distances);
  if (signed_distances) {
    check_grad_shape("backward_table", grad_table, {options_.heads, len});
    return backward_distance_table(j, grad_table);
  }
  check_grad_shape("backward_table", grad_table, {options_.heads, j});
  const Tensor g = contiguous_float(grad_table);
  return mlp_backward(options_, mlp_view(options_, params_), 0, 1, j, g.data<float>(), j);
}

TensorMap DynamicPositionBias::backward_distance_table(std::int64_t j, const Tensor& grad) const {
  const std::int64_t len = checked_table_length("backward_distance_table", options_.heads, j, true);
  check_grad_shape("backward_distance_table", grad, {options_.heads, len});
  const Tensor g = contiguous_float(grad);
  const detail::DpbMlp m = mlp_view(options_, params_);
  if (options_.variant == DpbVariant::kZeta) {
    // Entry e is distance e - (j - 1); |distance| = d at e = j - 1 +- d.
    std::vector<float> gt(static_cast<std::size_t>(options_.heads * j));
    fold(g.data<float>(), options_.heads, j - 1, len, j, gt.data());
    return mlp_backward(options_, m, 0, 1, j, gt.data(), j);
  }
  return mlp_backward(options_, m, -(j - 1), 1, len, g.data<float>(), len);
}

// ---------------------------------------------------------------- parameters

std::vector<std::string> DynamicPositionBias::parameter_names() const { return names_; }

namespace {

[[noreturn]] void throw_unknown_name(const std::string& name,
                                     const std::vector<std::string>& names) {
  throw std::invalid_argument("DynamicPositionBias: no parameter named " +
                              detail::quoted_name(name) +
                              " (parameters: " + detail::quoted_names(names) + ")");
}

}  // namespace

const Tensor& DynamicPositionBias::parameter(const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) throw_unknown_name(name, names_);
  return params_[static_cast<std::size_t>(it - names_.begin())];
}

Tensor& DynamicPositionBias::mutable_parameter(const std::string& name) {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) throw_unknown_name(name, names_);
  return params_[static_cast<std::size_t>(it - names_.begin())];
}

TensorMap DynamicPositionBias::state_dict() const {
  TensorMap out;
  for (std::size_t k = 0; k < names_.size(); ++k) out.emplace(names_[k], params_[k]);
  return out;
}

void DynamicPositionBias::load_state_dict(const TensorMap& state) {
  const std::string who = "DynamicPositionBias::load_state_dict: ";
  const std::vector<ParamSpec> specs = param_specs(options_);
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  for (const ParamSpec& s : specs) {
    if (state.find(s.name) == state.end()) missing.push_back(s.name);
  }
  for (const auto& kv : state) {
    if (std::find(names_.begin(), names_.end(), kv.first) == names_.end()) {
      unexpected.push_back(kv.first);
    }
  }
  if (!missing.empty() || !unexpected.empty()) {
    // Names are quoted and lists shortened: a key from a file may be empty,
    // hold control bytes or be a megabyte long, and a file may hold a
    // million of them.
    std::string msg = who;
    if (!missing.empty()) msg += "missing " + detail::quoted_names(missing);
    if (!unexpected.empty()) {
      msg += std::string(missing.empty() ? "" : "; ") + "unexpected " +
             detail::quoted_names(unexpected);
    }
    std::ostringstream expect;
    expect << " (a " << variant_name(options_.variant) << " module with dim " << options_.dim
           << ", heads " << options_.heads;
    if (options_.variant != DpbVariant::kZeta) {
      expect << ", depth " << options_.depth << (options_.norm ? ", norm" : "");
    }
    expect << " has " << detail::quoted_names(names_) << ")";
    throw std::invalid_argument(msg + expect.str());
  }
  // Check and convert everything before changing anything.
  std::vector<Tensor> loaded;
  for (const ParamSpec& s : specs) {
    const Tensor& t = state.at(s.name);
    if (t.shape() != s.shape) {
      throw std::invalid_argument(who + s.name + ": expected shape " +
                                  detail::shape_string(s.shape) + ", got " +
                                  detail::shape_string(t.shape()));
    }
    Tensor f = t.to(DType::kFloat32);
    const float* p = f.data<float>();
    const std::int64_t n = f.numel();
    for (std::int64_t k = 0; k < n; ++k) {
      if (!std::isfinite(p[k])) {
        std::vector<std::int64_t> index(s.shape.size());
        std::int64_t rest = k;
        for (std::size_t dd = s.shape.size(); dd-- > 0;) {
          index[dd] = rest % s.shape[dd];
          rest /= s.shape[dd];
        }
        std::ostringstream msg;
        msg << who << s.name << ": element " << detail::shape_string(index) << " is not finite ("
            << p[k] << ")";
        throw std::invalid_argument(msg.str());
      }
    }
    loaded.push_back(std::move(f));
  }
  // Copy into the existing storage when it is intact, so that handles from
  // state_dict() and parameter() see the new values.
  for (std::size_t k = 0; k < specs.size(); ++k) {
    Tensor& dst = params_[k];
    if (dst.shape() == specs[k].shape && dst.dtype() == DType::kFloat32 && dst.is_contiguous()) {
      std::memcpy(dst.mutable_data<float>(), loaded[k].data<float>(),
                  static_cast<std::size_t>(loaded[k].numel()) * sizeof(float));
    } else {
      dst = std::move(loaded[k]);
    }
  }
}

void DynamicPositionBias::save(const std::string& path) const {
  save_safetensors(path, state_dict(), {{"format", "pt"}});
}

void DynamicPositionBias::load(const std::string& path) {
  const TensorMap state = load_safetensors(path);
  try {
    load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace posbias
