// Front functions of attention: argument checks, output sizing, the
// description of a call (detail::AttentionParams), dispatch to the fused
// kernel (kernels/attention_fused.cc), the backward kernel and the reference
// path (attention_reference.cc). The packed and KV-cache calls are in
// attention_kvcache.cc; the checks they share are declared in
// attention_front.h and defined here.
#include "posbias/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_front.h"
#include "attention_reference.h"
#include "checks.h"
#include "dtype_dispatch.h"
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

AttentionBias AttentionBias::alibi_f64(std::vector<double> slopes) {
  AttentionBias b;
  b.kind = AttentionBiasKind::kAlibi;
  b.slopes_f64 = std::move(slopes);
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

namespace detail {

void AttentionCall::fail(const std::string& what) const {
  throw std::invalid_argument(std::string(who) + ": " + what + " (" + names[0] + " " +
                              shape_string(q->shape()) + ", " + names[1] + " " +
                              shape_string(k->shape()) + ", " + names[2] + " " +
                              shape_string(v->shape()) + ")");
}

namespace {

bool is_float_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16 ||
         t == DType::kFloat64;
}

std::string num(std::int64_t x) { return std::to_string(x); }

// A double as its shortest round-trip form ("1e-50", "0.125", "inf", "nan").
std::string num_double(double x) {
  char buf[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x || !std::isfinite(x)) break;
  }
  return buf;
}

}  // namespace

void check_attention_dtypes(AttentionCall& call) {
  const DType qt = call.q->dtype(), kt = call.k->dtype(), vt = call.v->dtype();
  const bool same = qt == kt && qt == vt && is_float_dtype(qt);
  const bool mixed =
      qt == DType::kFloat32 && kt == vt && (kt == DType::kBFloat16 || kt == DType::kFloat16);
  if (!same && !mixed) {
    call.fail(
        "q, k and v must be of one dtype (float32, bfloat16, float16 or float64), or q float32 "
        "with k and v both bfloat16 or both float16; got " +
        dtype_name(qt) + ", " + dtype_name(kt) + ", " + dtype_name(vt));
  }
  call.p.dtype = qt;
  call.p.kv_dtype = kt;
}

void check_attention_options(AttentionCall& call, const AttentionOptions& options, bool ragged) {
  AttentionParams& p = call.p;
  if (p.d < 1) call.fail("d must be >= 1, got " + num(p.d));
  if (p.hk < 1 ? p.h != 0 : p.h % p.hk != 0) {
    call.fail("the query heads h = " + num(p.h) +
              " must be a multiple of the key/value heads hk = " + num(p.hk));
  }
  const bool f64 = p.dtype == DType::kFloat64;
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p.d));
  if (!std::isfinite(scale)) call.fail("scale must be finite, got " + num_double(scale));
  // float32 and 16-bit calls use the float32 roundings of scale and softcap.
  p.scale = options.scale ? static_cast<float>(scale) : 1.0f / std::sqrt(static_cast<float>(p.d));
  if (!f64 && !std::isfinite(p.scale)) {
    call.fail("scale must be finite as a float32 (a " + dtype_name(p.dtype) + " call), got " +
              num_double(scale));
  }
  p.causal = options.causal;
  if (options.window.left < -1 || options.window.right < -1) {
    call.fail("window entries must be >= -1 (-1: unbounded), got {" + num(options.window.left) +
              ", " + num(options.window.right) + "}");
  }
  p.window_left = options.window.left;
  p.window_right = options.window.right;
  if (!std::isfinite(options.softcap) || options.softcap < 0.0) {
    call.fail("softcap must be finite and >= 0 (0: off), got " + num_double(options.softcap));
  }
  p.softcap = static_cast<float>(options.softcap);
  if (!f64 && options.softcap > 0.0 && !(p.softcap > 0.0f && std::isfinite(p.softcap))) {
    call.fail("softcap must be a finite float32 > 0 (a " + dtype_name(p.dtype) + " call), got " +
              num_double(options.softcap));
  }
  if (f64) {
    call.dbl.scale = scale;
    call.dbl.softcap = options.softcap;
  }
  const Tensor& mask = options.key_mask;
  const bool has_mask = !(mask.numel() == 0 && mask.dim() != 2);
  if (ragged) {
    if (options.q_offset) {
      call.fail(
          "q_offset is for dense calls only (packed and paged queries are the last of "
          "each sequence), got " +
          num(*options.q_offset));
    }
    if (has_mask) {
      call.fail("key_mask is for dense calls only, got " + dtype_name(mask.dtype()) + " " +
                shape_string(mask.shape()));
    }
    return;
  }
  constexpr std::int64_t kMaxOffset = std::int64_t{1} << 60;
  if (options.q_offset && std::llabs(*options.q_offset) > kMaxOffset) {
    call.fail("q_offset must lie within +-2^60, got " + num(*options.q_offset));
  }
  p.q_offset = options.q_offset ? *options.q_offset : p.j - p.i;
  if (has_mask) {
    if (mask.dim() != 2 || mask.size(0) != p.b || mask.size(1) != p.j ||
        (mask.dtype() != DType::kBool && mask.dtype() != DType::kUInt8)) {
      call.fail("key_mask must be bool or uint8 [b, j] = [" + num(p.b) + ", " + num(p.j) +
                "], got " + dtype_name(mask.dtype()) + " " + shape_string(mask.shape()));
    }
    p.key_mask = mask.data<std::uint8_t>();
    p.key_mask_stride[0] = mask.strides()[0];
    p.key_mask_stride[1] = mask.strides()[1];
  }
}

void check_attention_bias(AttentionCall& call, const AttentionBias& bias, bool ragged) {
  AttentionParams& p = call.p;
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      p.bias = FusedBias::kNone;
      break;
    case AttentionBiasKind::kAlibi: {
      const bool f64 = p.dtype == DType::kFloat64;
      if (!bias.slopes_f64.empty() && (!f64 || !bias.slopes.empty())) {
        call.fail(f64 ? "give the ALiBi slopes once, as slopes or slopes_f64 (got " +
                            num(static_cast<std::int64_t>(bias.slopes.size())) + " and " +
                            num(static_cast<std::int64_t>(bias.slopes_f64.size())) + ")"
                      : "float64 ALiBi slopes (slopes_f64) need a float64 call, got q " +
                            dtype_name(p.dtype));
      }
      if (f64) {
        call.slopes64 = bias.slopes_f64.empty()
                            ? std::vector<double>(bias.slopes.begin(), bias.slopes.end())
                            : bias.slopes_f64;
      }
      const auto n = static_cast<std::int64_t>(f64 ? call.slopes64.size() : bias.slopes.size());
      if (n != p.h && n != p.b * p.h) {
        call.fail("ALiBi needs one slope per query head or one set per sequence: got " + num(n) +
                  " slopes for h = " + num(p.h) + ", b = " + num(p.b) + " (h or b * h slopes)");
      }
      for (std::int64_t x = 0; x < n; ++x) {
        const auto ux = static_cast<std::size_t>(x);
        const double sx = f64 ? call.slopes64[ux] : bias.slopes[ux];
        if (!std::isfinite(sx)) {
          call.fail("ALiBi slope " + num(x) + " is not finite (" + std::to_string(sx) + ")");
        }
      }
      p.bias = FusedBias::kAlibi;
      p.slopes = bias.slopes.data();
      if (f64) call.dbl.slopes = call.slopes64.data();
      p.slopes_seq_stride = n == p.h ? 0 : p.h;
      break;
    }
    case AttentionBiasKind::kDistanceTable: {
      const Tensor& t = bias.table;
      const bool dtype_ok = t.dtype() == DType::kFloat32 ||
                            (t.dtype() == DType::kFloat64 && p.dtype == DType::kFloat64);
      if (!dtype_ok || t.dim() != 2 || t.size(0) != p.h || t.size(1) % 2 == 0) {
        call.fail(std::string("the distance table must be ") +
                  (p.dtype == DType::kFloat64 ? "float32 or float64" : "float32") +
                  " [h, n] with h = " + num(p.h) +
                  " and n odd (read at its centre (n - 1) / 2), got " + dtype_name(t.dtype()) +
                  " table " + shape_string(t.shape()));
      }
      p.bias = FusedBias::kTable;
      p.table_centre = (t.size(1) - 1) / 2;
      break;
    }
    case AttentionBiasKind::kDense: {
      const Tensor& t = bias.dense;
      if (ragged) {
        call.fail(
            "a dense bias has no packed or paged layout; use ALiBi or a distance table (got " +
            shape_string(t.shape()) + ")");
      }
      const std::int64_t target[4] = {p.b, p.h, p.i, p.j};
      const DType want = p.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
      const std::string msg = "the dense bias " + shape_string(t.shape()) + " (" +
                              dtype_name(t.dtype()) + ") must be " + dtype_name(want) +
                              " (float64 exactly in a float64 call) and broadcastable to "
                              "[b, h, i, j] = " +
                              shape_string({p.b, p.h, p.i, p.j});
      if (t.dtype() != want || t.dim() > 4) call.fail(msg);
      const std::int64_t lead = 4 - t.dim();
      for (std::int64_t x = 0; x < 4; ++x) {
        p.dense_stride[x] = 0;
        if (x < lead) continue;  // missing leading dimension: broadcast
        const std::int64_t e = t.size(x - lead);
        if (e == target[x]) {
          p.dense_stride[x] = t.strides()[static_cast<std::size_t>(x - lead)];
        } else if (e != 1) {
          call.fail(msg);
        }
      }
      p.bias = FusedBias::kDense;
      if (want == DType::kFloat64) {
        call.dbl.dense = t.data<double>();
      } else {
        p.dense = t.data<float>();
      }
      break;
    }
  }
}

std::int64_t longest_visible_distance(const AttentionParams& p) {
  std::int64_t most = -1;
  // Dense calls: every sequence has the same rows and keys.
  const std::int64_t seqs =
      p.cu_q == nullptr && p.seqlen_k == nullptr ? std::min<std::int64_t>(p.b, 1) : p.b;
  for (std::int64_t s = 0; s < seqs; ++s) {
    const Sequence sq = sequence(p, s);
    for (std::int64_t r = 0; r < sq.i; ++r) {
      const std::int64_t qpos = sq.q_offset + r;
      const KeyRange kr = visible_keys(p, sq.j, qpos);
      if (kr.end <= kr.begin) continue;
      most = std::max<std::int64_t>(
          {most, std::llabs(qpos - kr.begin), std::llabs(kr.end - 1 - qpos)});
    }
  }
  return most;
}

void finish_attention_table(AttentionCall& call, const AttentionBias& bias) {
  AttentionParams& p = call.p;
  if (p.bias != FusedBias::kTable) return;
  const Tensor& t = bias.table;
  const std::int64_t centre = (t.size(1) - 1) / 2;
  const std::int64_t need = longest_visible_distance(p);
  if (need > centre) {
    call.fail("the distance table [h, n] = " + shape_string(t.shape()) +
              " is read at its centre (n - 1) / 2 = " + num(centre) +
              " and must cover the longest visible distance " + num(need) + ": n >= " +
              (need > (std::numeric_limits<std::int64_t>::max() - 1) / 2
                   ? "2 * " + num(need) + " + 1"
                   : num(2 * need + 1)));
  }
  // Only the entries a kernel may read are copied: |rel| <= reach, where
  // reach covers every visible pair and, for the backward's whole key
  // blocks, every |rel| < j (zeros past the user's table). Padding: a vector
  // before the first entry (a window's left edge) and 64 floats after.
  const std::int64_t reach = std::max<std::int64_t>({need, p.j - 1, 0});
  const std::int64_t copied = std::min(reach, centre);
  p.table_centre = reach;
  const std::int64_t front = 16;
  checked_numel({p.h, reach, 2}, DType::kFloat32);
  p.rtable_stride = front + 2 * reach + 1 + 64;
  const bool f64 = p.dtype == DType::kFloat64;
  checked_numel({p.h, p.rtable_stride}, f64 ? DType::kFloat64 : DType::kFloat32);
  const auto fill = [&](auto& rtable) {
    using T = typename std::decay_t<decltype(rtable)>::value_type;
    rtable.assign(static_cast<std::size_t>(p.h * p.rtable_stride), T{0});
    const std::int64_t s0 = t.strides()[0], s1 = t.strides()[1];
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      T* dst = rtable.data() + hh * p.rtable_stride + front + reach;  // rel 0
      for (std::int64_t rel = -copied; rel <= copied; ++rel) {
        // user entry rel' = -rel (q - k)
        dst[rel] =
            static_cast<T>(load_element(t.raw_data(), t.dtype(), hh * s0 + (centre - rel) * s1));
      }
    }
    return rtable.data() + front;
  };
  if (f64) {
    call.dbl.rtable = fill(call.rtable64);
  } else {
    p.rtable = fill(call.rtable);
  }
}

}  // namespace detail

namespace {

using detail::AttentionCall;
using detail::AttentionParams;
using detail::shape_string;

// Checks a dense call (q [b, h, i, d], k, v [b, hk, j, d]) and describes it
// in call.p; allocates only the reversed table, after every check.
void describe_dense(AttentionCall& call, const AttentionBias& bias,
                    const AttentionOptions& options) {
  const Tensor &q = *call.q, &k = *call.k, &v = *call.v;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    call.fail("q must be [b, h, i, d] and k, v [b, hk, j, d] (4-d)");
  }
  detail::check_attention_dtypes(call);
  if (k.shape() != v.shape()) call.fail("k and v must have the same shape");
  AttentionParams& p = call.p;
  p.b = q.size(0);
  p.h = q.size(1);
  p.i = q.size(2);
  p.d = q.size(3);
  p.hk = k.size(1);
  p.j = k.size(2);
  if (k.size(0) != p.b) call.fail("q and k must have the same batch size");
  if (k.size(3) != p.d) call.fail("q and k must have the same head dimension d");
  detail::check_attention_options(call, options, /*ragged=*/false);
  detail::check_attention_bias(call, bias, /*ragged=*/false);
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  std::copy_n(q.strides().data(), 4, p.q_stride);
  std::copy_n(k.strides().data(), 4, p.k_stride);
  std::copy_n(v.strides().data(), 4, p.v_stride);
  p.out_stride[0] = p.h * p.i * p.d;
  p.out_stride[1] = p.i * p.d;
  p.out_stride[2] = p.d;
  p.out_stride[3] = 1;
  p.lse_stride[0] = p.h * p.i;
  p.lse_stride[1] = p.i;
  p.lse_stride[2] = 1;
  detail::finish_attention_table(call, bias);
}

AttentionForwardResult forward_impl(const char* who, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionBias& bias,
                                    const AttentionOptions& options, bool want_lse) {
  AttentionCall call(who, q, k, v);
  describe_dense(call, bias, options);
  const AttentionParams& pr = call.p;
  AttentionForwardResult res;
  res.out = Tensor::empty({pr.b, pr.h, pr.i, pr.d}, q.dtype());
  if (want_lse) res.lse = Tensor::empty({pr.b, pr.h, pr.i}, detail::lse_dtype(pr));
  if (res.out.numel() == 0) return res;
  call.p.out = res.out.raw_mutable_data();
  if (want_lse) detail::set_forward_lse(call, res.lse);
  detail::run_attention_forward(call, /*reference=*/false);
  return res;
}

void check_like(const AttentionCall& call, const char* name, const Tensor& t,
                const std::vector<std::int64_t>& shape, DType dtype) {
  if (t.shape() != shape || t.dtype() != dtype) {
    call.fail(std::string(name) + " must be " + dtype_name(dtype) + " " + shape_string(shape) +
              ", got " + dtype_name(t.dtype()) + " " + shape_string(t.shape()));
  }
}

// dS [b, h, i, j] summed over the dimensions the dense bias broadcasts along
// (T: float, or double in a float64 call).
template <typename T>
Tensor dense_gradient(const Tensor& t, const Tensor& ddense) {
  const std::int64_t lead = 4 - t.dim();
  std::vector<std::int64_t> ext4(4, 1);
  for (std::int64_t x = lead; x < 4; ++x) ext4[static_cast<std::size_t>(x)] = t.size(x - lead);
  Tensor grad = Tensor::full(t.shape(), 0.0f, ddense.dtype());
  T* gd = grad.mutable_data<T>();
  const T* src = ddense.data<T>();
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
        T* dst = gd + base;
        if (ext4[3] == 1) {
          T sum = 0;
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

}  // namespace

namespace detail {

namespace {

// The kernel's table gradient [h, 2 reach + 1] (centre reach) into the
// user's [h, n] (T: float, or double in a float64 call).
template <typename T>
Tensor table_gradient(const AttentionParams& p, const Tensor& table, const std::vector<T>& dtable,
                      DType dtype) {
  const std::int64_t n = table.size(1), centre = (n - 1) / 2, reach = p.table_centre;
  const std::int64_t len = 2 * reach + 1;
  Tensor grad = Tensor::full(table.shape(), 0.0f, dtype);
  T* gt = grad.mutable_data<T>();
  for (std::int64_t hh = 0; hh < p.h; ++hh) {
    for (std::int64_t rel = -std::min(reach, centre); rel <= std::min(reach, centre); ++rel) {
      gt[hh * n + centre + rel] = dtable[static_cast<std::size_t>(hh * len + reach + rel)];
    }
  }
  return grad;
}

// Where a backward writes its bias gradients: the kernel's float pointers
// of AttentionParams (T float) or AttentionDouble's (T double, a float64 call).
template <typename T>
struct GradTargets {
  T** dslopes;
  T** dtable;
  T** ddense;
  std::vector<T>* slopes;  // g.grad_slopes or g.grad_slopes_f64
  std::size_t slope_count;
  DType dtype;
};

// Allocates the bias gradient buffers of the kind, runs the backward and maps
// the table and dense gradients into the user's shapes.
template <typename T, typename Run>
void backward_into(const AttentionParams& p, const AttentionBias& bias, const GradTargets<T>& t,
                   AttentionGradients& g, Run run) {
  std::vector<T> dtable;
  Tensor ddense;
  switch (bias.kind) {
    case AttentionBiasKind::kNone:
      break;
    case AttentionBiasKind::kAlibi:
      t.slopes->assign(t.slope_count, T{0});
      *t.dslopes = t.slopes->data();
      break;
    case AttentionBiasKind::kDistanceTable:
      dtable.assign(static_cast<std::size_t>(p.h * (2 * p.table_centre + 1)), T{0});
      *t.dtable = dtable.data();
      break;
    case AttentionBiasKind::kDense:
      ddense = Tensor::empty({p.b, p.h, p.i, p.j}, t.dtype);
      *t.ddense = ddense.mutable_data<T>();
      break;
  }
  run();
  if (bias.kind == AttentionBiasKind::kDistanceTable) {
    g.grad_table = table_gradient(p, bias.table, dtable, t.dtype);
  }
  if (bias.kind == AttentionBiasKind::kDense) g.grad_dense = dense_gradient<T>(bias.dense, ddense);
}

}  // namespace

DType lse_dtype(const AttentionParams& p) {
  return p.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

void set_forward_lse(AttentionCall& call, Tensor& lse) {
  if (call.p.dtype == DType::kFloat64) {
    call.dbl.lse = lse.mutable_data<double>();
  } else {
    call.p.lse = lse.mutable_data<float>();
  }
}

void set_saved_lse(AttentionCall& call, const Tensor& lse) {
  if (call.p.dtype == DType::kFloat64) {
    call.dbl.saved_lse = lse.data<double>();
  } else {
    call.p.saved_lse = lse.data<float>();
  }
}

void run_attention_forward(AttentionCall& call, bool reference) {
  if (call.p.dtype == DType::kFloat64) {
    attention_reference_run(call.p, &call.dbl);
  } else if (reference) {
    attention_reference_run(call.p);
  } else {
    fused_attention(call.p);
  }
}

void run_attention_backward(AttentionCall& call, const AttentionBias& bias, AttentionGradients& g) {
  AttentionParams& p = call.p;
  p.dq = g.grad_q.raw_mutable_data();
  p.dk = g.grad_k.raw_mutable_data();
  p.dv = g.grad_v.raw_mutable_data();
  if (p.dtype == DType::kFloat64) {  // the double reference backward
    AttentionDouble& dbl = call.dbl;
    const GradTargets<double> t{&dbl.dslopes,       &dbl.dtable,          &dbl.ddense,
                                &g.grad_slopes_f64, call.slopes64.size(), DType::kFloat64};
    backward_into(p, bias, t, g, [&] { attention_backward_reference(p, dbl); });
    g.grad_slopes.assign(g.grad_slopes_f64.begin(), g.grad_slopes_f64.end());
    return;
  }
  const GradTargets<float> t{&p.dslopes,     &p.dtable,          &p.ddense,
                             &g.grad_slopes, bias.slopes.size(), DType::kFloat32};
  backward_into(p, bias, t, g, [&] { attention_backward_kernel(p); });
}

}  // namespace detail

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
  AttentionCall call("attention_backward", q, k, v);
  describe_dense(call, bias, options);
  const AttentionParams pr = call.p;
  const std::vector<std::int64_t> qshape = {pr.b, pr.h, pr.i, pr.d};
  check_like(call, "out", out, qshape, q.dtype());
  check_like(call, "grad_out", grad_out, qshape, q.dtype());
  check_like(call, "lse", lse, {pr.b, pr.h, pr.i}, detail::lse_dtype(pr));
  AttentionGradients g;
  g.grad_q = Tensor::empty(qshape, q.dtype());
  g.grad_k = Tensor::empty(k.shape(), k.dtype());
  g.grad_v = Tensor::empty(v.shape(), v.dtype());
  AttentionParams& p = call.p;
  p.saved_out = out.raw_data();
  std::copy_n(out.strides().data(), 4, p.saved_out_stride);
  detail::set_saved_lse(call, lse);
  std::copy_n(lse.strides().data(), 3, p.saved_lse_stride);
  p.dout = grad_out.raw_data();
  std::copy_n(grad_out.strides().data(), 4, p.dout_stride);
  detail::run_attention_backward(call, bias, g);
  return g;
}

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionBias& bias, const AttentionOptions& options) {
  AttentionCall call("attention_reference", q, k, v);
  describe_dense(call, bias, options);
  const AttentionParams& pr = call.p;
  Tensor out = Tensor::empty({pr.b, pr.h, pr.i, pr.d}, q.dtype());
  if (out.numel() == 0) return out;
  call.p.out = out.raw_mutable_data();
  detail::run_attention_forward(call, /*reference=*/true);
  return out;
}

}  // namespace posbias
