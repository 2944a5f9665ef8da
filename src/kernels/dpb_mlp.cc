// The Dynamic Position Bias MLP (see dpb_mlp.h), compiled per instruction set
// by Highway and dispatched at run time.
//
// Why it looks like this: the MLP runs on a batch of scalar inputs (j or
// 2j - 1 distances), so every layer after the first is a small GEMM,
// [rows, dim] x [dim, dim]. Rows are processed in blocks of kBlockRows that
// stay in L1/L2 with the weights; within a block the kernel vectorises over
// output columns (weights transposed and zero-padded to whole vector pairs)
// and keeps a 4-row x 2-vector tile of accumulators in registers. Every
// output is `bias + sum_k a_k w_k` with fused multiply-adds in increasing k,
// whatever tile the row falls in, which is what makes a row's value
// independent of its neighbours. The backward pass recomputes a block's
// activations, then goes back through it, accumulating the weight gradients
// (again GEMMs, with the block's rows as the reduction dimension).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dpb_mlp.cc"
#include "kernels/dpb_mlp.h"

#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// Shared by every per-target copy of this file (compiled once).
#ifndef POSBIAS_SRC_KERNELS_DPB_MLP_SHARED_
#define POSBIAS_SRC_KERNELS_DPB_MLP_SHARED_
namespace posbias::detail::dpb_mlp_internal {

// Rows per block: the activations of a block (rows x dim floats per layer)
// stay in L1/L2 next to the weights.
constexpr std::int64_t kBlockRows = 64;

// Offsets of each parameter in the flat gradient layout used between the
// per-target backward and the front function: for l = 0..depth, W_l then
// b_l; then, with norm, for l < depth, LayerNorm weight then bias.
// Types here are per instruction set but not file-local (HWY_NAMESPACE is
// shared by every kernel file): names are unique across src/kernels so that
// their inline members never collide (an ODR violation ASan caught in Debug).
struct MlpFlatLayout {
  std::vector<std::int64_t> weight, bias, ln_weight, ln_bias;
  std::int64_t total = 0;
};

inline std::int64_t out_features(const DpbMlp& m, std::int64_t l) {
  return l < m.depth ? m.dim : m.heads;
}
inline std::int64_t in_features(const DpbMlp& m, std::int64_t l) { return l == 0 ? 1 : m.dim; }

inline MlpFlatLayout flat_layout(const DpbMlp& m) {
  MlpFlatLayout f;
  for (std::int64_t l = 0; l <= m.depth; ++l) {
    f.weight.push_back(f.total);
    f.total += out_features(m, l) * in_features(m, l);
    f.bias.push_back(f.total);
    f.total += out_features(m, l);
  }
  if (m.norm) {
    for (std::int64_t l = 0; l < m.depth; ++l) {
      f.ln_weight.push_back(f.total);
      f.total += m.dim;
      f.ln_bias.push_back(f.total);
      f.total += m.dim;
    }
  }
  return f;
}

}  // namespace posbias::detail::dpb_mlp_internal
#endif  // POSBIAS_SRC_KERNELS_DPB_MLP_SHARED_

#include <hwy/contrib/math/math-inl.h>

#include "kernels/dpb_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using dpb_mlp_internal::kBlockRows;

// DF, VF: kernels/dpb_gemm-inl.h.

std::int64_t RoundUp(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// The weights laid out for the kernels, zero-padded: ld = dim and ldh =
// heads rounded up to whole pairs of vectors. All pointers are vector-aligned.
struct MlpPacked {
  std::int64_t ld = 0;
  std::int64_t ldh = 0;
  hwy::AlignedFreeUniquePtr<float[]> storage;
  std::vector<float*> wt;   // W_l^T, [in_l][ldo_l] (the forward GEMMs)
  std::vector<float*> w;    // l >= 1: W_l, [out_l][ld] (the backward GEMMs)
  std::vector<float*> b;    // [ldo_l]
  std::vector<float*> lnw;  // [ld] (norm only)
  std::vector<float*> lnb;
};

MlpPacked Pack(const DpbMlp& m, bool for_backward) {
  const DF d;
  const std::int64_t pair = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  MlpPacked p;
  p.ld = RoundUp(m.dim, pair);
  p.ldh = RoundUp(m.heads, pair);
  const auto ldo = [&](std::int64_t l) { return l < m.depth ? p.ld : p.ldh; };
  std::int64_t total = 0;
  for (std::int64_t l = 0; l <= m.depth; ++l) {
    const std::int64_t in = l == 0 ? 1 : m.dim;
    const std::int64_t out = l < m.depth ? m.dim : m.heads;
    total += in * ldo(l) + ldo(l);
    if (for_backward && l >= 1) total += out * p.ld;
  }
  if (m.norm) total += 2 * m.depth * p.ld;
  p.storage = allocate_scratch<float>(total, "the DynamicPositionBias MLP's packed weights",
                                      m.scratch);
  float* at = p.storage.get();
  std::fill(at, at + total, 0.0f);
  for (std::int64_t l = 0; l <= m.depth; ++l) {
    const std::int64_t in = l == 0 ? 1 : m.dim;
    const std::int64_t out = l < m.depth ? m.dim : m.heads;
    float* wt = at;
    at += in * ldo(l);
    for (std::int64_t o = 0; o < out; ++o) {
      for (std::int64_t k = 0; k < in; ++k) wt[k * ldo(l) + o] = m.weight[l][o * in + k];
    }
    p.wt.push_back(wt);
    float* b = at;
    at += ldo(l);
    std::copy(m.bias[l], m.bias[l] + out, b);
    p.b.push_back(b);
    if (for_backward && l >= 1) {
      float* w = at;
      at += out * p.ld;
      for (std::int64_t o = 0; o < out; ++o) {
        std::copy(m.weight[l] + o * in, m.weight[l] + (o + 1) * in, w + o * p.ld);
      }
      p.w.push_back(w);
    } else {
      p.w.push_back(nullptr);
    }
  }
  if (m.norm) {
    for (std::int64_t l = 0; l < m.depth; ++l) {
      p.lnw.push_back(at);
      std::copy(m.ln_weight[l], m.ln_weight[l] + m.dim, at);
      at += p.ld;
      p.lnb.push_back(at);
      std::copy(m.ln_bias[l], m.ln_bias[l] + m.dim, at);
      at += p.ld;
    }
  }
  return p;
}

// SiLU(u) = u / (1 + exp(-u)), as PyTorch computes it. exp's argument is
// capped at 88 (exp(88) ~ 1.7e38 is finite; below u = -88 the result is
// below 1e-36 in magnitude either way).
HWY_INLINE VF ExpNeg(DF d, VF u) { return hn::Exp(d, hn::Min(hn::Neg(u), hn::Set(d, 88.0f))); }

HWY_INLINE VF Silu(DF d, VF u) { return hn::Div(u, hn::Add(hn::Set(d, 1.0f), ExpNeg(d, u))); }

// SiLU'(u) = s (1 + u (1 - s)), s = sigmoid(u).
HWY_INLINE VF SiluGrad(DF d, VF u) {
  const VF one = hn::Set(d, 1.0f);
  const VF s = hn::Div(one, hn::Add(one, ExpNeg(d, u)));
  return hn::Mul(s, hn::MulAdd(u, hn::Sub(one, s), one));
}

// The activations of one block of rows. Buffers are [kBlockRows][ld] (y:
// [kBlockRows][ldh]), vector-aligned. The backward keeps every layer's; the
// forward needs only the current layer's, so there its layers share three
// planes (u, and a ping-ponging between two) and one for zhat: its scratch
// does not grow with depth (at depth 300000 it was 2.4 GB per thread).
struct MlpWork {
  hwy::AlignedFreeUniquePtr<float[]> storage;
  std::vector<float*> u;     // l < depth: pre-activation (after LayerNorm)
  std::vector<float*> zhat;  // l < depth, norm only: normalised z
  std::vector<float*> a;     // l = 1..depth: a_l (a[0] unused)
  std::vector<float> rstd;   // [depth][kBlockRows] (forward: [kBlockRows])
  bool shared_layers = false;
  float* y = nullptr;        // output layer / its gradient
  float* da = nullptr;       // backward scratch
  float* dz = nullptr;
  float* rstd_row(std::int64_t l) { return rstd.data() + (shared_layers ? 0 : l * kBlockRows); }
};

// Planes of kBlockRows x ld floats MakeWork allocates (besides y).
std::int64_t WorkPlanes(const DpbMlp& m, bool for_backward) {
  return for_backward ? m.depth * (m.norm ? 3 : 2) + 2 : (m.norm ? 4 : 3);
}

MlpWork MakeWork(const DpbMlp& m, const MlpPacked& p, bool for_backward) {
  MlpWork w;
  w.shared_layers = !for_backward;
  const std::int64_t plane = kBlockRows * p.ld;
  const std::int64_t total = WorkPlanes(m, for_backward) * plane + kBlockRows * p.ldh;
  w.storage = allocate_scratch<float>(total, "the DynamicPositionBias MLP's activations", m.scratch);
  float* at = w.storage.get();
  std::fill(at, at + total, 0.0f);
  const auto take = [&] {
    float* plane_at = at;
    at += plane;
    return plane_at;
  };
  resize_scratch(w.u, m.depth, "the DynamicPositionBias MLP's layer list");
  resize_scratch(w.a, m.depth + 1, "the DynamicPositionBias MLP's layer list");
  if (m.norm) resize_scratch(w.zhat, m.depth, "the DynamicPositionBias MLP's layer list");
  if (for_backward) {
    for (std::int64_t l = 0; l < m.depth; ++l) {
      w.u[l] = take();
      w.a[l + 1] = take();
      if (m.norm) w.zhat[l] = take();
    }
    w.da = take();
    w.dz = take();
  } else {
    float* u = take();
    float* a0 = take();
    float* a1 = take();
    float* zhat = m.norm ? take() : nullptr;
    for (std::int64_t l = 0; l < m.depth; ++l) {
      w.u[l] = u;
      w.a[l + 1] = l % 2 == 0 ? a0 : a1;  // layer l reads a[l], the other one
      if (m.norm) w.zhat[l] = zhat;
    }
  }
  w.y = at;
  resize_scratch(w.rstd, (for_backward ? m.depth : 1) * kBlockRows,
                 "the DynamicPositionBias MLP's LayerNorm statistics", 0.0f);
  return w;
}

// Sum of all lanes of v, as a float.
HWY_INLINE float SumLanes(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

// LayerNorm of one row in place (z -> u), keeping zhat and 1/sigma for the
// backward pass. Mean and biased variance over the dim real columns (the
// padding columns of z are zero and masked out of the variance), in float,
// like PyTorch; the padding columns of u and zhat stay zero.
HWY_INLINE void LayerNormRow(DF d, float* HWY_RESTRICT z, float* HWY_RESTRICT zhat, float* rstd_out,
                             const float* HWY_RESTRICT gamma, const float* HWY_RESTRICT beta,
                             std::int64_t dim, std::int64_t ld, float eps) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  VF sum = hn::Zero(d);
  for (std::int64_t c = 0; c < ld; c += n) sum = hn::Add(sum, hn::Load(d, z + c));
  const float inv_dim = 1.0f / static_cast<float>(dim);
  const VF vmean = hn::Set(d, SumLanes(d, sum) * inv_dim);
  VF sq = hn::Zero(d);
  for (std::int64_t c = 0; c < ld; c += n) {
    VF dev = hn::Sub(hn::Load(d, z + c), vmean);
    if (c + n > dim)
      dev = hn::IfThenElseZero(
          hn::FirstN(d, static_cast<std::size_t>(std::max<std::int64_t>(dim - c, 0))), dev);
    sq = hn::MulAdd(dev, dev, sq);
  }
  const float var = SumLanes(d, sq) * inv_dim;
  const float rstd = 1.0f / std::sqrt(var + eps);
  *rstd_out = rstd;
  const VF vrstd = hn::Set(d, rstd);
  for (std::int64_t c = 0; c < ld; c += n) {
    VF zh = hn::Mul(hn::Sub(hn::Load(d, z + c), vmean), vrstd);
    if (c + n > dim)
      zh = hn::IfThenElseZero(
          hn::FirstN(d, static_cast<std::size_t>(std::max<std::int64_t>(dim - c, 0))), zh);
    hn::Store(zh, d, zhat + c);
    hn::Store(hn::MulAdd(zh, hn::Load(d, gamma + c), hn::Load(d, beta + c)), d, z + c);
  }
}

// Forward pass of rows x[0..rows) into w (the output in w.y, [rows][ldh]).
void ForwardBlock(const DpbMlp& m, const MlpPacked& p, const float* x, std::int64_t rows, MlpWork& w) {
  const DF d;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t ld = p.ld;
  for (std::int64_t l = 0; l < m.depth; ++l) {
    float* u = w.u[l];
    if (l == 0) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const VF xv = hn::Set(d, x[r]);
        for (std::int64_t c = 0; c < ld; c += n) {
          hn::Store(hn::MulAdd(xv, hn::Load(d, p.wt[0] + c), hn::Load(d, p.b[0] + c)), d,
                    u + r * ld + c);
        }
      }
    } else {
      Gemm(w.a[l], ld, 1, rows, m.dim, p.wt[l], ld, p.b[l], Init::kBias, u, ld, ld);
    }
    if (m.norm) {
      for (std::int64_t r = 0; r < rows; ++r) {
        LayerNormRow(d, u + r * ld, w.zhat[l] + r * ld, w.rstd_row(l) + r, p.lnw[l],
                     p.lnb[l], m.dim, ld, m.eps);
      }
    }
    float* a = w.a[l + 1];
    for (std::int64_t k = 0; k < rows * ld; k += n) {
      hn::Store(Silu(d, hn::Load(d, u + k)), d, a + k);
    }
  }
  Gemm(w.a[m.depth], ld, 1, rows, m.dim, p.wt[m.depth], p.ldh, p.b[m.depth], Init::kBias, w.y,
       p.ldh, p.ldh);
}

void ForwardRows(const DpbMlp& m, const float* x, std::int64_t begin, std::int64_t end, float* y,
                 std::int64_t y_stride) {
  if (begin >= end) return;
  const MlpPacked p = Pack(m, /*for_backward=*/false);
  MlpWork w = MakeWork(m, p, /*for_backward=*/false);
  for (std::int64_t k0 = begin; k0 < end; k0 += kBlockRows) {
    const std::int64_t rows = std::min(kBlockRows, end - k0);
    ForwardBlock(m, p, x + k0, rows, w);
    for (std::int64_t h = 0; h < m.heads; ++h) {
      float* out = y + h * y_stride + k0;
      for (std::int64_t r = 0; r < rows; ++r) out[r] = w.y[r * p.ldh + h];
    }
  }
}

// acc[c] += sum_{r < rows} src[r * ld + c] for c < cols (rows in order).
HWY_INLINE void AddColumnSums(DF d, const float* HWY_RESTRICT src, std::int64_t rows,
                              std::int64_t ld, std::int64_t cols, float* HWY_RESTRICT acc) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t c = 0; c < cols; c += n) {
    VF v = hn::Load(d, acc + c);
    for (std::int64_t r = 0; r < rows; ++r) v = hn::Add(v, hn::Load(d, src + r * ld + c));
    hn::Store(v, d, acc + c);
  }
}

// Gradients of rows [begin, end) into out (flat layout, overwritten).
void BackwardRows(const DpbMlp& m, const float* x, const float* g, std::int64_t g_stride,
                  std::int64_t begin, std::int64_t end, float* out) {
  const DF d;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(d));
  const MlpPacked p = Pack(m, /*for_backward=*/true);
  MlpWork w = MakeWork(m, p, /*for_backward=*/true);
  const std::int64_t ld = p.ld;
  const std::int64_t ldh = p.ldh;
  const std::int64_t depth = m.depth;

  // Padded accumulators: dW_0 [ld], dW_l [dim][ld], dW_depth [heads][ld];
  // db_l [ldo_l]; LayerNorm [ld] each.
  std::vector<std::int64_t> dw_at, db_at, dlnw_at, dlnb_at;
  std::int64_t total = 0;
  for (std::int64_t l = 0; l <= depth; ++l) {
    dw_at.push_back(total);
    total += (l == 0 ? 1 : (l < depth ? m.dim : m.heads)) * ld;
    db_at.push_back(total);
    total += l < depth ? ld : ldh;
  }
  if (m.norm) {
    for (std::int64_t l = 0; l < depth; ++l) {
      dlnw_at.push_back(total);
      total += ld;
      dlnb_at.push_back(total);
      total += ld;
    }
  }
  auto acc = allocate_scratch<float>(total, "the DynamicPositionBias MLP's gradient accumulator",
                                     m.scratch);
  std::fill(acc.get(), acc.get() + total, 0.0f);
  float* A = acc.get();

  for (std::int64_t k0 = begin; k0 < end; k0 += kBlockRows) {
    const std::int64_t rows = std::min(kBlockRows, end - k0);
    ForwardBlock(m, p, x + k0, rows, w);
    // The incoming gradient, [rows][ldh] with zero padding.
    float* gy = w.y;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t h = 0; h < ldh; ++h) {
        gy[r * ldh + h] = h < m.heads ? g[h * g_stride + k0 + r] : 0.0f;
      }
    }
    AddColumnSums(d, gy, rows, ldh, ldh, A + db_at[depth]);
    // dW_depth[h][:] += sum_r gy[r][h] a_depth[r][:]
    Gemm(gy, 1, ldh, m.heads, rows, w.a[depth], ld, nullptr, Init::kAccumulate, A + dw_at[depth],
         ld, ld);
    // da = gy W_depth
    float* da = w.da;
    float* dz = w.dz;
    Gemm(gy, ldh, 1, rows, m.heads, p.w[depth], ld, nullptr, Init::kZero, da, ld, ld);
    for (std::int64_t l = depth - 1; l >= 0; --l) {
      const float* u = w.u[l];
      for (std::int64_t k = 0; k < rows * ld; k += n) {
        hn::Store(hn::Mul(hn::Load(d, da + k), SiluGrad(d, hn::Load(d, u + k))), d, da + k);
      }
      // da now holds du, the gradient at the LayerNorm output (or z).
      const float* dzl = da;
      if (m.norm) {
        const float* zhat = w.zhat[l];
        float* dgamma = A + dlnw_at[l];
        for (std::int64_t c = 0; c < ld; c += n) {
          VF v = hn::Load(d, dgamma + c);
          for (std::int64_t r = 0; r < rows; ++r) {
            v = hn::MulAdd(hn::Load(d, da + r * ld + c), hn::Load(d, zhat + r * ld + c), v);
          }
          hn::Store(v, d, dgamma + c);
        }
        AddColumnSums(d, da, rows, ld, ld, A + dlnb_at[l]);
        for (std::int64_t r = 0; r < rows; ++r) {
          float* dzr = dz + r * ld;
          const float* zr = zhat + r * ld;
          // dzhat = du * gamma (zero in the padding, as gamma is there).
          VF s1 = hn::Zero(d);
          VF s2 = hn::Zero(d);
          for (std::int64_t c = 0; c < ld; c += n) {
            const VF dzh = hn::Mul(hn::Load(d, da + r * ld + c), hn::Load(d, p.lnw[l] + c));
            s1 = hn::Add(s1, dzh);
            s2 = hn::MulAdd(dzh, hn::Load(d, zr + c), s2);
            hn::Store(dzh, d, dzr + c);
          }
          const float inv_dim = 1.0f / static_cast<float>(m.dim);
          const VF m1 = hn::Set(d, SumLanes(d, s1) * inv_dim);
          const VF m2 = hn::Set(d, SumLanes(d, s2) * inv_dim);
          const VF rs = hn::Set(d, w.rstd_row(l)[r]);
          for (std::int64_t c = 0; c < ld; c += n) {
            const VF v =
                hn::Sub(hn::Sub(hn::Load(d, dzr + c), m1), hn::Mul(hn::Load(d, zr + c), m2));
            hn::Store(hn::Mul(rs, v), d, dzr + c);
          }
          for (std::int64_t c = m.dim; c < ld; ++c) dzr[c] = 0.0f;
        }
        dzl = dz;
      }
      AddColumnSums(d, dzl, rows, ld, ld, A + db_at[l]);
      if (l == 0) {
        float* dw0 = A + dw_at[0];
        for (std::int64_t c = 0; c < ld; c += n) {
          VF v = hn::Load(d, dw0 + c);
          for (std::int64_t r = 0; r < rows; ++r) {
            v = hn::MulAdd(hn::Set(d, x[k0 + r]), hn::Load(d, dzl + r * ld + c), v);
          }
          hn::Store(v, d, dw0 + c);
        }
      } else {
        // dW_l[o][:] += sum_r dz[r][o] a_l[r][:]; then da = dz W_l.
        Gemm(dzl, 1, ld, m.dim, rows, w.a[l], ld, nullptr, Init::kAccumulate, A + dw_at[l], ld, ld);
        float* next = dzl == da ? dz : da;
        Gemm(dzl, ld, 1, rows, m.dim, p.w[l], ld, nullptr, Init::kZero, next, ld, ld);
        if (next != da) std::swap(da, dz);
      }
    }
  }

  // Unpad into the flat layout.
  const dpb_mlp_internal::MlpFlatLayout f = dpb_mlp_internal::flat_layout(m);
  for (std::int64_t l = 0; l <= depth; ++l) {
    const std::int64_t in = l == 0 ? 1 : m.dim;
    const std::int64_t outf = l < depth ? m.dim : m.heads;
    float* wo = out + f.weight[l];
    if (l == 0) {
      for (std::int64_t o = 0; o < outf; ++o) wo[o] = A[dw_at[0] + o];
    } else {
      for (std::int64_t o = 0; o < outf; ++o) {
        std::copy(A + dw_at[l] + o * ld, A + dw_at[l] + o * ld + in, wo + o * in);
      }
    }
    std::copy(A + db_at[l], A + db_at[l] + outf, out + f.bias[l]);
  }
  if (m.norm) {
    for (std::int64_t l = 0; l < depth; ++l) {
      std::copy(A + dlnw_at[l], A + dlnw_at[l] + m.dim, out + f.ln_weight[l]);
      std::copy(A + dlnb_at[l], A + dlnb_at[l] + m.dim, out + f.ln_bias[l]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <new>
#include <stdexcept>
#include <string>

#include "checks.h"
#include "kernels/scratch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace posbias::detail {

HWY_EXPORT(ForwardRows);
HWY_EXPORT(BackwardRows);

namespace {

// Subnormal floats as zero (inputs and results) on this thread while the
// kernel runs, then the caller's mode back. Large distances drive SiLU deep
// into its tail (sigmoid(-100) ~ 4e-44), and on x86 every operation on a
// subnormal costs a microcode assist, which made the backward pass several
// times slower. Only values below 1.2e-38 in magnitude change (to zero),
// far below the precision of anything they are added to.
class FlushSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// Multiply-adds per input row (forward).
double work_per_row(const DpbMlp& m) {
  return static_cast<double>(m.dim) *
         (static_cast<double>(m.dim) * static_cast<double>(m.depth - 1) +
          static_cast<double>(m.heads) + 1.0);
}

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr double kParallelWork = 1 << 20;

// How many threads may run a kernel whose scratch is `per_thread` bytes each:
// as many as fit in 1/8 of the machine's memory (results are the same for
// any number), at most `wanted`. Throws std::length_error before anything is
// allocated when one thread's does not fit in the whole memory.
int threads_for_scratch(const DpbMlp& m, bool backward, int wanted) {
  const double per_thread = dpb_mlp_scratch_bytes(m.dim, m.heads, m.depth, m.norm, backward);
  const double memory = static_cast<double>(physical_memory_bytes());
  if (per_thread > memory) {
    throw std::length_error(
        std::string("DynamicPositionBias: the MLP's ") + (backward ? "backward" : "forward") +
        " needs about " + std::to_string(static_cast<std::uint64_t>(per_thread)) +
        " bytes of working memory (dim " + std::to_string(m.dim) + ", heads " +
        std::to_string(m.heads) + ", depth " + std::to_string(m.depth) +
        "), more than this machine's " + std::to_string(physical_memory_bytes()) +
        " bytes of memory");
  }
  const double fit = std::max(1.0, memory / 8.0 / per_thread);
  return std::max(1, std::min(wanted, static_cast<int>(std::min(fit, 1024.0))));
}

// Runs a kernel call, turning a std::bad_alloc of one of its small lists
// (the aligned buffers already throw allocation_error) into the same error.
template <typename Fn>
void with_allocation_errors(const DpbMlp& m, bool backward, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    throw allocation_error(
        static_cast<std::size_t>(dpb_mlp_scratch_bytes(m.dim, m.heads, m.depth, m.norm, backward)),
        "the DynamicPositionBias MLP's working memory");
  }
}

}  // namespace

double dpb_mlp_scratch_bytes(std::int64_t dim, std::int64_t heads, std::int64_t depth, bool norm,
                             bool backward) {
  // Padding as on the widest instruction set compiled (two vectors).
  const double pair = 2.0 * HWY_MAX_BYTES / sizeof(float);
  const auto round_up = [&](double x) { return std::ceil(x / pair) * pair; };
  const double d = static_cast<double>(dim);
  const double h = static_cast<double>(heads);
  const double layers = static_cast<double>(depth);
  const double ld = round_up(d);
  const double ldh = round_up(h);
  const double rows = static_cast<double>(dpb_mlp_internal::kBlockRows);
  // Pack(): W^T and b per layer, W again going backward, LayerNorm.
  double floats = (ld + ld) + (layers - 1.0) * (d * ld + ld) + (d * ldh + ldh);
  if (backward) floats += (layers - 1.0) * d * ld + h * ld;
  if (norm) floats += 2.0 * layers * ld;
  // MakeWork(): activation planes, the output block, LayerNorm statistics.
  const double planes = backward ? layers * (norm ? 3.0 : 2.0) + 2.0 : (norm ? 4.0 : 3.0);
  floats += planes * rows * ld + rows * ldh + (backward ? layers : 1.0) * rows;
  // Backward: the padded accumulator (about the packed weights) and the
  // thread's partial gradient in the flat layout.
  if (backward) {
    const double params =
        2.0 * d + (layers - 1.0) * (d * d + d) + h * d + h + (norm ? 2.0 * layers * d : 0.0);
    floats += (ld + ld) + (layers - 1.0) * (d * ld + ld) + (h * ld + ldh) +
              (norm ? 2.0 * layers * ld : 0.0) + params;
  }
  // Per-layer pointer lists (packed weights, activations): about 8 per layer.
  return floats * sizeof(float) + 8.0 * sizeof(float*) * (layers + 1.0);
}

void dpb_mlp_forward_serial(const DpbMlp& mlp, const float* x, std::int64_t n, float* y,
                            std::int64_t y_stride) {
  if (n <= 0) return;
  threads_for_scratch(mlp, /*backward=*/false, 1);
  const FlushSubnormals flush;
  with_allocation_errors(mlp, /*backward=*/false,
                         [&] { HWY_DYNAMIC_DISPATCH(ForwardRows)(mlp, x, 0, n, y, y_stride); });
}

void dpb_mlp_forward(const DpbMlp& mlp, const float* x, std::int64_t n, float* y,
                     std::int64_t y_stride) {
  if (n <= 0) return;
  const int threads = threads_for_scratch(mlp, /*backward=*/false, omp_get_max_threads());
  if (work_per_row(mlp) * static_cast<double>(n) < kParallelWork || threads == 1) {
    dpb_mlp_forward_serial(mlp, x, n, y, y_stride);
    return;
  }
  ThreadErrors errors;
#pragma omp parallel num_threads(threads)
  errors.run([&] {
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const FlushSubnormals flush;
    with_allocation_errors(mlp, /*backward=*/false, [&] {
      HWY_DYNAMIC_DISPATCH(ForwardRows)(mlp, x, n * t / nt, n * (t + 1) / nt, y, y_stride);
    });
  });
  errors.rethrow();
}

void dpb_mlp_backward(const DpbMlp& mlp, const float* x, std::int64_t n, const float* g,
                      std::int64_t g_stride, const DpbMlpGrads& grads) {
  using dpb_mlp_internal::kBlockRows;
  // A thread's scratch (its partial, the padded accumulator, the packed
  // weights, every layer's activations of a block): at most as many threads
  // as fit in 1/8 of the machine's memory with it (results are the same for
  // any number); refused before anything is allocated when one does not fit.
  const int memory_threads = threads_for_scratch(mlp, /*backward=*/true, omp_get_max_threads());
  const dpb_mlp_internal::MlpFlatLayout f = dpb_mlp_internal::flat_layout(mlp);
  // Fixed slots of whole blocks, independent of the thread count; each slot's
  // partial gradient is added to the double sum in slot order (an ordered
  // section), so the result does not depend on the threads. Each thread
  // holds one partial gradient at a time, not one per slot: 64 slots of a
  // dim-4096 gradient were 4 GB.
  constexpr std::int64_t kMaxSlots = 64;
  constexpr std::int64_t kMinSlotRows = 4 * kBlockRows;
  std::int64_t slot_rows = std::max(kMinSlotRows, (n + kMaxSlots - 1) / kMaxSlots);
  slot_rows = (slot_rows + kBlockRows - 1) / kBlockRows * kBlockRows;
  const std::int64_t slots = n <= 0 ? 0 : (n + slot_rows - 1) / slot_rows;
  const int threads = static_cast<int>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(slots, memory_threads)));
  const bool parallel = threads > 1 && work_per_row(mlp) * static_cast<double>(n) >= kParallelWork;
  std::vector<double> sum;
  resize_scratch(sum, f.total, "the DynamicPositionBias MLP's gradient sum", 0.0);
  // A failed allocation on one thread: the others skip their remaining
  // slots (each still passes its ordered section, in order) and the error
  // is rethrown here.
  ThreadErrors errors;
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> partial;
    errors.run([&] {
      resize_scratch(partial, f.total, "the DynamicPositionBias MLP's partial gradient");
    });
#pragma omp for ordered schedule(dynamic, 1)
    for (std::int64_t s = 0; s < slots; ++s) {
      const std::int64_t begin = s * slot_rows;
      const std::int64_t end = std::min(n, begin + slot_rows);
      if (!errors.failed()) {
        errors.run([&] {
          const FlushSubnormals flush;
          with_allocation_errors(mlp, /*backward=*/true, [&] {
            HWY_DYNAMIC_DISPATCH(BackwardRows)(mlp, x, g, g_stride, begin, end, partial.data());
          });
        });
      }
#pragma omp ordered
      if (!errors.failed()) {
        for (std::int64_t k = 0; k < f.total; ++k) {
          sum[static_cast<std::size_t>(k)] += partial[static_cast<std::size_t>(k)];
        }
      }
    }
  }
  errors.rethrow();
  const auto write = [&](float* dst, std::int64_t at, std::int64_t count) {
    for (std::int64_t k = 0; k < count; ++k) {
      dst[k] = static_cast<float>(sum[static_cast<std::size_t>(at + k)]);
    }
  };
  for (std::int64_t l = 0; l <= mlp.depth; ++l) {
    const std::int64_t in = dpb_mlp_internal::in_features(mlp, l);
    const std::int64_t out = dpb_mlp_internal::out_features(mlp, l);
    write(grads.weight[static_cast<std::size_t>(l)], f.weight[static_cast<std::size_t>(l)],
          out * in);
    write(grads.bias[static_cast<std::size_t>(l)], f.bias[static_cast<std::size_t>(l)], out);
  }
  if (mlp.norm) {
    for (std::int64_t l = 0; l < mlp.depth; ++l) {
      write(grads.ln_weight[static_cast<std::size_t>(l)], f.ln_weight[static_cast<std::size_t>(l)],
            mlp.dim);
      write(grads.ln_bias[static_cast<std::size_t>(l)], f.ln_bias[static_cast<std::size_t>(l)],
            mlp.dim);
    }
  }
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
