// Helpers shared by the DynamicPositionBias tests (dpb_*_test.cc): the
// golden tolerance, option builders, and a double-precision reference of
// the MLP of docs/spec.md (forward and backward) with the naive bias and naive
// gradients built from it.
#ifndef POSBIAS_TESTS_UNIT_DPB_REFERENCE_H_
#define POSBIAS_TESTS_UNIT_DPB_REFERENCE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/dpb_mlp.h"
#include "posbias/dpb.h"
#include "posbias/tensor.h"

namespace posbias::test {

// The golden tolerance: |a - b| <= atol + rtol |b|.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         const std::string& what, double atol = 1e-6, double rtol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double a = got[k];
    const double b = want[k];
    if (!(std::fabs(a - b) <= atol + rtol * std::fabs(b))) {
      FAIL() << what << ": element " << k << " is " << a << ", expected " << b << " (difference "
             << a - b << ")";
    }
  }
}

inline DpbOptions xt_options(std::int64_t dim, std::int64_t heads, std::int64_t depth,
                             bool log_distance, bool norm) {
  DpbOptions o;
  o.dim = dim;
  o.heads = heads;
  o.variant = DpbVariant::kXTransformers;
  o.depth = depth;
  o.log_distance = log_distance;
  o.norm = norm;
  return o;
}

inline std::string describe(const DpbOptions& o) {
  std::string s = o.variant == DpbVariant::kZeta ? "zeta" : "xt";
  s += " dim" + std::to_string(o.dim) + " heads" + std::to_string(o.heads);
  if (o.variant != DpbVariant::kZeta) {
    s += " depth" + std::to_string(o.depth) + (o.log_distance ? " log" : "") +
         (o.norm ? " norm" : "");
  }
  return s;
}

// Gives the LayerNorms of a module non-trivial affine parameters (the
// default 1 and 0 would hide a mix-up of weight and bias).
// x-transformers LayerNorm parameters are mlp.<block>.1.<weight|bias>
// (four components; mlp.1.weight is a Linear).
inline bool is_norm_param(const std::string& name) {
  std::vector<std::string> parts(1);
  for (char ch : name) {
    if (ch == '.') {
      parts.emplace_back();
    } else {
      parts.back() += ch;
    }
  }
  return parts.size() == 4 && parts[2] == "1";
}

inline bool is_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

// The kernel's view of a module's parameters, as dpb.cc builds it.
inline detail::DpbMlp kernel_view(const DynamicPositionBias& m) {
  const DpbOptions& o = m.options();
  detail::DpbMlp k;
  k.dim = o.dim;
  k.heads = o.heads;
  k.depth = o.depth;
  k.norm = o.norm;
  k.eps = static_cast<float>(o.layernorm_eps);
  for (const std::string& name : m.parameter_names()) {
    const float* p = m.parameter(name).data<float>();
    if (is_norm_param(name)) {
      (is_weight(name) ? k.ln_weight : k.ln_bias).push_back(p);
    } else {
      (is_weight(name) ? k.weight : k.bias).push_back(p);
    }
  }
  return k;
}

inline void randomise_norms(DynamicPositionBias& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const std::string& name : m.parameter_names()) {
    if (!is_norm_param(name)) continue;
    Tensor& t = m.mutable_parameter(name);
    float* p = t.mutable_data<float>();
    for (std::int64_t k = 0; k < t.numel(); ++k) {
      p[k] = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
}

// ------------------------------------------------ naive reference (double)

// The MLP of docs/spec.md evaluated in double, one input at a time, from the
// module's parameters (names written out here independently of the library).
class RefMlp {
 public:
  explicit RefMlp(const DynamicPositionBias& m) : o_(m.options()) {
    const bool zeta = o_.variant == DpbVariant::kZeta;
    for (std::int64_t l = 0; l <= o_.depth; ++l) {
      std::string prefix;
      if (zeta) {
        prefix = "mlp." + std::to_string(2 * l);
      } else {
        prefix = "mlp." + std::to_string(l) + (l < o_.depth ? ".0" : "");
      }
      linear_.push_back(prefix);
      w_.push_back(values(m.parameter(prefix + ".weight")));
      b_.push_back(values(m.parameter(prefix + ".bias")));
      if (o_.norm && l < o_.depth) {
        const std::string ln = "mlp." + std::to_string(l) + ".1";
        norm_.push_back(ln);
        g_.push_back(values(m.parameter(ln + ".weight")));
        beta_.push_back(values(m.parameter(ln + ".bias")));
      }
    }
  }

  // The MLP input for signed distance s, rounded to float as PyTorch feeds it
  // (kept in double after set_double_inputs(), as a float64 module feeds it).
  double input(std::int64_t s) const {
    const auto feed = [&](double x) { return double_inputs_ ? x : static_cast<float>(x); };
    if (o_.variant == DpbVariant::kZeta) return feed(static_cast<double>(s < 0 ? -s : s));
    if (!o_.log_distance) return feed(static_cast<double>(s));
    const double a = std::log(std::fabs(static_cast<double>(s)) + 1.0);
    return feed(s < 0 ? -a : a);
  }
  void set_double_inputs() { double_inputs_ = true; }

  std::vector<double> forward(double x) const { return run(x, nullptr); }

  // Adds the gradient of sum_h gy[h] MLP(x)[h] into grads (by name).
  void backward(double x, const std::vector<double>& gy,
                std::map<std::string, std::vector<double>>& grads) const {
    Trace t;
    run(x, &t);
    const std::int64_t dim = o_.dim;
    const std::int64_t depth = o_.depth;
    // Output layer.
    std::vector<double>& gw = slot(grads, linear_[depth] + ".weight", o_.heads * dim);
    std::vector<double>& gb = slot(grads, linear_[depth] + ".bias", o_.heads);
    std::vector<double> da(dim, 0.0);
    for (std::int64_t h = 0; h < o_.heads; ++h) {
      gb[h] += gy[h];
      for (std::int64_t k = 0; k < dim; ++k) {
        gw[h * dim + k] += gy[h] * t.a[depth][k];
        da[k] += gy[h] * w_[depth][h * dim + k];
      }
    }
    for (std::int64_t l = depth - 1; l >= 0; --l) {
      std::vector<double> dz(dim);
      for (std::int64_t k = 0; k < dim; ++k) {
        const double u = t.u[l][k];
        const double s = 1.0 / (1.0 + std::exp(-u));
        dz[k] = da[k] * s * (1.0 + u * (1.0 - s));
      }
      if (o_.norm) {
        std::vector<double>& gg = slot(grads, norm_[l] + ".weight", dim);
        std::vector<double>& gbeta = slot(grads, norm_[l] + ".bias", dim);
        std::vector<double> dzhat(dim);
        double m1 = 0.0;
        double m2 = 0.0;
        for (std::int64_t k = 0; k < dim; ++k) {
          gg[k] += dz[k] * t.zhat[l][k];
          gbeta[k] += dz[k];
          dzhat[k] = dz[k] * g_[l][k];
          m1 += dzhat[k] / static_cast<double>(dim);
          m2 += dzhat[k] * t.zhat[l][k] / static_cast<double>(dim);
        }
        for (std::int64_t k = 0; k < dim; ++k) {
          dz[k] = t.rstd[l] * (dzhat[k] - m1 - t.zhat[l][k] * m2);
        }
      }
      const std::int64_t in = l == 0 ? 1 : dim;
      std::vector<double>& lw = slot(grads, linear_[l] + ".weight", dim * in);
      std::vector<double>& lb = slot(grads, linear_[l] + ".bias", dim);
      std::vector<double> prev(in, 0.0);
      for (std::int64_t o = 0; o < dim; ++o) {
        lb[o] += dz[o];
        for (std::int64_t k = 0; k < in; ++k) {
          lw[o * in + k] += dz[o] * t.a[l][k];
          prev[k] += dz[o] * w_[l][o * in + k];
        }
      }
      da = prev;
    }
  }

  // Parameters in double, writable (for finite differences).
  std::vector<double>* parameter(const std::string& name) {
    for (std::size_t l = 0; l < linear_.size(); ++l) {
      if (name == linear_[l] + ".weight") return &w_[l];
      if (name == linear_[l] + ".bias") return &b_[l];
    }
    for (std::size_t l = 0; l < norm_.size(); ++l) {
      if (name == norm_[l] + ".weight") return &g_[l];
      if (name == norm_[l] + ".bias") return &beta_[l];
    }
    return nullptr;
  }

 private:
  bool double_inputs_ = false;

  struct Trace {
    std::vector<std::vector<double>> a, u, zhat;
    std::vector<double> rstd;
  };

  static std::vector<double> values(const Tensor& t) {
    const std::vector<float> f = t.to_float_vector();
    return std::vector<double>(f.begin(), f.end());
  }

  static std::vector<double>& slot(std::map<std::string, std::vector<double>>& grads,
                                   const std::string& name, std::int64_t n) {
    std::vector<double>& v = grads[name];
    if (v.empty()) v.assign(static_cast<std::size_t>(n), 0.0);
    return v;
  }

  std::vector<double> run(double x, Trace* t) const {
    const std::int64_t dim = o_.dim;
    std::vector<double> a{x};
    if (t) t->a.push_back(a);
    for (std::int64_t l = 0; l < o_.depth; ++l) {
      const std::int64_t in = static_cast<std::int64_t>(a.size());
      std::vector<double> z(dim);
      for (std::int64_t o = 0; o < dim; ++o) {
        double s = b_[l][o];
        for (std::int64_t k = 0; k < in; ++k) s += w_[l][o * in + k] * a[k];
        z[o] = s;
      }
      if (o_.norm) {
        double mean = 0.0;
        for (double v : z) mean += v / static_cast<double>(dim);
        double var = 0.0;
        for (double v : z) var += (v - mean) * (v - mean) / static_cast<double>(dim);
        const double rstd = 1.0 / std::sqrt(var + static_cast<double>(o_.layernorm_eps));
        std::vector<double> zhat(dim);
        for (std::int64_t k = 0; k < dim; ++k) {
          zhat[k] = (z[k] - mean) * rstd;
          z[k] = zhat[k] * g_[l][k] + beta_[l][k];
        }
        if (t) {
          t->zhat.push_back(zhat);
          t->rstd.push_back(rstd);
        }
      }
      if (t) t->u.push_back(z);
      a.assign(dim, 0.0);
      for (std::int64_t k = 0; k < dim; ++k) a[k] = z[k] / (1.0 + std::exp(-z[k]));
      if (t) t->a.push_back(a);
    }
    std::vector<double> y(o_.heads);
    for (std::int64_t h = 0; h < o_.heads; ++h) {
      double s = b_[o_.depth][h];
      for (std::int64_t k = 0; k < dim; ++k) s += w_[o_.depth][h * dim + k] * a[k];
      y[h] = s;
    }
    return y;
  }

  DpbOptions o_;
  std::vector<std::string> linear_, norm_;
  std::vector<std::vector<double>> w_, b_, g_, beta_;
};

// bias[h][r][c] in double, straight from docs/spec.md: q_r = j - i + r, the MLP at
// |q_r - c| (zeta) or at q_r - c (x-transformers).
inline std::vector<double> naive_bias(const RefMlp& ref, std::int64_t heads, std::int64_t i,
                                      std::int64_t j) {
  std::map<std::int64_t, std::vector<double>> memo;
  std::vector<double> out(static_cast<std::size_t>(heads * i * j));
  for (std::int64_t r = 0; r < i; ++r) {
    for (std::int64_t c = 0; c < j; ++c) {
      const std::int64_t s = (j - i + r) - c;
      auto it = memo.find(s);
      if (it == memo.end()) it = memo.emplace(s, ref.forward(ref.input(s))).first;
      for (std::int64_t h = 0; h < heads; ++h) out[(h * i + r) * j + c] = it->second[h];
    }
  }
  return out;
}

inline std::vector<float> to_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0);
  return v;
}

// Naive reference gradient: for every element, the MLP backward at its
// distance, in double.
inline std::map<std::string, std::vector<double>> naive_backward(const RefMlp& ref,
                                                                 std::int64_t heads, std::int64_t i,
                                                                 std::int64_t j,
                                                                 const std::vector<float>& g) {
  // Sum the gradient per distance first (exact in double for these sizes),
  // then one MLP backward per distance.
  std::map<std::int64_t, std::vector<double>> per_s;
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = 0; r < i; ++r) {
      for (std::int64_t c = 0; c < j; ++c) {
        const std::int64_t s = (j - i + r) - c;
        std::vector<double>& v = per_s[s];
        if (v.empty()) v.assign(static_cast<std::size_t>(heads), 0.0);
        v[h] += g[(h * i + r) * j + c];
      }
    }
  }
  std::map<std::string, std::vector<double>> grads;
  for (const auto& [s, gy] : per_s) ref.backward(ref.input(s), gy, grads);
  return grads;
}

// |got - want| <= tol * (max |want| of the tensor) + 1e-6, per parameter.
inline void expect_grads_close(const TensorMap& got,
                               const std::map<std::string, std::vector<double>>& want,
                               const DynamicPositionBias& m, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), m.parameter_names().size()) << what;
  for (const std::string& name : m.parameter_names()) {
    ASSERT_TRUE(got.count(name)) << what << ": no gradient for " << name;
    const Tensor& t = got.at(name);
    ASSERT_EQ(t.shape(), m.parameter(name).shape()) << what << " " << name;
    ASSERT_EQ(t.dtype(), DType::kFloat32);
    const std::vector<float> g = t.to_float_vector();
    const auto it = want.find(name);
    std::vector<double> w(g.size(), 0.0);
    if (it != want.end()) w = it->second;
    ASSERT_EQ(w.size(), g.size()) << what << " " << name;
    double scale = 0.0;
    for (double v : w) scale = std::max(scale, std::fabs(v));
    for (std::size_t k = 0; k < g.size(); ++k) {
      ASSERT_LE(std::fabs(g[k] - w[k]), tol * scale + 1e-6)
          << what << ": " << name << "[" << k << "] is " << g[k] << ", expected " << w[k];
    }
  }
}

inline std::vector<DpbOptions> variants(std::int64_t dim, std::int64_t heads) {
  std::vector<DpbOptions> v;
  DpbOptions zeta;
  zeta.dim = dim;
  zeta.heads = heads;
  v.push_back(zeta);
  for (std::int64_t depth : {1, 2, 3}) {
    for (bool log_distance : {false, true}) {
      for (bool norm : {false, true}) {
        if (depth != 2 && (log_distance != norm)) continue;  // keep the grid small
        v.push_back(xt_options(dim, heads, depth, log_distance, norm));
      }
    }
  }
  return v;
}

}  // namespace posbias::test

#endif  // POSBIAS_TESTS_UNIT_DPB_REFERENCE_H_
