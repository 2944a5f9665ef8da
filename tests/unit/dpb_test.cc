// DynamicPositionBias: the golden PyTorch vectors (forward and gradients, both
// variants, the safetensors file), a double-precision naive reference over
// many shapes and every dtype, the kernels on every compiled instruction set,
// the backward pass against finite differences and a naive reduction, the
// state dict and files, and bad input.
#include "posbias/dpb.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dpb_mlp.h"
#include "kernels/toeplitz.h"
#include "kernels/toeplitz_reduce.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_bits_equal;
using test::expect_throw_with;
using test::golden_dir;
using test::round_to;

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Shape = std::vector<std::int64_t>;

// ----------------------------------------------------------------- helpers

std::vector<Json> golden_cases(const std::string& kind) {
  const std::string dir = golden_dir();
  if (dir.empty()) return {};
  std::ifstream in(fs::path(dir) / "golden.json");
  const Json doc = Json::parse(in);
  std::vector<Json> out;
  for (const Json& c : doc.at("cases")) {
    if (c.at("kind") == kind) out.push_back(c);
  }
  return out;
}

Tensor tensor_of(const Json& j) {
  return Tensor::from_vector(j.at("shape").get<Shape>(), j.at("data").get<std::vector<float>>());
}

// The golden tolerance: |a - b| <= atol + rtol |b|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
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

DpbOptions xt_options(std::int64_t dim, std::int64_t heads, std::int64_t depth, bool log_distance,
                      bool norm) {
  DpbOptions o;
  o.dim = dim;
  o.heads = heads;
  o.variant = DpbVariant::kXTransformers;
  o.depth = depth;
  o.log_distance = log_distance;
  o.norm = norm;
  return o;
}

std::string describe(const DpbOptions& o) {
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
bool is_norm_param(const std::string& name) {
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

bool is_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

void randomise_norms(DynamicPositionBias& m, std::uint64_t seed) {
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

// The MLP of SPEC.md evaluated in double, one input at a time, from the
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

  // The MLP input for signed distance s, rounded to float as PyTorch feeds it.
  double input(std::int64_t s) const {
    if (o_.variant == DpbVariant::kZeta) return static_cast<float>(s < 0 ? -s : s);
    if (!o_.log_distance) return static_cast<float>(s);
    const double a = std::log(std::fabs(static_cast<double>(s)) + 1.0);
    return static_cast<float>(s < 0 ? -a : a);
  }

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

// bias[h][r][c] in double, straight from SPEC.md: q_r = j - i + r, the MLP at
// |q_r - c| (zeta) or at q_r - c (x-transformers).
std::vector<double> naive_bias(const RefMlp& ref, std::int64_t heads, std::int64_t i,
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

std::vector<float> to_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0);
  return v;
}

// Naive reference gradient: for every element, the MLP backward at its
// distance, in double.
std::map<std::string, std::vector<double>> naive_backward(const RefMlp& ref, std::int64_t heads,
                                                          std::int64_t i, std::int64_t j,
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
void expect_grads_close(const TensorMap& got,
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

// ---------------------------------------------------------------- golden

TEST(DpbGolden, ZetaForwardAndGradients) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  int checked = 0;
  for (const Json& c : cases) {
    if (c.at("variant") != "zeta") continue;
    const std::string what = "zeta dim " + std::to_string(c.at("dim").get<int>());
    DynamicPositionBias m(c.at("dim").get<std::int64_t>(), c.at("heads").get<std::int64_t>());
    TensorMap params;
    for (const auto& [name, t] : c.at("params").items()) params.emplace(name, tensor_of(t));
    m.load_state_dict(params);
    for (const Json& call : c.at("calls")) {
      const auto i = call.at("i").get<std::int64_t>();
      const auto j = call.at("j").get<std::int64_t>();
      const Tensor out = m.forward(i, j);
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>()) << what;
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   what + " forward(" + std::to_string(i) + ", " + std::to_string(j) + ")");
    }
    const Json& g = c.at("grad");
    const TensorMap grads = m.backward(g.at("i").get<std::int64_t>(), g.at("j").get<std::int64_t>(),
                                       tensor_of(g.at("grad_output")));
    ASSERT_EQ(grads.size(), g.at("param_grads").size());
    for (const auto& [name, t] : g.at("param_grads").items()) {
      ASSERT_TRUE(grads.count(name)) << name;
      ASSERT_EQ(grads.at(name).shape(), t.at("shape").get<Shape>()) << name;
      expect_close(grads.at(name).to_float_vector(), t.at("data").get<std::vector<float>>(),
                   what + " grad " + name);
    }
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(DpbGolden, XTransformersForward) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  int checked = 0;
  for (const Json& c : cases) {
    if (c.at("variant") != "x-transformers") continue;
    DpbOptions o =
        xt_options(c.at("dim"), c.at("heads"), c.at("depth"), c.at("log_distance"), c.at("norm"));
    // The layers in order: block b is Linear, [LayerNorm], SiLU; then the
    // output Linear.
    TensorMap params;
    std::int64_t block = 0;
    for (const Json& layer : c.at("layers")) {
      const std::string type = layer.at("type");
      const std::string b = std::to_string(block);
      if (type == "linear") {
        const std::string prefix = block < o.depth ? "mlp." + b + ".0" : "mlp." + b;
        params.emplace(prefix + ".weight", tensor_of(layer.at("weight")));
        params.emplace(prefix + ".bias", tensor_of(layer.at("bias")));
      } else if (type == "layernorm") {
        o.layernorm_eps = layer.at("eps").get<float>();
        params.emplace("mlp." + b + ".1.weight", tensor_of(layer.at("weight")));
        params.emplace("mlp." + b + ".1.bias", tensor_of(layer.at("bias")));
      } else if (type == "silu") {
        ++block;
      } else {
        FAIL() << "unknown layer type " << type;
      }
    }
    DynamicPositionBias m(o);
    m.load_state_dict(params);
    for (const Json& call : c.at("calls")) {
      const auto i = call.at("i").get<std::int64_t>();
      const auto j = call.at("j").get<std::int64_t>();
      const Tensor out = m.forward(i, j);
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>());
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   describe(o) + " forward(" + std::to_string(i) + ", " + std::to_string(j) + ")");
    }
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(DpbGolden, SafetensorsFileFromPyTorch) {
  const std::vector<Json> cases = golden_cases("dynamic_position_bias_file");
  if (cases.empty()) GTEST_SKIP() << "no golden.json found";
  for (const Json& c : cases) {
    DynamicPositionBias m(c.at("dim").get<std::int64_t>(), c.at("heads").get<std::int64_t>());
    m.load((fs::path(golden_dir()) / c.at("file").get<std::string>()).string());
    for (const Json& call : c.at("calls")) {
      const Tensor out = m.forward(call.at("i"), call.at("j"));
      ASSERT_EQ(out.shape(), call.at("shape").get<Shape>());
      expect_close(out.to_float_vector(), call.at("data").get<std::vector<float>>(),
                   c.at("file").get<std::string>());
    }
  }
}

// ------------------------------------------------------- naive reference

std::vector<DpbOptions> variants(std::int64_t dim, std::int64_t heads) {
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

// ------------------------------------------------ kernels, every target

TEST(DpbKernels, MlpOnEveryTargetMatchesReference) {
  for (const DpbOptions& o : {DpbOptions{5, 3}, DpbOptions{33, 9}, xt_options(20, 2, 3, true, true),
                              xt_options(1, 1, 1, false, true)}) {
    DynamicPositionBias m(o, 5);
    if (o.norm) randomise_norms(m, 9);
    const RefMlp ref(m);
    // The kernel's view of the module, as dpb.cc builds it.
    detail::DpbMlp k;
    k.dim = o.dim;
    k.heads = o.heads;
    k.depth = o.depth;
    k.norm = o.norm;
    k.eps = o.layernorm_eps;
    for (const std::string& name : m.parameter_names()) {
      const float* p = m.parameter(name).data<float>();
      if (is_norm_param(name)) {
        (is_weight(name) ? k.ln_weight : k.ln_bias).push_back(p);
      } else {
        (is_weight(name) ? k.weight : k.bias).push_back(p);
      }
    }
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

// ------------------------------------------------ construction, parameters

TEST(DynamicPositionBias, SeedExampleModuleZeroToFiveIsEmpty) {
  // The documentation's module(0, 5): lengths, not positions.
  DynamicPositionBias m(64, 8);
  const Tensor b = m.forward(0, 5);
  EXPECT_EQ(b.shape(), (Shape{8, 0, 5}));
  EXPECT_EQ(b.numel(), 0);
  EXPECT_EQ(m.dim(), 64);
  EXPECT_EQ(m.heads(), 8);
  EXPECT_EQ(m.forward(5, 5).shape(), (Shape{8, 5, 5}));
  EXPECT_EQ(m.forward(0, 0).shape(), (Shape{8, 0, 0}));
}

TEST(DynamicPositionBias, ParameterNamesAndShapes) {
  DynamicPositionBias z(64, 8);
  EXPECT_EQ(z.parameter_names(),
            (std::vector<std::string>{"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
                                      "mlp.4.weight", "mlp.4.bias"}));
  EXPECT_EQ(z.parameter("mlp.0.weight").shape(), (Shape{64, 1}));
  EXPECT_EQ(z.parameter("mlp.0.bias").shape(), (Shape{64}));
  EXPECT_EQ(z.parameter("mlp.2.weight").shape(), (Shape{64, 64}));
  EXPECT_EQ(z.parameter("mlp.4.weight").shape(), (Shape{8, 64}));
  EXPECT_EQ(z.parameter("mlp.4.bias").shape(), (Shape{8}));

  DynamicPositionBias x(xt_options(16, 4, 3, true, true));
  EXPECT_EQ(
      x.parameter_names(),
      (std::vector<std::string>{"mlp.0.0.weight", "mlp.0.0.bias", "mlp.0.1.weight", "mlp.0.1.bias",
                                "mlp.1.0.weight", "mlp.1.0.bias", "mlp.1.1.weight", "mlp.1.1.bias",
                                "mlp.2.0.weight", "mlp.2.0.bias", "mlp.2.1.weight", "mlp.2.1.bias",
                                "mlp.3.weight", "mlp.3.bias"}));
  EXPECT_EQ(x.parameter("mlp.0.0.weight").shape(), (Shape{16, 1}));
  EXPECT_EQ(x.parameter("mlp.1.0.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(x.parameter("mlp.3.weight").shape(), (Shape{4, 16}));
  DynamicPositionBias y(xt_options(16, 4, 1, false, false));
  EXPECT_EQ(y.parameter_names(), (std::vector<std::string>{"mlp.0.0.weight", "mlp.0.0.bias",
                                                           "mlp.1.weight", "mlp.1.bias"}));
  try {
    z.parameter("mlp.1.weight");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.1.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mlp.4.bias"), std::string::npos);  // lists known
  }
}

TEST(DynamicPositionBias, InitialisationLikeNnLinear) {
  DynamicPositionBias a(xt_options(64, 8, 2, false, true), 1234);
  for (const std::string& name : a.parameter_names()) {
    const std::vector<float> v = a.parameter(name).to_float_vector();
    if (is_norm_param(name)) {
      for (float x : v) EXPECT_EQ(x, is_weight(name) ? 1.0f : 0.0f);
      continue;
    }
    const std::int64_t fan_in = name.rfind("mlp.0.0", 0) == 0 ? 1 : 64;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    double lo = 1e9, hi = -1e9, mean = 0.0;
    for (float x : v) {
      lo = std::min(lo, static_cast<double>(x));
      hi = std::max(hi, static_cast<double>(x));
      mean += x / static_cast<double>(v.size());
    }
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LE(hi, bound) << name;
    if (v.size() >= 64) {
      // Spread over the whole interval, centred.
      EXPECT_LT(lo, -0.8 * bound) << name;
      EXPECT_GT(hi, 0.8 * bound) << name;
      EXPECT_LT(std::fabs(mean), 0.25 * bound) << name;
    }
  }
  // Deterministic from the seed; another seed differs.
  DynamicPositionBias b(xt_options(64, 8, 2, false, true), 1234);
  DynamicPositionBias c(xt_options(64, 8, 2, false, true), 1235);
  EXPECT_EQ(a.parameter("mlp.1.0.weight").to_float_vector(),
            b.parameter("mlp.1.0.weight").to_float_vector());
  EXPECT_NE(a.parameter("mlp.1.0.weight").to_float_vector(),
            c.parameter("mlp.1.0.weight").to_float_vector());
  // The same seed gives the same numbers on every platform: pin a few.
  DynamicPositionBias z(4, 2, 0);
  const std::vector<float> w0 = z.parameter("mlp.0.weight").to_float_vector();
  std::mt19937_64 rng(0);
  for (float w : w0) {
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
    EXPECT_EQ(w, static_cast<float>(2.0 * u - 1.0));
  }
}

TEST(DynamicPositionBias, StateDictRoundTripAndSharing) {
  DynamicPositionBias a(xt_options(8, 3, 2, true, true), 1);
  DynamicPositionBias b(xt_options(8, 3, 2, true, true), 2);
  randomise_norms(a, 3);
  EXPECT_NE(a.forward(4, 6).to_float_vector(), b.forward(4, 6).to_float_vector());
  const TensorMap sd = a.state_dict();
  EXPECT_EQ(sd.size(), a.parameter_names().size());
  EXPECT_TRUE(sd.at("mlp.0.0.weight").shares_storage_with(a.parameter("mlp.0.0.weight")));
  const TensorMap held = b.state_dict();
  b.load_state_dict(sd);
  EXPECT_EQ(a.forward(4, 6).to_float_vector(), b.forward(4, 6).to_float_vector());
  // Loading copies into b's storage: its earlier handles see the new values
  // and a's parameters stay a's own.
  EXPECT_EQ(held.at("mlp.1.0.weight").to_float_vector(),
            a.parameter("mlp.1.0.weight").to_float_vector());
  EXPECT_FALSE(b.parameter("mlp.1.0.weight").shares_storage_with(a.parameter("mlp.1.0.weight")));
  // Writing through a handle changes the module (an optimiser step).
  b.state_dict().at("mlp.2.bias").mutable_data<float>()[0] += 1.0f;
  const std::vector<float> fa = a.forward(1, 3).to_float_vector();
  const std::vector<float> fb = b.forward(1, 3).to_float_vector();
  EXPECT_NEAR(fb[0] - fa[0], 1.0f, 1e-6);
  // A 16-bit state dict is converted to float32.
  TensorMap half;
  for (const auto& [name, t] : a.state_dict()) half.emplace(name, t.to(DType::kBFloat16));
  b.load_state_dict(half);
  EXPECT_EQ(b.parameter("mlp.0.0.bias").dtype(), DType::kFloat32);
  EXPECT_EQ(b.parameter("mlp.0.0.bias").to_float_vector(),
            a.parameter("mlp.0.0.bias").to(DType::kBFloat16).to_float_vector());
}

std::string load_error(DynamicPositionBias& m, const TensorMap& state) {
  try {
    m.load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(DynamicPositionBias, LoadStateDictIsStrictAndAtomic) {
  DynamicPositionBias m(64, 8, 1);
  const std::vector<float> before = m.forward(3, 4).to_float_vector();
  const TensorMap good = DynamicPositionBias(64, 8, 2).state_dict();
  const auto contains = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  {
    TensorMap s = good;
    s.erase("mlp.4.bias");
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "missing mlp.4.bias")) << e;
  }
  {
    TensorMap s = good;
    s.emplace("mlp.6.weight", Tensor::full({1}, 0.0f));
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "unexpected mlp.6.weight")) << e;
  }
  {
    TensorMap s = good;
    s["mlp.0.weight"] = Tensor::full({64}, 0.0f);
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "mlp.0.weight: expected shape [64, 1], got [64]")) << e;
  }
  {
    TensorMap s = good;
    Tensor w = s.at("mlp.2.weight").contiguous_copy();
    w.mutable_data<float>()[3 * 64 + 5] = std::nanf("");
    s["mlp.2.weight"] = w;
    const std::string e = load_error(m, s);
    EXPECT_TRUE(contains(e, "mlp.2.weight")) << e;
    EXPECT_TRUE(contains(e, "[3, 5]")) << e;
    EXPECT_TRUE(contains(e, "not finite")) << e;
  }
  {
    TensorMap s = good;
    Tensor b = s.at("mlp.4.bias").contiguous_copy();
    b.mutable_data<float>()[7] = INFINITY;
    s["mlp.4.bias"] = b;
    EXPECT_TRUE(contains(load_error(m, s), "mlp.4.bias: element [7] is not finite (inf)"))
        << load_error(m, s);
  }
  {
    // An x-transformers state dict is not a zeta one.
    const std::string e =
        load_error(m, DynamicPositionBias(xt_options(64, 8, 2, false, false)).state_dict());
    EXPECT_TRUE(contains(e, "missing mlp.0.weight")) << e;
    EXPECT_TRUE(contains(e, "unexpected mlp.0.0.bias")) << e;
  }
  // Nothing changed by any failed load (a good tensor before the bad one
  // included).
  EXPECT_EQ(m.forward(3, 4).to_float_vector(), before);
  EXPECT_TRUE(load_error(m, good).empty());
  EXPECT_NE(m.forward(3, 4).to_float_vector(), before);
}

TEST(DynamicPositionBias, ReplacedParameterOfWrongShapeIsReported) {
  DynamicPositionBias m(8, 2);
  m.mutable_parameter("mlp.2.weight") = Tensor::full({8}, 0.0f);
  try {
    m.forward(2, 2);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.2.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[8, 8]"), std::string::npos) << e.what();
  }
  // load_state_dict repairs it.
  m.load_state_dict(DynamicPositionBias(8, 2).state_dict());
  EXPECT_NO_THROW(m.forward(2, 2));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "posbias_dpb_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

TEST(DynamicPositionBias, SaveAndLoadSafetensors) {
  TempDir dir;
  DynamicPositionBias a(xt_options(8, 3, 2, true, true), 9);
  randomise_norms(a, 1);
  a.save(dir.file("dpb.safetensors"));
  // The file holds the state dict under its names, float32.
  const TensorMap raw = load_safetensors(dir.file("dpb.safetensors"));
  ASSERT_EQ(raw.size(), a.parameter_names().size());
  for (const std::string& name : a.parameter_names()) {
    ASSERT_EQ(raw.at(name).dtype(), DType::kFloat32);
    EXPECT_EQ(raw.at(name).to_float_vector(), a.parameter(name).to_float_vector()) << name;
  }
  DynamicPositionBias b(xt_options(8, 3, 2, true, true), 10);
  b.load(dir.file("dpb.safetensors"));
  EXPECT_EQ(a.forward(5, 7).to_float_vector(), b.forward(5, 7).to_float_vector());
  // A file of another module: the error names the file and the problem.
  DynamicPositionBias(8, 3).save(dir.file("zeta.safetensors"));
  try {
    b.load(dir.file("zeta.safetensors"));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zeta.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.forward(5, 7).to_float_vector(), b.forward(5, 7).to_float_vector());
  // Non-finite weights in a file.
  TensorMap bad = a.state_dict();
  Tensor w = bad.at("mlp.1.0.weight").contiguous_copy();
  w.mutable_data<float>()[0] = NAN;
  bad["mlp.1.0.weight"] = w;
  save_safetensors(dir.file("nan.safetensors"), bad);
  try {
    b.load(dir.file("nan.safetensors"));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.1.0.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.load(dir.file("absent.safetensors")), std::runtime_error);
}

// --------------------------------------------------------------- bad input

TEST(DynamicPositionBias, RejectsBadOptionsWithValues) {
  const auto message = [](const DpbOptions& o) -> std::string {
    try {
      DynamicPositionBias m(o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THROW(DynamicPositionBias(0, 8), std::invalid_argument);
  EXPECT_THROW(DynamicPositionBias(64, 0), std::invalid_argument);
  EXPECT_THROW(DynamicPositionBias(-3, 8), std::invalid_argument);
  EXPECT_NE(message(DpbOptions{0, 8}).find("dim must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message(DpbOptions{4, -2}).find("heads must be >= 1, got -2"), std::string::npos);
  EXPECT_NE(message(xt_options(4, 2, 0, false, false)).find("depth must be >= 1, got 0"),
            std::string::npos);
  DpbOptions z{4, 2};
  z.depth = 3;
  EXPECT_NE(message(z).find("depth = 3"), std::string::npos) << message(z);
  z.depth = 2;
  z.norm = true;
  EXPECT_FALSE(message(z).empty());
  z.norm = false;
  z.log_distance = true;
  EXPECT_FALSE(message(z).empty());
  DpbOptions e = xt_options(4, 2, 2, false, true);
  e.layernorm_eps = -1.0f;
  EXPECT_NE(message(e).find("layernorm_eps"), std::string::npos);
  e.layernorm_eps = NAN;
  EXPECT_FALSE(message(e).empty());
}

TEST(DynamicPositionBias, RejectsBadLengthsWithValues) {
  DynamicPositionBias m(4, 2);
  DynamicPositionBias x(xt_options(4, 2, 2, false, false));
  for (const DynamicPositionBias* p : {&m, &x}) {
    try {
      p->forward(6, 5);
      FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("i = 6, j = 5"), std::string::npos) << e.what();
    }
    EXPECT_THROW(p->forward(-1, 5), std::invalid_argument);
    EXPECT_THROW(p->forward(0, -1), std::invalid_argument);
    EXPECT_THROW(p->forward(1, 0), std::invalid_argument);
    EXPECT_THROW(p->table(0), std::invalid_argument);
    EXPECT_THROW(p->distance_table(-4), std::invalid_argument);
    EXPECT_THROW(p->backward(-1, 3, Tensor()), std::invalid_argument);
  }
  // Too large to ever allocate: a clean error before allocating.
  EXPECT_THROW(m.forward(std::int64_t{1} << 40, std::int64_t{1} << 40), std::length_error);
}

// The table's length 2j - 1 overflows int64 for j > 2^62: the size is checked
// before it is formed (was signed overflow, then "tensor extents must be >= 0,
// got shape [2, -9223372036854775807]" from j = 2^62 + 1), for every table
// entry point and both variants; a j whose table merely exceeds the memory
// gets the same kind of error, naming j and the shape.
TEST(DynamicPositionBias, HugeTableLengthsAreLengthErrorsNamingJ) {
  DynamicPositionBias m(4, 2);
  DynamicPositionBias x(xt_options(4, 2, 2, false, false));
  const std::int64_t overflowing = (std::int64_t{1} << 62) + 1;  // 4611686018427387905
  const std::int64_t too_big = std::int64_t{1} << 60;            // 2j - 1 fits, memory does not
  const Tensor grad = Tensor::full({2, 3}, 0.0f);
  for (const DynamicPositionBias* p : {&m, &x}) {
    for (const std::int64_t j : {overflowing, too_big}) {
      const std::string js = "j = " + std::to_string(j);
      expect_throw_with<std::length_error>([&] { p->distance_table(j); }, js);
      expect_throw_with<std::length_error>([&] { p->table(j); }, js);
      expect_throw_with<std::length_error>([&] { p->backward_table(j, grad); }, js);
      expect_throw_with<std::length_error>([&] { p->backward_distance_table(j, grad); }, js);
    }
    expect_throw_with<std::length_error>([&] { p->distance_table(overflowing); }, "overflow int64");
    expect_throw_with<std::length_error>([&] { p->distance_table(too_big); },
                                         "[2, " + std::to_string(2 * too_big - 1) + "]");
  }
  expect_throw_with<std::length_error>([&] { m.table(too_big); },
                                       "[2, " + std::to_string(too_big) + "]");
}

}  // namespace
}  // namespace posbias

namespace posbias {
namespace {

TEST(DynamicPositionBias, CopiesShareParametersAndCloneDoesNot) {
  DynamicPositionBias a(4, 2, /*seed=*/1);
  DynamicPositionBias shared = a;
  DynamicPositionBias deep = a.clone();
  const std::vector<float> before = a.forward(3, 5).to_float_vector();
  EXPECT_EQ(deep.forward(3, 5).to_float_vector(), before);
  a.mutable_parameter("mlp.4.bias").mutable_data<float>()[0] += 1.0f;
  EXPECT_EQ(shared.forward(3, 5).to_float_vector(), a.forward(3, 5).to_float_vector());
  EXPECT_EQ(deep.forward(3, 5).to_float_vector(), before);
  EXPECT_NE(a.forward(3, 5).to_float_vector(), before);
}

}  // namespace
}  // namespace posbias
