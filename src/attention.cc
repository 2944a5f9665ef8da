// Front functions of attention: argument checks, output sizing, bias
// preparation, dispatch to the fused kernel (kernels/attention_fused.cc),
// and the plain reference path.
#include "posbias/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_fused.h"
#include "kernels/attention_params.h"

namespace posbias {

AttentionBias AttentionBias::none() { return AttentionBias{}; }

AttentionBias AttentionBias::alibi(std::vector<float> slopes) {
  AttentionBias b;
  b.kind = AttentionBiasKind::kAlibi;
  b.slopes = std::move(slopes);
  return b;
}

AttentionBias AttentionBias::distance_table(Tensor table) {
  AttentionBias b;
  b.kind = AttentionBiasKind::kDistanceTable;
  b.table = std::move(table);
  return b;
}

AttentionBias AttentionBias::dense_bias(Tensor bias) {
  AttentionBias b;
  b.kind = AttentionBiasKind::kDense;
  b.dense = std::move(bias);
  return b;
}

namespace {

using detail::shape_string;

// Everything the two paths share, after the checks.
struct Prepared {
  std::int64_t b = 0, h = 0, hk = 0, i = 0, j = 0, d = 0;
  float scale = 1.0f;
  std::int64_t dense_stride[4] = {};  // broadcast strides of the dense bias
};

std::string shapes_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + shape_string(q.shape()) + ", k " + shape_string(k.shape()) + ", v " +
         shape_string(v.shape());
}

[[noreturn]] void fail(const char* who, const std::string& what, const Tensor& q, const Tensor& k,
                       const Tensor& v) {
  throw std::invalid_argument(std::string(who) + ": " + what + " (" + shapes_of(q, k, v) + ")");
}

// The bias against the checked shapes; fills the dense bias's broadcast
// strides.
void check_bias(const char* who, const Tensor& q, const Tensor& k, const Tensor& v,
                const AttentionBias& bias, const AttentionOptions& options, Prepared& p) {
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      if (static_cast<std::int64_t>(bias.slopes.size()) != p.h) {
        fail(who,
             "ALiBi needs one slope per query head: got " + std::to_string(bias.slopes.size()) +
                 " slopes for h = " + std::to_string(p.h),
             q, k, v);
      }
      for (std::size_t x = 0; x < bias.slopes.size(); ++x) {
        if (!std::isfinite(bias.slopes[x])) {
          fail(who,
               "ALiBi slope " + std::to_string(x) + " is not finite (" +
                   std::to_string(bias.slopes[x]) + ")",
               q, k, v);
        }
      }
      break;
    case AttentionBiasKind::kDistanceTable: {
      const Tensor& t = bias.table;
      const std::string tshape = "table " + shape_string(t.shape());
      // n >= 2j - 1, written so that 2j cannot overflow (an empty k may have
      // any j).
      if (t.dtype() != DType::kFloat32 || t.dim() != 2 || t.size(0) != p.h ||
          p.j > t.size(1) / 2 + t.size(1) % 2) {
        const std::string need = p.j > std::numeric_limits<std::int64_t>::max() / 2
                                     ? "2 * " + std::to_string(p.j) + " - 1"
                                     : std::to_string(std::max<std::int64_t>(0, 2 * p.j - 1));
        fail(who,
             "the distance table must be float32 [h, >= 2j - 1] = [" + std::to_string(p.h) +
                 ", >= " + need + "], got " + dtype_name(t.dtype()) + " " + tshape,
             q, k, v);
      }
      if (!options.causal && p.i > p.j && p.j > 0) {
        fail(who,
             "a distance table covers query positions 0..j-1 only: non-causal attention "
             "needs i <= j, got i = " +
                 std::to_string(p.i) + ", j = " + std::to_string(p.j),
             q, k, v);
      }
      break;
    }
    case AttentionBiasKind::kDense: {
      const Tensor& t = bias.dense;
      const std::vector<std::int64_t> target = {p.b, p.h, p.i, p.j};
      const std::string msg =
          "the dense bias " + shape_string(t.shape()) + " (" + dtype_name(t.dtype()) +
          ") must be float32 and broadcastable to [b, h, i, j] = " + shape_string(target);
      if (t.dtype() != DType::kFloat32 || t.dim() > 4) fail(who, msg, q, k, v);
      const std::int64_t lead = 4 - t.dim();
      for (std::int64_t x = 0; x < 4; ++x) {
        if (x < lead) continue;  // missing leading dimension: broadcast
        const std::int64_t e = t.size(x - lead);
        if (e == target[static_cast<std::size_t>(x)]) {
          p.dense_stride[x] = t.strides()[static_cast<std::size_t>(x - lead)];
        } else if (e != 1) {
          fail(who, msg, q, k, v);
        }
      }
      break;
    }
  }
}

Prepared check(const char* who, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionBias& bias, const AttentionOptions& options) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    fail(who, "q must be [b, h, i, d] and k, v [b, hk, j, d] (4-d)", q, k, v);
  }
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) {
    fail(who,
         "q, k and v must have one dtype, got " + dtype_name(q.dtype()) + ", " +
             dtype_name(k.dtype()) + ", " + dtype_name(v.dtype()),
         q, k, v);
  }
  if (k.shape() != v.shape()) fail(who, "k and v must have the same shape", q, k, v);
  Prepared p;
  p.b = q.size(0);
  p.h = q.size(1);
  p.i = q.size(2);
  p.d = q.size(3);
  p.hk = k.size(1);
  p.j = k.size(2);
  if (k.size(0) != p.b) fail(who, "q and k must have the same batch size", q, k, v);
  if (k.size(3) != p.d) fail(who, "q and k must have the same head dimension d", q, k, v);
  if (p.d < 1) fail(who, "d must be >= 1, got " + std::to_string(p.d), q, k, v);
  if (p.hk < 1 ? p.h != 0 : p.h % p.hk != 0) {
    fail(who,
         "the query heads h = " + std::to_string(p.h) +
             " must be a multiple of the key/value heads hk = " + std::to_string(p.hk),
         q, k, v);
  }
  if (p.hk == 0) p.hk = 1;  // h == 0: nothing to compute
  const float scale = options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(p.d));
  if (!std::isfinite(scale)) {
    fail(who, "scale must be finite, got " + std::to_string(scale), q, k, v);
  }
  p.scale = scale;
  check_bias(who, q, k, v, bias, options, p);
  return p;
}

// The user's table reversed once per head, so that a row's window reads
// forwards (increasing key order); the padding covers the vector tail of the
// last block (at most one vector of 16 floats is read past the 2j - 1
// entries).
std::vector<float> reversed_table(const Tensor& table, std::int64_t h, std::int64_t j,
                                  std::int64_t* stride) {
  const std::int64_t len = std::max<std::int64_t>(0, 2 * j - 1);
  // The table and k may be stride-0 views (Tensor::from_blob) of any
  // length: refuse a copy that cannot fit (std::length_error) before sizing
  // it.
  detail::checked_numel({h, len}, DType::kFloat32);
  *stride = len + 64;
  std::vector<float> rtable(static_cast<std::size_t>(h * *stride), 0.0f);
  const float* t = table.data<float>();
  const std::int64_t s0 = table.strides()[0];
  const std::int64_t s1 = table.strides()[1];
  for (std::int64_t hh = 0; hh < h; ++hh) {
    float* dst = rtable.data() + hh * *stride;
    for (std::int64_t e = 0; e < len; ++e) dst[e] = t[hh * s0 + (len - 1 - e) * s1];
  }
  return rtable;
}

// The kernels' description of a call, from the checked arguments: the one
// place that turns the public q, k, v, bias and options into
// detail::AttentionParams (the forward, the backward and the reference all
// start from it). Outputs and the backward's inputs are set by the caller.
struct Described {
  detail::AttentionParams p;
  std::vector<float> rtable;  // kTable: the reversed table p.rtable points into
};

Described describe(const Prepared& pr, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionBias& bias, const AttentionOptions& options) {
  Described dsc;
  detail::AttentionParams& p = dsc.p;
  p.dtype = q.dtype();
  p.kv_dtype = k.dtype();
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  std::copy_n(q.strides().data(), 4, p.q_stride);
  std::copy_n(k.strides().data(), 4, p.k_stride);
  std::copy_n(v.strides().data(), 4, p.v_stride);
  p.b = pr.b;
  p.h = pr.h;
  p.hk = k.size(1);  // 0 with h = 0 (nothing to compute; pr.hk is 1 then)
  p.i = pr.i;
  p.j = pr.j;
  p.d = pr.d;
  p.scale = pr.scale;
  p.causal = options.causal;
  p.q_offset = pr.j - pr.i;  // queries are the last i of the j positions
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      p.bias = detail::FusedBias::kNone;
      break;
    case AttentionBiasKind::kAlibi:
      p.bias = detail::FusedBias::kAlibi;
      p.slopes = bias.slopes.data();
      break;
    case AttentionBiasKind::kDistanceTable:
      p.bias = detail::FusedBias::kTable;
      dsc.rtable = reversed_table(bias.table, pr.h, pr.j, &p.rtable_stride);
      p.rtable = dsc.rtable.data();
      p.table_centre = pr.j - 1;  // the user table read at j - 1 (issue 16 moves it to (n - 1) / 2)
      break;
    case AttentionBiasKind::kDense:
      p.bias = detail::FusedBias::kDense;
      p.dense = bias.dense.data<float>();
      std::copy_n(pr.dense_stride, 4, p.dense_stride);
      break;
  }
  return dsc;
}

AttentionForwardResult forward_impl(const char* who, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionBias& bias,
                                    const AttentionOptions& options, bool want_lse) {
  const Prepared pr = check(who, q, k, v, bias, options);
  AttentionForwardResult res;
  res.out = Tensor::empty({pr.b, pr.h, pr.i, pr.d}, q.dtype());
  if (want_lse) res.lse = Tensor::empty({pr.b, pr.h, pr.i}, DType::kFloat32);
  if (res.out.numel() == 0) return res;
  Described dsc = describe(pr, q, k, v, bias, options);
  dsc.p.out = res.out.raw_mutable_data();
  if (want_lse) dsc.p.lse = res.lse.mutable_data<float>();
  detail::fused_attention(dsc.p);
  return res;
}

void check_like(const char* who, const char* name, const Tensor& t,
                const std::vector<std::int64_t>& shape, DType dtype, const Tensor& q,
                const Tensor& k, const Tensor& v) {
  if (t.shape() != shape || t.dtype() != dtype) {
    fail(who,
         std::string(name) + " must be " + dtype_name(dtype) + " " + shape_string(shape) +
             ", got " + dtype_name(t.dtype()) + " " + shape_string(t.shape()),
         q, k, v);
  }
}

// The kernel's table gradient [h, 2j - 1] as a gradient of the user's table
// [h, n >= 2j - 1] (entries past 2j - 1 were not read: zero).
Tensor table_gradient(const Tensor& table, const std::vector<float>& dtable, std::int64_t h,
                      std::int64_t j) {
  const std::int64_t len = std::max<std::int64_t>(0, 2 * j - 1);
  Tensor grad = Tensor::full(table.shape(), 0.0f);
  float* gt = grad.mutable_data<float>();
  const std::int64_t n = table.size(1);
  for (std::int64_t hh = 0; hh < h; ++hh) std::copy_n(dtable.data() + hh * len, len, gt + hh * n);
  return grad;
}

// dS [b, h, i, j] summed over the dimensions the dense bias broadcasts along.
Tensor dense_gradient(const Tensor& t, const Tensor& ddense) {
  const std::int64_t lead = 4 - t.dim();
  std::vector<std::int64_t> ext4(4, 1);
  for (std::int64_t x = lead; x < 4; ++x) ext4[static_cast<std::size_t>(x)] = t.size(x - lead);
  Tensor grad = Tensor::full(t.shape(), 0.0f);
  float* gd = grad.mutable_data<float>();
  const float* src = ddense.data<float>();
  const std::int64_t full[4] = {ddense.size(0), ddense.size(1), ddense.size(2), ddense.size(3)};
  std::int64_t cs[4];  // contiguous strides of the 4-d view of grad
  cs[3] = 1;
  for (int x = 2; x >= 0; --x) cs[x] = cs[x + 1] * ext4[static_cast<std::size_t>(x + 1)];
  std::int64_t flat = 0;
  for (std::int64_t b0 = 0; b0 < full[0]; ++b0) {
    for (std::int64_t h0 = 0; h0 < full[1]; ++h0) {
      for (std::int64_t r0 = 0; r0 < full[2]; ++r0) {
        const std::int64_t base = (ext4[0] == 1 ? 0 : b0 * cs[0]) +
                                  (ext4[1] == 1 ? 0 : h0 * cs[1]) + (ext4[2] == 1 ? 0 : r0 * cs[2]);
        float* dst = gd + base;
        if (ext4[3] == 1) {
          float sum = 0.0f;
          for (std::int64_t c = 0; c < full[3]; ++c) sum += src[flat + c];
          dst[0] += sum;
        } else {
          for (std::int64_t c = 0; c < full[3]; ++c) dst[c] += src[flat + c];
        }
        flat += full[3];
      }
    }
  }
  return grad;
}

// The bias of row r (position qpos) of head hh, batch bb at key c, in
// double, straight from the user's bias (the reference's own reading).
double reference_bias(const AttentionBias& bias, const Prepared& pr, std::int64_t bb,
                      std::int64_t hh, std::int64_t r, std::int64_t qpos, std::int64_t c) {
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      return -static_cast<double>(bias.slopes[static_cast<std::size_t>(hh)]) *
             static_cast<double>(std::llabs(c - qpos));
    case AttentionBiasKind::kDistanceTable:
      return bias.table.data<float>()[hh * bias.table.strides()[0] +
                                      (qpos - c + pr.j - 1) * bias.table.strides()[1]];
    case AttentionBiasKind::kDense:
      return bias.dense.data<float>()[bb * pr.dense_stride[0] + hh * pr.dense_stride[1] +
                                      r * pr.dense_stride[2] + c * pr.dense_stride[3]];
  }
  return 0.0;
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionBias& bias, const AttentionOptions& options) {
  return forward_impl("attention_forward", q, k, v, bias, options, false).out;
}

AttentionForwardResult attention_forward_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionBias& bias,
                                             const AttentionOptions& options) {
  return forward_impl("attention_forward_lse", q, k, v, bias, options, true);
}

AttentionGradients attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionBias& bias, const AttentionOptions& options,
                                      const Tensor& out, const Tensor& lse,
                                      const Tensor& grad_out) {
  const char* who = "attention_backward";
  const Prepared pr = check(who, q, k, v, bias, options);
  const std::vector<std::int64_t> qshape = {pr.b, pr.h, pr.i, pr.d};
  check_like(who, "out", out, qshape, q.dtype(), q, k, v);
  check_like(who, "grad_out", grad_out, qshape, q.dtype(), q, k, v);
  check_like(who, "lse", lse, {pr.b, pr.h, pr.i}, DType::kFloat32, q, k, v);
  AttentionGradients g;
  g.grad_q = Tensor::empty(qshape, q.dtype());
  g.grad_k = Tensor::empty(k.shape(), k.dtype());
  g.grad_v = Tensor::empty(v.shape(), v.dtype());

  Described dsc = describe(pr, q, k, v, bias, options);
  detail::AttentionParams& p = dsc.p;
  p.saved_out = out.raw_data();
  std::copy_n(out.strides().data(), 4, p.saved_out_stride);
  p.saved_lse = lse.data<float>();
  std::copy_n(lse.strides().data(), 3, p.saved_lse_stride);
  p.dout = grad_out.raw_data();
  std::copy_n(grad_out.strides().data(), 4, p.dout_stride);
  p.dq = g.grad_q.raw_mutable_data();
  p.dk = g.grad_k.raw_mutable_data();
  p.dv = g.grad_v.raw_mutable_data();
  std::vector<float> dtable;
  Tensor ddense;
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      g.grad_slopes.assign(static_cast<std::size_t>(pr.h), 0.0f);
      p.dslopes = g.grad_slopes.data();
      break;
    case AttentionBiasKind::kDistanceTable:
      dtable.assign(static_cast<std::size_t>(pr.h * std::max<std::int64_t>(0, 2 * pr.j - 1)), 0.0f);
      p.dtable = dtable.data();
      break;
    case AttentionBiasKind::kDense:
      ddense = Tensor::empty({pr.b, pr.h, pr.i, pr.j}, DType::kFloat32);
      p.ddense = ddense.mutable_data<float>();
      break;
  }
  detail::attention_backward_kernel(p);
  if (bias.kind == AttentionBiasKind::kDistanceTable) {
    g.grad_table = table_gradient(bias.table, dtable, pr.h, pr.j);
  }
  if (bias.kind == AttentionBiasKind::kDense) g.grad_dense = dense_gradient(bias.dense, ddense);
  return g;
}

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionBias& bias, const AttentionOptions& options) {
  const Prepared pr = check("attention_reference", q, k, v, bias, options);
  if (pr.b * pr.h * pr.i * pr.d == 0) return Tensor::empty({pr.b, pr.h, pr.i, pr.d}, q.dtype());
  Tensor outf = Tensor::empty({pr.b, pr.h, pr.i, pr.d}, DType::kFloat32);
  const Tensor qf = q.to(DType::kFloat32);
  const Tensor kf = k.to(DType::kFloat32);
  const Tensor vf = v.to(DType::kFloat32);
  const float* qd = qf.data<float>();
  const float* kd = kf.data<float>();
  const float* vd = vf.data<float>();
  float* od = outf.mutable_data<float>();
  // The kernels' description, for the positions and the visible keys.
  const Described dsc = describe(pr, q, k, v, bias, options);
  const std::int64_t b = pr.b, h = pr.h, i = pr.i, j = pr.j, d = pr.d;
  const std::int64_t group = h / pr.hk;
  const double inf = std::numeric_limits<double>::infinity();
  const std::int64_t rows = b * h * i;
#pragma omp parallel
  {
    std::vector<double> score(static_cast<std::size_t>(j));
    std::vector<double> acc(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (std::int64_t flat = 0; flat < rows; ++flat) {
      const std::int64_t r = flat % i;
      const std::int64_t hh = (flat / i) % h;
      const std::int64_t bb = flat / (i * h);
      const std::int64_t kvh = hh / group;
      const std::int64_t qpos = detail::query_position(dsc.p, r);
      const detail::KeyRange visible = detail::visible_keys(dsc.p, qpos);
      const float* qrow = qd + flat * d;
      double mx = -inf;
      bool nan = false;
      for (std::int64_t c = visible.begin; c < visible.end; ++c) {
        const float* krow = kd + ((bb * pr.hk + kvh) * j + c) * d;
        double dot = 0.0;
        for (std::int64_t x = 0; x < d; ++x) dot += static_cast<double>(qrow[x]) * krow[x];
        double s = static_cast<double>(pr.scale) * dot;
        s += reference_bias(bias, pr, bb, hh, r, qpos, c);
        score[static_cast<std::size_t>(c)] = s;
        if (std::isnan(s)) nan = true;
        mx = std::max(mx, s);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      float* orow = od + flat * d;
      if (nan) {
        std::fill(orow, orow + d, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      if (mx == -inf) {  // no visible key (or all masked by -inf)
        std::fill(orow, orow + d, 0.0f);
        continue;
      }
      double sum = 0.0;
      for (std::int64_t c = visible.begin; c < visible.end; ++c) {
        const double e = std::exp(score[static_cast<std::size_t>(c)] - mx);
        sum += e;
        const float* vrow = vd + ((bb * pr.hk + kvh) * j + c) * d;
        for (std::int64_t x = 0; x < d; ++x) acc[static_cast<std::size_t>(x)] += e * vrow[x];
      }
      for (std::int64_t x = 0; x < d; ++x) {
        orow[x] = static_cast<float>(acc[static_cast<std::size_t>(x)] / sum);
      }
    }
  }
  return q.dtype() == DType::kFloat32 ? outf : outf.to(q.dtype());
}

}  // namespace posbias
