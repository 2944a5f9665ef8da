// The float64 reference of Dynamic Position Bias (dpb.h:
// dpb_distance_table_f64 and its backward): the MLP of docs/spec.md in
// double, one distance at a time, with plain loops. The float32 module
// (dpb.cc, kernels/dpb_mlp.h) is the fast path; this one is what a float64
// model and torch.autograd.gradcheck need.
//
// One distance x goes through depth blocks (Linear, LayerNorm with norm,
// SiLU) and the output Linear; the backward keeps every block's
// pre-activation, normalised value and output for that one distance, so its
// memory is O(depth * dim) whatever j.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "dpb_params.h"
#include "posbias/dpb.h"

namespace posbias {
namespace {

using detail::DpbParamSpec;

// Contiguous double copies (or views) of the parameters, by kind, in module
// order: depth + 1 Linear layers, and depth LayerNorms with norm.
struct Mlp {
  std::int64_t dim = 0, heads = 0, depth = 0;
  bool norm = false;
  double eps = 0.0;
  std::vector<Tensor> keep;  // owns the contiguous values
  std::vector<const double*> weight, bias, ln_weight, ln_bias;
};

// Checks the options, the parameters (names, shapes, float64, finite) and
// returns the MLP over them.
Mlp checked_mlp(const char* who, const DpbOptions& o, const TensorMap& params) {
  detail::dpb_check_options(o);
  const std::vector<DpbParamSpec> specs = detail::dpb_param_specs(o);
  const std::string prefix = std::string(who) + ": ";
  std::vector<std::string> names;
  for (const DpbParamSpec& s : specs) names.push_back(s.name);
  if (params.size() != specs.size()) {
    std::vector<std::string> extra;
    for (const auto& kv : params) {
      bool known = false;
      for (const std::string& n : names) known = known || n == kv.first;
      if (!known) extra.push_back(kv.first);
    }
    if (!extra.empty()) {
      throw std::invalid_argument(prefix + "unexpected parameter " + detail::quoted_names(extra) +
                                  " (expected " + detail::quoted_names(names) + ")");
    }
  }
  Mlp m;
  m.dim = o.dim;
  m.heads = o.heads;
  m.depth = o.variant == DpbVariant::kZeta ? 2 : o.depth;
  m.norm = o.norm;
  m.eps = o.layernorm_eps;
  for (const DpbParamSpec& s : specs) {
    const auto it = params.find(s.name);
    if (it == params.end()) {
      throw std::invalid_argument(prefix + "missing parameter " + detail::quoted_name(s.name) +
                                  " (expected " + detail::quoted_names(names) + ")");
    }
    const Tensor& t = it->second;
    if (t.dtype() != DType::kFloat64 || t.shape() != s.shape) {
      throw std::invalid_argument(prefix + "parameter " + detail::quoted_name(s.name) +
                                  " must be float64 " + detail::shape_string(s.shape) + ", got " +
                                  dtype_name(t.dtype()) + " " + detail::shape_string(t.shape()));
    }
    Tensor c = t.is_contiguous() ? t : t.contiguous_copy();
    const double* p = c.data<double>();
    for (std::int64_t k = 0; k < c.numel(); ++k) {
      if (!std::isfinite(p[k])) {
        throw std::invalid_argument(prefix + "parameter " + detail::quoted_name(s.name) +
                                    " has a non-finite value at flat index " + std::to_string(k));
      }
    }
    detail::dpb_add_to_view(m, s.kind, p);
    m.keep.push_back(std::move(c));
  }
  return m;
}

// The MLP input of the table entry at signed distance s.
double input_of(const DpbOptions& o, std::int64_t s) {
  if (o.variant == DpbVariant::kZeta) return static_cast<double>(s < 0 ? -s : s);
  if (o.log_distance && s != 0) {
    const double a = std::log(static_cast<double>(s < 0 ? -s : s) + 1.0);
    return s < 0 ? -a : a;
  }
  return static_cast<double>(s);
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// One distance's forward, keeping what its backward needs: for block b,
// z(b) (the Linear's output), u(b) (after LayerNorm; z(b) without norm),
// rstd[b], and a(b) = silu(u(b)), each dim values.
struct Activations {
  std::int64_t dim;
  std::vector<double> zs, us, as, rstd;
  explicit Activations(const Mlp& m)
      : dim(m.dim),
        zs(static_cast<std::size_t>(m.depth * m.dim)),
        us(zs),
        as(zs),
        rstd(static_cast<std::size_t>(m.depth)) {}
  double* z(std::int64_t b) { return zs.data() + b * dim; }
  double* u(std::int64_t b) { return us.data() + b * dim; }
  double* a(std::int64_t b) { return as.data() + b * dim; }
};

// y[h] = MLP(x)[h], h < heads.
void forward_one(const Mlp& m, double x, Activations& act, double* y) {
  const std::int64_t dim = m.dim;
  for (std::int64_t b = 0; b < m.depth; ++b) {
    double* z = act.z(b);
    double* u = act.u(b);
    double* a = act.a(b);
    const double* w = m.weight[static_cast<std::size_t>(b)];
    const double* bias = m.bias[static_cast<std::size_t>(b)];
    const double* in = b > 0 ? act.a(b - 1) : nullptr;
    for (std::int64_t o = 0; o < dim; ++o) {
      double acc = bias[o];
      if (b == 0) {
        acc += w[o] * x;
      } else {
        for (std::int64_t k = 0; k < dim; ++k) acc += w[o * dim + k] * in[k];
      }
      z[o] = acc;
    }
    if (m.norm) {
      double mean = 0.0;
      for (std::int64_t o = 0; o < dim; ++o) mean += z[o];
      mean /= static_cast<double>(dim);
      double var = 0.0;
      for (std::int64_t o = 0; o < dim; ++o) var += (z[o] - mean) * (z[o] - mean);
      var /= static_cast<double>(dim);
      const double rstd = 1.0 / std::sqrt(var + m.eps);
      act.rstd[static_cast<std::size_t>(b)] = rstd;
      const double* gamma = m.ln_weight[static_cast<std::size_t>(b)];
      const double* beta = m.ln_bias[static_cast<std::size_t>(b)];
      for (std::int64_t o = 0; o < dim; ++o) u[o] = (z[o] - mean) * rstd * gamma[o] + beta[o];
    } else {
      for (std::int64_t o = 0; o < dim; ++o) u[o] = z[o];
    }
    for (std::int64_t o = 0; o < dim; ++o) a[o] = u[o] * sigmoid(u[o]);
  }
  const double* w = m.weight.back();
  const double* bias = m.bias.back();
  const double* in = act.a(m.depth - 1);
  for (std::int64_t h = 0; h < m.heads; ++h) {
    double acc = bias[h];
    for (std::int64_t k = 0; k < dim; ++k) acc += w[h * dim + k] * in[k];
    y[h] = acc;
  }
}

// Gradient buffers in module order, and where each kind's live.
struct Grads {
  std::vector<Tensor> tensors;
  std::vector<double*> weight, bias, ln_weight, ln_bias;
};

Grads zero_grads(const DpbOptions& o) {
  Grads g;
  for (const DpbParamSpec& s : detail::dpb_param_specs(o)) {
    Tensor t = Tensor::empty(s.shape, DType::kFloat64);
    double* p = t.mutable_data<double>();
    for (std::int64_t k = 0; k < t.numel(); ++k) p[k] = 0.0;
    detail::dpb_add_to_view(g, s.kind, p);
    g.tensors.push_back(std::move(t));
  }
  return g;
}

// Adds the parameter gradients of sum_h gy[h] * MLP(x)[h] to `g`, after
// forward_one(m, x, act, ...). ga and gz: dim values of scratch.
void backward_one(const Mlp& m, double x, const double* gy, Activations& act, Grads& g, double* ga,
                  double* gz) {
  const std::int64_t dim = m.dim;
  // Output Linear: ga = W^T gy is the gradient of a(depth - 1).
  {
    const double* w = m.weight.back();
    double* gw = g.weight.back();
    double* gb = g.bias.back();
    const double* in = act.a(m.depth - 1);
    for (std::int64_t k = 0; k < dim; ++k) ga[k] = 0.0;
    for (std::int64_t h = 0; h < m.heads; ++h) {
      gb[h] += gy[h];
      for (std::int64_t k = 0; k < dim; ++k) {
        gw[h * dim + k] += gy[h] * in[k];
        ga[k] += w[h * dim + k] * gy[h];
      }
    }
  }
  for (std::int64_t b = m.depth - 1; b >= 0; --b) {
    const std::size_t bs = static_cast<std::size_t>(b);
    const double* z = act.z(b);
    const double* u = act.u(b);
    // Through SiLU: d silu(u) / du = s (1 + u (1 - s)), s = sigmoid(u).
    for (std::int64_t o = 0; o < dim; ++o) {
      const double s = sigmoid(u[o]);
      gz[o] = ga[o] * s * (1.0 + u[o] * (1.0 - s));
    }
    if (m.norm) {
      // u = xhat gamma + beta, xhat = (z - mean) rstd: gz becomes the
      // gradient of z, rstd (gx - mean(gx) - xhat mean(gx xhat)).
      const double rstd = act.rstd[bs];
      const double* gamma = m.ln_weight[bs];
      double mean = 0.0;
      for (std::int64_t o = 0; o < dim; ++o) mean += z[o];
      mean /= static_cast<double>(dim);
      double sum_g = 0.0, sum_gx = 0.0;
      for (std::int64_t o = 0; o < dim; ++o) {
        const double xhat = (z[o] - mean) * rstd;
        g.ln_weight[bs][o] += gz[o] * xhat;
        g.ln_bias[bs][o] += gz[o];
        gz[o] *= gamma[o];  // the gradient of xhat
        sum_g += gz[o];
        sum_gx += gz[o] * xhat;
      }
      const double n = static_cast<double>(dim);
      for (std::int64_t o = 0; o < dim; ++o) {
        const double xhat = (z[o] - mean) * rstd;
        gz[o] = rstd * (gz[o] - sum_g / n - xhat * sum_gx / n);
      }
    }
    // gz is the gradient of z(b) = W a(b - 1) + bias (W x + bias for b = 0).
    const double* w = m.weight[bs];
    double* gw = g.weight[bs];
    double* gb = g.bias[bs];
    if (b == 0) {
      for (std::int64_t o = 0; o < dim; ++o) {
        gw[o] += gz[o] * x;
        gb[o] += gz[o];
      }
      break;
    }
    const double* in = act.a(b - 1);
    for (std::int64_t k = 0; k < dim; ++k) ga[k] = 0.0;
    for (std::int64_t o = 0; o < dim; ++o) {
      gb[o] += gz[o];
      for (std::int64_t k = 0; k < dim; ++k) {
        gw[o * dim + k] += gz[o] * in[k];
        ga[k] += w[o * dim + k] * gz[o];
      }
    }
  }
}

}  // namespace

Tensor dpb_distance_table_f64(const DpbOptions& options, const TensorMap& params, std::int64_t j) {
  constexpr const char* kWho = "dpb_distance_table_f64";
  const Mlp m = checked_mlp(kWho, options, params);
  const std::int64_t len = detail::checked_table_length(kWho, options.heads, j);
  Tensor out = Tensor::empty({options.heads, len}, DType::kFloat64);
  double* o = out.mutable_data<double>();
  const bool zeta = options.variant == DpbVariant::kZeta;
  // zeta's table is symmetric: the MLP runs on distances 0..j-1 (entries
  // j-1..2j-2), mirrored below.
  const std::int64_t first = zeta ? j - 1 : 0;
#pragma omp parallel if ((len - first) * m.dim * m.dim * m.depth >= (1 << 20))
  {
    Activations act(m);
    std::vector<double> y(static_cast<std::size_t>(m.heads));
#pragma omp for schedule(static)
    for (std::int64_t e = first; e < len; ++e) {
      forward_one(m, input_of(options, e - (j - 1)), act, y.data());
      for (std::int64_t h = 0; h < m.heads; ++h) o[h * len + e] = y[static_cast<std::size_t>(h)];
    }
  }
  for (std::int64_t h = 0; h < options.heads; ++h) {
    for (std::int64_t e = 0; e < first; ++e) o[h * len + e] = o[h * len + 2 * (j - 1) - e];
  }
  return out;
}

TensorMap dpb_backward_distance_table_f64(const DpbOptions& options, const TensorMap& params,
                                          std::int64_t j, const Tensor& grad) {
  constexpr const char* kWho = "dpb_backward_distance_table_f64";
  const Mlp m = checked_mlp(kWho, options, params);
  const std::int64_t len = detail::checked_table_length(kWho, options.heads, j);
  const std::vector<std::int64_t> want = {options.heads, len};
  if (grad.dtype() != DType::kFloat64 || grad.shape() != want) {
    throw std::invalid_argument(
        std::string(kWho) + ": grad must be float64 " + detail::shape_string(want) +
        " ([heads, 2j - 1] for j = " + std::to_string(j) + "), got " + dtype_name(grad.dtype()) +
        " " + detail::shape_string(grad.shape()));
  }
  const Tensor gc = grad.is_contiguous() ? grad : grad.contiguous_copy();
  const double* gp = gc.data<double>();
  Grads g = zero_grads(options);
  Activations act(m);
  std::vector<double> gy(static_cast<std::size_t>(m.heads));
  std::vector<double> ga(static_cast<std::size_t>(m.dim)), gz(ga);
  std::vector<double> y(static_cast<std::size_t>(m.heads));
  const bool zeta = options.variant == DpbVariant::kZeta;
  // zeta: entries e and 2(j - 1) - e share distance |e - (j - 1)|; their
  // gradients are summed first and the MLP backward runs once per distance.
  const std::int64_t first = zeta ? j - 1 : 0;
  for (std::int64_t e = first; e < len; ++e) {
    for (std::int64_t h = 0; h < m.heads; ++h) {
      double v = gp[h * len + e];
      if (zeta && e > j - 1) v += gp[h * len + 2 * (j - 1) - e];
      gy[static_cast<std::size_t>(h)] = v;
    }
    const double x = input_of(options, e - (j - 1));
    forward_one(m, x, act, y.data());
    backward_one(m, x, gy.data(), act, g, ga.data(), gz.data());
  }
  TensorMap out;
  const std::vector<DpbParamSpec> specs = detail::dpb_param_specs(options);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    out.emplace(specs[k].name, std::move(g.tensors[k]));
  }
  return out;
}

}  // namespace posbias
