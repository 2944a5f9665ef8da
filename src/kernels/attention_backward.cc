// The recomputing backward of the fused attention, compiled once per
// instruction set by Highway and chosen at run time. See
// attention_backward.h.
//
// A task owns one (batch, query head). It packs the head's q and dO (rows of
// dp floats), K (rows) and K^T, V^T (d rows over the keys) into float32
// once, then walks key blocks (outer) and the query blocks that can see them
// (inner), FlashAttention-2's order: the key block's dK and dV rows stay in
// cache while the query blocks stream past, dQ accumulates in a per-thread
// [i, dp] buffer. Per (query block, key block):
//
//   S  = Q K^T (register-tiled product), then per row s = scale S + bias,
//        P = exp(s - lse) over the visible keys (0 elsewhere);
//   dP = dO V^T;  dS = P (dP - D), D = rowsum(dO * out);
//   dV += P^T dO;  dK += dS^T Q;  dQ += dS K   (dK, dQ times scale at the end);
//   table: dS added into a reversed per-head diagonal accumulator (row r's
//   keys are a forward window of it), slopes: sum of dS * -|c - q_r|,
//   dense: dS written out.
//
// All five products use one micro-kernel, C[R rows][V vectors] (+)= sum_t
// A(row, t) B[t][columns], with A read through two strides (so P^T and dS^T
// need no transposition) and B row-major.
//
// dK and dV are accumulated per query head in float32 and summed over the
// heads of a kv group (GQA) in a fixed order at the end; the table and slope
// gradients likewise per (batch, head), summed over the batch: the result
// does not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_backward.cc"
// foreach_target.h before any other Highway header (math-inl.h includes
// highway.h): otherwise clang compiles the static target twice. The
// clang-format guard keeps include sorting from moving it.
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// clang-format on
#include "kernels/attention_backward.h"

#include <hwy/aligned_allocator.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Names in this file are unique across src/kernels (shared HWY_NAMESPACE).
using BwdDF = hn::ScalableTag<float>;
using BwdVF = hn::Vec<BwdDF>;

constexpr int kBwdRows = 4;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kBwdVecs = 4;
#else
constexpr int kBwdVecs = 2;
#endif

constexpr float kBwdNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
HWY_INLINE float BwdToF(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_float(x);
  }
}

template <typename T>
void BwdPackRowT(const T* src, std::int64_t stride, std::int64_t n, float* dst) {
  for (std::int64_t x = 0; x < n; ++x) dst[x] = BwdToF(src[x * stride]);
}

// dst[0..n) = src[offset + x * stride] as float32.
void BwdPackRow(const void* base, DType dt, std::int64_t offset, std::int64_t stride,
                std::int64_t n, float* dst) {
  switch (dt) {
    case DType::kFloat32:
      BwdPackRowT(static_cast<const float*>(base) + offset, stride, n, dst);
      break;
    case DType::kBFloat16:
      BwdPackRowT(static_cast<const bfloat16*>(base) + offset, stride, n, dst);
      break;
    case DType::kFloat16:
      BwdPackRowT(static_cast<const float16*>(base) + offset, stride, n, dst);
      break;
  }
}

// base[offset + x] = mul * src[x] rounded once to dt.
void BwdStoreRow(const float* src, std::int64_t n, float mul, DType dt, void* base,
                 std::int64_t offset) {
  switch (dt) {
    case DType::kFloat32: {
      float* o = static_cast<float*>(base) + offset;
      for (std::int64_t x = 0; x < n; ++x) o[x] = src[x] * mul;
      break;
    }
    case DType::kBFloat16: {
      bfloat16* o = static_cast<bfloat16*>(base) + offset;
      for (std::int64_t x = 0; x < n; ++x) o[x] = to_bfloat16(src[x] * mul);
      break;
    }
    case DType::kFloat16: {
      float16* o = static_cast<float16*>(base) + offset;
      for (std::int64_t x = 0; x < n; ++x) o[x] = to_float16(src[x] * mul);
      break;
    }
  }
}

// exp(x), flushed to 0 below -40 as in the forward (those terms did not
// count there either), NaN stays NaN.
HWY_INLINE BwdVF BwdExp(BwdDF df, BwdVF x) {
  const BwdVF lo = hn::Set(df, -40.0f);
  const auto under = hn::Lt(x, lo);
  return hn::IfThenZeroElse(under, hn::Exp(df, hn::IfThenElse(under, lo, x)));
}

// C[r][x .. x + V N) (+)= sum_t a[r * a_row + t * a_t] * b[t * ldb + x ..].
template <int R, int V>
HWY_INLINE void BwdTile(BwdDF df, const float* HWY_RESTRICT a, std::int64_t a_row, std::int64_t a_t,
                        const float* HWY_RESTRICT b, std::int64_t ldb, std::int64_t t_count,
                        float* HWY_RESTRICT c, std::int64_t ldc, bool accumulate) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  BwdVF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) {
      acc[r][u] = accumulate ? hn::LoadU(df, c + r * ldc + u * n) : hn::Zero(df);
    }
  }
  for (std::int64_t t = 0; t < t_count; ++t) {
    BwdVF bv[V];
    for (int u = 0; u < V; ++u) bv[u] = hn::LoadU(df, b + t * ldb + u * n);
    for (int r = 0; r < R; ++r) {
      const BwdVF av = hn::Set(df, a[r * a_row + t * a_t]);
      for (int u = 0; u < V; ++u) acc[r][u] = hn::MulAdd(av, bv[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) hn::StoreU(acc[r][u], df, c + r * ldc + u * n);
  }
}

template <int R>
HWY_INLINE void BwdRowsTile(BwdDF df, const float* a, std::int64_t a_row, std::int64_t a_t,
                            const float* b, std::int64_t ldb, std::int64_t t_count, float* c,
                            std::int64_t ldc, std::int64_t cols, bool accumulate) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t x = 0;
  for (; x + kBwdVecs * n <= cols; x += kBwdVecs * n) {
    BwdTile<R, kBwdVecs>(df, a, a_row, a_t, b + x, ldb, t_count, c + x, ldc, accumulate);
  }
  for (; x < cols; x += n) {
    BwdTile<R, 1>(df, a, a_row, a_t, b + x, ldb, t_count, c + x, ldc, accumulate);
  }
}

// C[rows][cols] (+)= A[rows][t_count] B[t_count][cols]; cols a multiple of
// the vector length; B and C rows hold at least cols floats.
void BwdGemm(BwdDF df, std::int64_t rows, std::int64_t cols, std::int64_t t_count, const float* a,
             std::int64_t a_row, std::int64_t a_t, const float* b, std::int64_t ldb, float* c,
             std::int64_t ldc, bool accumulate) {
  std::int64_t r = 0;
  for (; r + kBwdRows <= rows; r += kBwdRows) {
    BwdRowsTile<kBwdRows>(df, a + r * a_row, a_row, a_t, b, ldb, t_count, c + r * ldc, ldc, cols,
                          accumulate);
  }
  for (; r < rows; ++r) {
    BwdRowsTile<1>(df, a + r * a_row, a_row, a_t, b, ldb, t_count, c + r * ldc, ldc, cols,
                   accumulate);
  }
}

// Per-thread buffers (64-byte aligned).
struct AttentionBwdWork {
  hwy::AlignedFreeUniquePtr<float[]> q, dout, k, kt, vt, dq, delta, lse, s, ds, rgrad, row;
  AttentionBwdWork(std::int64_t i, std::int64_t jp, std::int64_t d, std::int64_t dp,
                   std::int64_t bq, std::int64_t bkp, std::int64_t rlen)
      : q(Alloc(i * dp)),
        dout(Alloc(i * dp)),
        k(Alloc(jp * dp)),
        kt(Alloc(d * jp)),
        vt(Alloc(d * jp)),
        dq(Alloc(i * dp)),
        delta(Alloc(i)),
        lse(Alloc(i)),
        s(Alloc(bq * bkp)),
        ds(Alloc(bq * bkp)),
        rgrad(Alloc(rlen)),
        row(Alloc(dp)) {}
  static hwy::AlignedFreeUniquePtr<float[]> Alloc(std::int64_t count) {
    return hwy::AllocateAligned<float>(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)));
  }
};

struct AttentionBwdShared {
  std::int64_t bq, bk, bkp, nkb, jp, dp, rlen;
  float* dkf;     // [b, h, j, dp] float32 per query head
  float* dvf;     // [b, h, j, dp]
  float* dtab;    // [b, h, rlen] reversed diagonal sums, or null
  float* dslope;  // [b, h], or null
};

// One (batch, query head).
void BwdTask(const AttentionBackwardParams& p, const AttentionBwdShared& sh, std::int64_t bb,
             std::int64_t hh, AttentionBwdWork& w) {
  const BwdDF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t d = p.d, dp = sh.dp, i = p.i, j = p.j, jp = sh.jp;
  const std::int64_t kvh = hh / (p.h / p.hk);
  const std::int64_t bh = bb * p.h + hh;

  // Pack q, dO (rows), D = rowsum(dO * out), lse.
  for (std::int64_t r = 0; r < i; ++r) {
    float* qr = w.q.get() + r * dp;
    float* gr = w.dout.get() + r * dp;
    BwdPackRow(p.q, p.dtype, bb * p.q_stride[0] + hh * p.q_stride[1] + r * p.q_stride[2],
               p.q_stride[3], d, qr);
    BwdPackRow(p.dout, p.dtype,
               bb * p.dout_stride[0] + hh * p.dout_stride[1] + r * p.dout_stride[2],
               p.dout_stride[3], d, gr);
    BwdPackRow(p.out, p.dtype, bb * p.out_stride[0] + hh * p.out_stride[1] + r * p.out_stride[2],
               p.out_stride[3], d, w.row.get());
    float delta = 0.0f;
    for (std::int64_t x = 0; x < d; ++x) delta += gr[x] * w.row[static_cast<std::size_t>(x)];
    for (std::int64_t x = d; x < dp; ++x) qr[x] = gr[x] = 0.0f;
    w.delta[static_cast<std::size_t>(r)] = delta;
    w.lse[static_cast<std::size_t>(r)] =
        p.lse[bb * p.lse_stride[0] + hh * p.lse_stride[1] + r * p.lse_stride[2]];
  }
  // K rows, K^T and V^T (zero past j).
  const std::int64_t k_base = bb * p.k_stride[0] + kvh * p.k_stride[1];
  const std::int64_t v_base = bb * p.v_stride[0] + kvh * p.v_stride[1];
  std::fill(w.k.get(), w.k.get() + jp * dp, 0.0f);
  std::fill(w.kt.get(), w.kt.get() + d * jp, 0.0f);
  std::fill(w.vt.get(), w.vt.get() + d * jp, 0.0f);
  for (std::int64_t c = 0; c < j; ++c) {
    float* kr = w.k.get() + c * dp;
    BwdPackRow(p.k, p.dtype, k_base + c * p.k_stride[2], p.k_stride[3], d, kr);
    for (std::int64_t x = 0; x < d; ++x) w.kt[static_cast<std::size_t>(x * jp + c)] = kr[x];
    BwdPackRow(p.v, p.dtype, v_base + c * p.v_stride[2], p.v_stride[3], d, w.row.get());
    for (std::int64_t x = 0; x < d; ++x) {
      w.vt[static_cast<std::size_t>(x * jp + c)] = w.row[static_cast<std::size_t>(x)];
    }
  }
  std::fill(w.dq.get(), w.dq.get() + i * dp, 0.0f);
  float* rgrad = sh.dtab ? sh.dtab + bh * sh.rlen : nullptr;
  float slope_grad = 0.0f;
  float* dk = sh.dkf + bh * j * dp;
  float* dv = sh.dvf + bh * j * dp;
  const float neg_slope = p.bias == FusedBias::kAlibi ? -p.slopes[hh] : 0.0f;
  const BwdVF iota = hn::Iota(df, 0.0f);
  const BwdVF vscale = hn::Set(df, p.scale);

  for (std::int64_t kb = 0; kb < sh.nkb; ++kb) {
    const std::int64_t c0 = kb * sh.bk;
    const std::int64_t bc = std::min(sh.bk, j - c0);
    const std::int64_t bcp =
        hwy::RoundUpTo(static_cast<std::size_t>(bc), static_cast<std::size_t>(n));
    // First row that sees key c0.
    std::int64_t r_begin = 0;
    if (p.causal) r_begin = std::max<std::int64_t>(0, c0 - (j - i));
    if (r_begin >= i) break;  // later key blocks are seen by no row either
    for (std::int64_t r0 = (r_begin / sh.bq) * sh.bq; r0 < i; r0 += sh.bq) {
      const std::int64_t br = std::min(sh.bq, i - r0);
      float* s = w.s.get();
      float* ds = w.ds.get();
      const std::int64_t ld = sh.bkp;
      // S = Q K^T and dP = dO V^T over the block's keys.
      BwdGemm(df, br, bcp, d, w.q.get() + r0 * dp, dp, 1, w.kt.get() + c0, jp, s, ld, false);
      BwdGemm(df, br, bcp, d, w.dout.get() + r0 * dp, dp, 1, w.vt.get() + c0, jp, ds, ld, false);
      for (std::int64_t r = 0; r < br; ++r) {
        const std::int64_t qr = r0 + r;
        const std::int64_t qpos = j - i + qr;
        std::int64_t lim = bc;
        if (p.causal) lim = std::clamp<std::int64_t>(qpos - c0 + 1, 0, bc);
        const float lse = w.lse[static_cast<std::size_t>(qr)];
        if (lse == kBwdNegInf) lim = 0;  // the row saw no finite score: no gradient
        float* srow = s + r * ld;
        float* dsrow = ds + r * ld;
        if (p.bias == FusedBias::kDense && lim > 0) {
          const float* dr = p.dense + bb * p.dense_stride[0] + hh * p.dense_stride[1] +
                            qr * p.dense_stride[2] + c0 * p.dense_stride[3];
          const std::int64_t sc = p.dense_stride[3];
          for (std::int64_t c = 0; c < lim; ++c) srow[c] = p.scale * srow[c] + dr[c * sc];
        }
        const float* window = p.bias == FusedBias::kTable && lim > 0
                                  ? p.rtable + hh * p.rtable_stride + (c0 - qpos + j - 1)
                                  : nullptr;
        const BwdVF vlse = hn::Set(df, lse);
        const BwdVF vdelta = hn::Set(df, w.delta[static_cast<std::size_t>(qr)]);
        const BwdVF vneg_slope = hn::Set(df, neg_slope);
        BwdVF vslope_grad = hn::Zero(df);
        const std::int64_t span =
            hwy::RoundUpTo(static_cast<std::size_t>(lim), static_cast<std::size_t>(n));
        for (std::int64_t x = 0; x < span; x += n) {
          BwdVF sv = hn::LoadU(df, srow + x);
          BwdVF dist = hn::Zero(df);
          switch (p.bias) {
            case FusedBias::kNone:
              sv = hn::Mul(sv, vscale);
              break;
            case FusedBias::kAlibi:
              dist = hn::Abs(hn::Add(hn::Set(df, static_cast<float>(c0 + x - qpos)), iota));
              sv = hn::MulAdd(vneg_slope, dist, hn::Mul(sv, vscale));
              break;
            case FusedBias::kTable:
              sv = hn::MulAdd(sv, vscale, hn::LoadU(df, window + x));
              break;
            case FusedBias::kDense:
              break;  // scaled and biased above
          }
          const auto keep = hn::FirstN(df, static_cast<std::size_t>(lim - x));
          const BwdVF pv = hn::IfThenElseZero(keep, BwdExp(df, hn::Sub(sv, vlse)));
          const BwdVF dsv =
              hn::IfThenElseZero(keep, hn::Mul(pv, hn::Sub(hn::LoadU(df, dsrow + x), vdelta)));
          hn::StoreU(pv, df, srow + x);
          hn::StoreU(dsv, df, dsrow + x);
          if (p.bias == FusedBias::kAlibi) vslope_grad = hn::NegMulAdd(dsv, dist, vslope_grad);
        }
        for (std::int64_t x = span; x < bcp; ++x) srow[x] = dsrow[x] = 0.0f;
        if (p.bias == FusedBias::kAlibi) {
          slope_grad += hn::GetLane(hn::SumOfLanes(df, vslope_grad));
        }
        if (rgrad && lim > 0) {
          // Reversed diagonal accumulator: entry (c - q_r) + (j - 1).
          float* g = rgrad + (c0 - qpos + j - 1);
          for (std::int64_t x = 0; x < span; x += n) {
            hn::StoreU(hn::Add(hn::LoadU(df, g + x), hn::LoadU(df, dsrow + x)), df, g + x);
          }
        }
        if (p.ddense) {
          float* o = p.ddense + (bh * i + qr) * j + c0;
          std::copy(dsrow, dsrow + bc, o);
        }
      }
      // dV += P^T dO, dK += dS^T Q (times scale at the end), dQ += dS K.
      BwdGemm(df, bc, dp, br, s, 1, ld, w.dout.get() + r0 * dp, dp, dv + c0 * dp, dp, true);
      BwdGemm(df, bc, dp, br, ds, 1, ld, w.q.get() + r0 * dp, dp, dk + c0 * dp, dp, true);
      BwdGemm(df, br, dp, bc, ds, ld, 1, w.k.get() + c0 * dp, dp, w.dq.get() + r0 * dp, dp, true);
    }
  }
  for (std::int64_t r = 0; r < i; ++r) {
    BwdStoreRow(w.dq.get() + r * dp, d, p.scale, p.dtype, p.dq, (bh * i + r) * d);
  }
  for (std::int64_t x = 0; x < j * dp; ++x) dk[x] *= p.scale;
  if (sh.dslope) sh.dslope[bh] = slope_grad;
}

void BwdRun(const AttentionBackwardParams& p, std::int64_t block_q, std::int64_t block_k) {
  const BwdDF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t b = p.b, h = p.h, hk = p.hk, i = p.i, j = p.j, d = p.d;
  AttentionBwdShared sh;
  sh.dp = hwy::RoundUpTo(static_cast<std::size_t>(d), static_cast<std::size_t>(n));
  sh.bq = std::max<std::int64_t>(1, std::min(block_q, i));
  sh.bk = std::max<std::int64_t>(1, std::min(block_k, j));
  sh.bkp = hwy::RoundUpTo(static_cast<std::size_t>(sh.bk), static_cast<std::size_t>(n));
  sh.nkb = (j + sh.bk - 1) / sh.bk;
  sh.jp = sh.nkb * sh.bk + n;
  sh.rlen = 2 * j - 1 + sh.bkp + n;  // window reads run at most one padded block past
  const std::int64_t bh = b * h;
  std::vector<float> dkf(static_cast<std::size_t>(bh * j * sh.dp), 0.0f);
  std::vector<float> dvf(static_cast<std::size_t>(bh * j * sh.dp), 0.0f);
  std::vector<float> dtab;
  std::vector<float> dslope;
  if (p.dtable) dtab.assign(static_cast<std::size_t>(bh * sh.rlen), 0.0f);
  if (p.dslopes) dslope.assign(static_cast<std::size_t>(bh), 0.0f);
  sh.dkf = dkf.data();
  sh.dvf = dvf.data();
  sh.dtab = p.dtable ? dtab.data() : nullptr;
  sh.dslope = p.dslopes ? dslope.data() : nullptr;
  if (p.ddense && j > 0) {
    std::fill(p.ddense, p.ddense + bh * i * j, 0.0f);
  }
  const int threads = omp_get_max_threads();
  const double flops = static_cast<double>(bh) * static_cast<double>(i) *
                       static_cast<double>(std::max<std::int64_t>(j, 1)) * static_cast<double>(d);
  const bool parallel = bh > 1 && threads > 1 && flops >= 65536.0;
  if (i > 0 && bh > 0) {
#pragma omp parallel if (parallel)
    {
      AttentionBwdWork w(i, sh.jp, d, sh.dp, sh.bq, sh.bkp, sh.rlen);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < bh; ++t) BwdTask(p, sh, t / h, t % h, w);
    }
  }
  // dK, dV: sum the query heads of each kv head (fixed order), round once.
  const std::int64_t group = hk > 0 ? h / hk : 1;
  const std::int64_t kv_rows = b * hk * j;
#pragma omp parallel if (parallel)
  {
    std::vector<float> acc_k(static_cast<std::size_t>(d)), acc_v(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < kv_rows; ++row) {
      const std::int64_t c = row % j;
      const std::int64_t kvh = (row / j) % hk;
      const std::int64_t bb = row / (j * hk);
      std::fill(acc_k.begin(), acc_k.end(), 0.0f);
      std::fill(acc_v.begin(), acc_v.end(), 0.0f);
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t at = ((bb * h + kvh * group + g) * j + c) * sh.dp;
        for (std::int64_t x = 0; x < d; ++x) {
          acc_k[static_cast<std::size_t>(x)] += dkf[static_cast<std::size_t>(at + x)];
          acc_v[static_cast<std::size_t>(x)] += dvf[static_cast<std::size_t>(at + x)];
        }
      }
      BwdStoreRow(acc_k.data(), d, 1.0f, p.dtype, p.dk, row * d);
      BwdStoreRow(acc_v.data(), d, 1.0f, p.dtype, p.dv, row * d);
    }
  }
  if (p.dtable) {
    const std::int64_t len = std::max<std::int64_t>(0, 2 * j - 1);
    for (std::int64_t hh = 0; hh < h; ++hh) {
      for (std::int64_t e = 0; e < len; ++e) {
        float sum = 0.0f;
        for (std::int64_t bb = 0; bb < b; ++bb) {
          sum += dtab[static_cast<std::size_t>((bb * h + hh) * sh.rlen + (len - 1 - e))];
        }
        p.dtable[hh * len + e] = sum;
      }
    }
  }
  if (p.dslopes) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      float sum = 0.0f;
      for (std::int64_t bb = 0; bb < b; ++bb) sum += dslope[static_cast<std::size_t>(bb * h + hh)];
      p.dslopes[hh] = sum;
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posbias::detail {

HWY_EXPORT(BwdRun);

void attention_backward_blocked(const AttentionBackwardParams& p, std::int64_t block_q,
                                std::int64_t block_k) {
  HWY_DYNAMIC_DISPATCH(BwdRun)(p, block_q, block_k);
}

void attention_backward_kernel(const AttentionBackwardParams& p) {
  attention_backward_blocked(p, 64, 64);
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
