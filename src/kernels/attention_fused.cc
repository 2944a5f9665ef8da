// The fused attention kernel, compiled once per instruction set by Highway
// and chosen at run time (HWY_DYNAMIC_DISPATCH). See attention_fused.h.
//
// Shape of the computation (FlashAttention-2): a task owns one (batch, head,
// query block) and walks the key blocks it can see, keeping per row a
// running max m, a running sum l and a float32 accumulator O rescaled by
// exp(m_old - m_new) whenever the max grows. Per key block:
//
//   1. pack K^T (d x block_k) and V (block_k x d) into float32 buffers
//      (converting 16-bit inputs exactly and gathering strided rows once);
//   2. S = (scale q) K^T with a register-tiled micro-kernel (R rows x V
//      vectors of keys, broadcast-FMA over d); ALiBi is added as the tile
//      is stored (-slope |distance|, one FMA per vector, no extra pass);
//   3. one pass per row adds any other bias (a forward window of the
//      reversed distance table, or the dense tensor; ALiBi on the decode
//      path), masks the keys the row cannot see, takes the max; a second
//      pass forms p = exp(s - m) and its sum;
//   4. O = alpha O + P V with a second micro-kernel (R rows x V vectors of
//      d, broadcast-FMA over keys).
//
// Decode (at most 4 query rows per head) takes a direct path instead: S by
// dot products over the key rows in place (nothing transposed), and with
// grouped-query attention one task holds the rows of several query heads
// of one kv head, so each key and value row is read once for all of them.
//
// Each row multiplies only the keys it can see (per-row key limits in step
// 4), so a NaN in a masked value never reaches it. Causal key blocks past
// a query block's last visible key are never visited.
//
// Our own micro-kernels rather than sgemm on blocks: the blocks are small
// (256 x 64 x d), the product with V needs per-row key limits for the mask,
// and packing already happens for the dtype conversion; this keeps the
// library free of a BLAS dependency.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_fused.cc"
// foreach_target.h before any other Highway header (math-inl.h includes
// highway.h): otherwise clang compiles the static target twice. The
// clang-format guard keeps include sorting from moving it.
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// clang-format on
#include "kernels/attention_fused.h"

#include <hwy/aligned_allocator.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tile: rows x vectors. AVX-512 has 32 vector registers, AVX2 and
// SSE 16.
constexpr int kRows = 4;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kVecs = 4;
#else
constexpr int kVecs = 2;
#endif

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
HWY_INLINE float ToF(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_float(x);
  }
}

// dst[0..n) = mul * src[0, stride, 2 stride, ...] as float32.
template <typename T>
void PackRowT(const T* src, std::int64_t stride, std::int64_t n, float mul, float* dst) {
  if (stride == 1) {
    for (std::int64_t x = 0; x < n; ++x) dst[x] = mul * ToF(src[x]);
  } else {
    for (std::int64_t x = 0; x < n; ++x) dst[x] = mul * ToF(src[x * stride]);
  }
}

void PackRow(const void* base, DType dt, std::int64_t offset, std::int64_t stride, std::int64_t n,
             float mul, float* dst) {
  switch (dt) {
    case DType::kFloat32:
      PackRowT(static_cast<const float*>(base) + offset, stride, n, mul, dst);
      break;
    case DType::kBFloat16:
      PackRowT(static_cast<const bfloat16*>(base) + offset, stride, n, mul, dst);
      break;
    case DType::kFloat16:
      PackRowT(static_cast<const float16*>(base) + offset, stride, n, mul, dst);
      break;
  }
}

void StoreRow(const float* src, std::int64_t n, float mul, DType dt, void* base,
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

// exp(x) for x = score - row max <= 0, flushed to 0 below -40 (and for
// -inf); NaN stays NaN. Every row has one term exp(0) = 1, so terms below
// e^-40 = 4e-18 change neither the sum nor the output in float32; flushing
// them keeps subnormal numbers (which x86 handles in microcode at ~100
// cycles each) out of Exp and out of the P V products, where far-away ALiBi
// keys (x around -1000) would otherwise produce them all the time.
// hn::Exp returns 0 for NaN (its range test x >= -104 is false), which
// silently dropped a NaN score (a NaN key, bias entry or +inf - +inf)
// whenever the row max was finite: NaN lanes are passed through explicitly.
HWY_INLINE VF SafeExp(DF df, VF x) {
  const VF lo = hn::Set(df, -40.0f);
  const auto under = hn::Lt(x, lo);
  const VF e = hn::IfThenZeroElse(under, hn::Exp(df, hn::IfThenElse(under, lo, x)));
  return hn::IfThenElse(hn::IsNaN(x), x, e);
}

// ALiBi folded into the block product's store: row r of the tile adds
// neg_slope * |x + lane - row_off[r]| to column x + lane, where row_off[r] =
// max(q_r, 0) - c0 (see BiasMaskMax). The distances are exact integers in
// float32 and the add is the same single-rounding FMA as BiasMaskMax's, so
// the scores are bit for bit those of the separate pass, without its load
// and store of every score.
struct AlibiFold {
  const float* row_off = nullptr;  // per row of the tile
  float neg_slope = 0.0f;
};

// S[r][x..x + V N) for rows [0, R) of q (row stride d) against kt (d rows of
// ld floats); with kAlibi, plus the ALiBi bias of `fold`.
template <int R, int V, bool kAlibi>
HWY_INLINE void QKTile(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                       const float* HWY_RESTRICT kt, std::int64_t ld, std::int64_t x,
                       float* HWY_RESTRICT s, std::int64_t lds, const AlibiFold& fold) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) acc[r][u] = hn::Zero(df);
  }
  for (std::int64_t kk = 0; kk < d; ++kk) {
    const float* krow = kt + kk * ld + x;
    VF kv[V];
    for (int u = 0; u < V; ++u) kv[u] = hn::Load(df, krow + u * n);
    for (int r = 0; r < R; ++r) {
      const VF qv = hn::Set(df, q[r * d + kk]);
      for (int u = 0; u < V; ++u) acc[r][u] = hn::MulAdd(qv, kv[u], acc[r][u]);
    }
  }
  if constexpr (kAlibi) {
    const VF neg_slope = hn::Set(df, fold.neg_slope);
    VF col[V];
    for (int u = 0; u < V; ++u) {
      col[u] = hn::Add(hn::Iota(df, 0.0f), hn::Set(df, static_cast<float>(x + u * n)));
    }
    for (int r = 0; r < R; ++r) {
      const VF off = hn::Set(df, fold.row_off[r]);
      for (int u = 0; u < V; ++u) {
        acc[r][u] = hn::MulAdd(neg_slope, hn::Abs(hn::Sub(col[u], off)), acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) hn::Store(acc[r][u], df, s + r * lds + x + u * n);
  }
}

template <int R, bool kAlibi>
HWY_INLINE void QKRows(DF df, const float* q, std::int64_t d, const float* kt, std::int64_t ld,
                       std::int64_t cols, float* s, std::int64_t lds, const AlibiFold& fold) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t x = 0;
  for (; x + kVecs * n <= cols; x += kVecs * n) {
    QKTile<R, kVecs, kAlibi>(df, q, d, kt, ld, x, s, lds, fold);
  }
  for (; x < cols; x += n) QKTile<R, 1, kAlibi>(df, q, d, kt, ld, x, s, lds, fold);
}

// O rows [0, R) (row stride ldo), columns [x, x + V N): O = alpha O + sum over
// keys [0, keys) of P[r][c] V[c]. V rows (stride ldv) may be unaligned: the
// decode path reads float32 values in place.
template <int R, int V>
HWY_INLINE void PVTile(DF df, const float* HWY_RESTRICT p, std::int64_t ldp,
                       const float* HWY_RESTRICT vp, std::int64_t ldv, std::int64_t keys,
                       const float* alpha, float* HWY_RESTRICT o, std::int64_t ldo,
                       std::int64_t x) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    const VF a = hn::Set(df, alpha[r]);
    for (int u = 0; u < V; ++u) acc[r][u] = hn::Mul(a, hn::Load(df, o + r * ldo + x + u * n));
  }
  for (std::int64_t c = 0; c < keys; ++c) {
    VF vv[V];
    for (int u = 0; u < V; ++u) vv[u] = hn::LoadU(df, vp + c * ldv + x + u * n);
    for (int r = 0; r < R; ++r) {
      const VF pv = hn::Set(df, p[r * ldp + c]);
      for (int u = 0; u < V; ++u) acc[r][u] = hn::MulAdd(pv, vv[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) hn::Store(acc[r][u], df, o + r * ldo + x + u * n);
  }
}

// PVTile over all dp columns of O (row stride dp), VW vectors at a time; V
// rows have stride ldv and at least dp readable floats.
template <int R, int VW = kVecs>
HWY_INLINE void PVRows(DF df, const float* p, std::int64_t ldp, const float* vp, std::int64_t ldv,
                       std::int64_t dp, std::int64_t keys, const float* alpha, float* o) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t x = 0;
  for (; x + VW * n <= dp; x += VW * n) {
    PVTile<R, VW>(df, p, ldp, vp, ldv, keys, alpha, o, dp, x);
  }
  for (; x < dp; x += n) PVTile<R, 1>(df, p, ldp, vp, ldv, keys, alpha, o, dp, x);
}

// Few query rows (decode): S[r][c] = q_r . k_c as dot products over
// contiguous key rows, so nothing is transposed. q rows have stride d.
template <int R>
HWY_INLINE void QKDotRows(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                          const float* HWY_RESTRICT krow, float* s, std::int64_t lds) {
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  std::int64_t x = 0;
  for (; x + n <= d; x += n) {
    const VF kv = hn::LoadU(df, krow + x);
    for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * d + x), kv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    for (std::int64_t y = x; y < d; ++y) sum += q[r * d + y] * krow[y];
    s[r * lds] = sum;
  }
}

// Rows at or below this count use the direct (dot product) path.
constexpr std::int64_t kDirectRows = 4;

// Types here are per instruction set but not file-local (HWY_NAMESPACE is
// shared by every kernel file): names are unique across src/kernels so that
// their inline members never collide (an ODR violation ASan caught in Debug).
struct AttentionBlocking {
  std::int64_t bq, bk, bkp, splits, nqb, nkb;
  // Query heads per task: 1, or on the decode path (i <= kDirectRows) the
  // query heads of one kv head (grouped-query), so that each key and value
  // row is read once for all of them rather than once per query head.
  std::int64_t hg;
  bool pack_heads;  // share one K^T / V packing per (batch, kv head)
};

// Most rows (query heads x query rows) of one decode task.
constexpr std::int64_t kMaxGroupRows = 32;

// Per-thread bytes allowed for a head's packed K^T and V.
constexpr double kMaxPackBytes = 32.0 * (1 << 20);

// Per-thread buffers, 64-byte aligned.
// Packed K^T and V of one (batch, kv head), block by block as they are
// first needed: the query blocks of a head then share one packing instead
// of transposing every key block again for each of them (the transposition
// costs about as much as a 64-row block product).
struct AttentionHeadPack {
  std::int64_t head = -1;                    // b * hk + kv head, -1: none
  hwy::AlignedFreeUniquePtr<float[]> kt, v;  // [nkb][d][bkp], [nkb * bk][dp]
  std::vector<char> ready;                   // per key block
};

struct AttentionWork {
  hwy::AlignedFreeUniquePtr<float[]> row, q, kt, v, s, o, m, l, alpha, alibi_off;
  std::vector<std::int64_t> lim;
  AttentionHeadPack pack;
  AttentionWork(std::int64_t bq, std::int64_t bkp, std::int64_t d, std::int64_t dp)
      : row(hwy::AllocateAligned<float>(static_cast<std::size_t>(d))),
        q(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq * d))),
        kt(hwy::AllocateAligned<float>(static_cast<std::size_t>(d * bkp))),
        v(hwy::AllocateAligned<float>(static_cast<std::size_t>(bkp * dp))),
        s(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq * bkp))),
        o(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq * dp))),
        m(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq))),
        l(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq))),
        alpha(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq))),
        alibi_off(hwy::AllocateAligned<float>(static_cast<std::size_t>(bq))),
        lim(static_cast<std::size_t>(bq)) {}
};

// Adds the bias to row r (absolute query row qr, position qpos) of S over
// columns [0, cols) of the block at key c0 (unless `alibi_added`: the block
// product already added ALiBi), masks columns >= lim with -inf, and returns
// the row max.
HWY_INLINE float BiasMaskMax(DF df, const FusedAttentionParams& p, std::int64_t bb, std::int64_t hh,
                             std::int64_t qr, std::int64_t qpos, std::int64_t c0, std::int64_t cols,
                             std::int64_t lim, bool alibi_added, float* HWY_RESTRICT s) {
  const FusedBias kind = alibi_added ? FusedBias::kNone : p.bias;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  // A row that sees no key of this block reads nothing (with i > j a
  // distance-table window would start outside the table).
  if (lim == 0) return kNegInf;
  if (kind == FusedBias::kDense) {
    const float* dr = p.dense + bb * p.dense_stride[0] + hh * p.dense_stride[1] +
                      qr * p.dense_stride[2] + c0 * p.dense_stride[3];
    const std::int64_t sc = p.dense_stride[3];
    if (sc == 1) {
      for (std::int64_t c = 0; c < lim; ++c) s[c] += dr[c];
    } else {
      for (std::int64_t c = 0; c < lim; ++c) s[c] += dr[c * sc];
    }
  }
  VF vmax = hn::Set(df, kNegInf);
  const VF neg_inf = hn::Set(df, kNegInf);
  const VF iota = hn::Iota(df, 0.0f);
  // c - qpos at the first column of the block; |value| < 2^24 keeps it exact.
  const std::int64_t rel0 = c0 - qpos;
  // ALiBi rows before the first key (q_r < 0, non-causal i > j) use
  // -slope * c instead of -slope * (c - q_r): the same softmax (a per-row
  // constant), but scores near 0 rather than around -slope * |q_r|, where
  // float32 would round them to the ulp of hundreds.
  const std::int64_t alibi_rel0 = c0 - std::max<std::int64_t>(qpos, 0);
  const VF neg_slope = hn::Set(df, kind == FusedBias::kAlibi ? -p.slopes[hh] : 0.0f);
  const float* window =
      kind == FusedBias::kTable ? p.rtable + hh * p.rtable_stride + (rel0 + p.j - 1) : nullptr;
  // Only the vectors holding visible keys: the rest of the row is never read.
  const std::int64_t span = std::min<std::int64_t>(
      cols, static_cast<std::int64_t>(
                hwy::RoundUpTo(static_cast<std::size_t>(lim), static_cast<std::size_t>(n))));
  // One loop per bias kind (no branch inside); the masked tail is at most
  // one vector and handled after.
  const std::int64_t full = std::min(span, lim - lim % n);
  if (kind == FusedBias::kAlibi) {
    VF dist = hn::Add(hn::Set(df, static_cast<float>(alibi_rel0)), iota);  // exact
    const VF step = hn::Set(df, static_cast<float>(n));
    for (std::int64_t x = 0; x < full; x += n) {
      const VF v = hn::MulAdd(neg_slope, hn::Abs(dist), hn::Load(df, s + x));
      hn::Store(v, df, s + x);
      vmax = hn::Max(vmax, v);
      dist = hn::Add(dist, step);
    }
  } else if (kind == FusedBias::kTable) {
    for (std::int64_t x = 0; x < full; x += n) {
      const VF v = hn::Add(hn::Load(df, s + x), hn::LoadU(df, window + x));
      hn::Store(v, df, s + x);
      vmax = hn::Max(vmax, v);
    }
  } else {
    for (std::int64_t x = 0; x < full; x += n) vmax = hn::Max(vmax, hn::Load(df, s + x));
  }
  for (std::int64_t x = full; x < span; x += n) {
    VF v = hn::Load(df, s + x);
    if (kind == FusedBias::kAlibi) {
      const VF dist = hn::Add(hn::Set(df, static_cast<float>(alibi_rel0 + x)), iota);
      v = hn::MulAdd(neg_slope, hn::Abs(dist), v);
    } else if (kind == FusedBias::kTable) {
      v = hn::Add(v, hn::LoadU(df, window + x));
    }
    const std::int64_t keep = std::max<std::int64_t>(0, lim - x);
    v = hn::IfThenElse(hn::FirstN(df, static_cast<std::size_t>(keep)), v, neg_inf);
    hn::Store(v, df, s + x);
    vmax = hn::Max(vmax, v);
  }
  return hn::GetLane(hn::MaxOfLanes(df, vmax));
}

// O = alpha O + P V for `rows` rows of P (row stride ldp), each over its own
// visible keys w.lim[r] only: groups of RB rows share the keys they all see,
// and each row adds its own remaining keys after. Tiles of RB rows x VW
// vectors of d.
template <int RB, int VW>
HWY_INLINE void PVBlock(DF df, AttentionWork& w, std::int64_t rows, const float* s,
                        std::int64_t ldp, const float* vp, std::int64_t ldv, std::int64_t dp) {
  float* o = w.o.get();
  std::int64_t r = 0;
  for (; r + RB <= rows; r += RB) {
    std::int64_t common = w.lim[static_cast<std::size_t>(r)];
    for (int u = 1; u < RB; ++u) {
      common = std::min(common, w.lim[static_cast<std::size_t>(r + u)]);
    }
    PVRows<RB, VW>(df, s + r * ldp, ldp, vp, ldv, dp, common, w.alpha.get() + r, o + r * dp);
    for (int u = 0; u < RB; ++u) {
      const std::int64_t rr = r + u;
      const std::int64_t extra = w.lim[static_cast<std::size_t>(rr)] - common;
      if (extra > 0) {
        const float one = 1.0f;
        PVRows<1, VW>(df, s + rr * ldp + common, ldp, vp + common * ldv, ldv, dp, extra, &one,
                      o + rr * dp);
      }
    }
  }
  for (; r < rows; ++r) {
    PVRows<1, VW>(df, s + r * ldp, ldp, vp, ldv, dp, w.lim[static_cast<std::size_t>(r)],
                  w.alpha.get() + r, o + r * dp);
  }
}

// One (batch, query heads [hh, hh + nh), query block) over key blocks
// [kb0, kb1). Row x of the task is query row r0 + x % br of head
// hh + x / br; nh > 1 only on the direct (decode) path, where the heads
// share one kv head. Leaves m, l, O (unnormalised) per row in w.
void RunTask(const FusedAttentionParams& p, const AttentionBlocking& bl, std::int64_t bb,
             std::int64_t hh, std::int64_t nh, std::int64_t qb, std::int64_t kb0, std::int64_t kb1,
             AttentionWork& w) {
  const DF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t d = p.d;
  const std::int64_t dp = hwy::RoundUpTo(static_cast<std::size_t>(d), static_cast<std::size_t>(n));
  const std::int64_t r0 = qb * bl.bq;
  const std::int64_t br = std::min(bl.bq, p.i - r0);
  const std::int64_t rows = nh * br;
  const std::int64_t kvh = hh / (p.h / p.hk);

  for (std::int64_t x = 0; x < rows; ++x) {
    PackRow(p.q, p.dtype,
            bb * p.q_stride[0] + (hh + x / br) * p.q_stride[1] + (r0 + x % br) * p.q_stride[2],
            p.q_stride[3], d, p.scale, w.q.get() + x * d);
    w.m[x] = kNegInf;
    w.l[x] = 0.0f;
  }
  std::fill(w.o.get(), w.o.get() + rows * dp, 0.0f);
  const std::int64_t k_base = bb * p.k_stride[0] + kvh * p.k_stride[1];
  const std::int64_t v_base = bb * p.v_stride[0] + kvh * p.v_stride[1];
  const bool direct = br <= kDirectRows;
  const bool use_pack = !direct && bl.pack_heads;
  if (use_pack) {
    const std::int64_t head = bb * p.hk + kvh;
    if (!w.pack.kt) {
      w.pack.kt = hwy::AllocateAligned<float>(static_cast<std::size_t>(bl.nkb * d * bl.bkp));
      w.pack.v = hwy::AllocateAligned<float>(static_cast<std::size_t>(bl.nkb * bl.bk * dp));
      w.pack.ready.assign(static_cast<std::size_t>(bl.nkb), 0);
    }
    if (w.pack.head != head) {
      w.pack.head = head;
      std::fill(w.pack.ready.begin(), w.pack.ready.end(), 0);
    }
  }
  // ALiBi is added by the block product (not the decode path's dots).
  const bool alibi_fold = !direct && p.bias == FusedBias::kAlibi;
  const float neg_slope = p.bias == FusedBias::kAlibi ? -p.slopes[hh] : 0.0f;
  const bool k_direct = p.dtype == DType::kFloat32 && p.k_stride[3] == 1;
  // In place only when whole vectors of a row stay inside it (PVTile reads dp
  // floats per value row).
  const bool v_direct = p.dtype == DType::kFloat32 && p.v_stride[3] == 1 && d == dp;

  for (std::int64_t kb = kb0; kb < kb1; ++kb) {
    const std::int64_t c0 = kb * bl.bk;
    const std::int64_t bc = std::min(bl.bk, p.j - c0);
    // Visible keys of each row in this block.
    std::int64_t max_lim = 0;
    for (std::int64_t x = 0; x < rows; ++x) {
      std::int64_t lim = bc;
      if (p.causal) lim = std::clamp<std::int64_t>(p.j - p.i + r0 + x % br - c0 + 1, 0, bc);
      w.lim[static_cast<std::size_t>(x)] = lim;
      max_lim = std::max(max_lim, lim);
    }
    if (max_lim == 0) continue;
    const std::int64_t cols =
        hwy::RoundUpTo(static_cast<std::size_t>(max_lim), static_cast<std::size_t>(n));

    float* s = w.s.get();
    float* kt = w.kt.get();
    float* vp = w.v.get();
    float* tmp = w.row.get();
    std::int64_t r = 0;
    if (direct) {
      // S by dot products over key rows, read in place when they are
      // contiguous float32 (decode reads each key once, at memory speed).
      for (std::int64_t c = 0; c < max_lim; ++c) {
        const float* krow = tmp;
        if (k_direct) {
          krow = static_cast<const float*>(p.k) + k_base + (c0 + c) * p.k_stride[2];
        } else {
          PackRow(p.k, p.dtype, k_base + (c0 + c) * p.k_stride[2], p.k_stride[3], d, 1.0f, tmp);
        }
        // Every row of the task against this key while it is in L1.
        std::int64_t x = 0;
        for (; x + 4 <= rows; x += 4) {
          QKDotRows<4>(df, w.q.get() + x * d, d, krow, s + x * cols + c, cols);
        }
        switch (rows - x) {
          case 1:
            QKDotRows<1>(df, w.q.get() + x * d, d, krow, s + x * cols + c, cols);
            break;
          case 2:
            QKDotRows<2>(df, w.q.get() + x * d, d, krow, s + x * cols + c, cols);
            break;
          case 3:
            QKDotRows<3>(df, w.q.get() + x * d, d, krow, s + x * cols + c, cols);
            break;
          default:
            break;
        }
      }
    } else {
      // K^T [d][ld] (zero columns past the packed keys) and V [keys][dp]:
      // from the head's shared packing, or packed here for this block.
      std::int64_t ld = cols;
      std::int64_t keys = max_lim;
      if (use_pack) {
        ld = bl.bkp;
        keys = bc;
        kt = w.pack.kt.get() + kb * d * ld;
        vp = w.pack.v.get() + c0 * dp;
      }
      if (!use_pack || !w.pack.ready[static_cast<std::size_t>(kb)]) {
        for (std::int64_t c = 0; c < keys; ++c) {
          PackRow(p.k, p.dtype, k_base + (c0 + c) * p.k_stride[2], p.k_stride[3], d, 1.0f, tmp);
          for (std::int64_t x = 0; x < d; ++x) kt[x * ld + c] = tmp[x];
          float* vrow = vp + c * dp;
          PackRow(p.v, p.dtype, v_base + (c0 + c) * p.v_stride[2], p.v_stride[3], d, 1.0f, vrow);
          for (std::int64_t x = d; x < dp; ++x) vrow[x] = 0.0f;
        }
        for (std::int64_t x = 0; x < d; ++x) {
          for (std::int64_t c = keys; c < ld; ++c) kt[x * ld + c] = 0.0f;
        }
        if (use_pack) w.pack.ready[static_cast<std::size_t>(kb)] = 1;
      }
      // S = (scale q) K^T, each group of rows over the keys it can see
      // (on the causal diagonal that halves the product).
      const auto visible_cols = [&](std::int64_t r_begin, std::int64_t r_end) {
        std::int64_t most = 0;
        for (std::int64_t rr = r_begin; rr < r_end; ++rr) {
          most = std::max(most, w.lim[static_cast<std::size_t>(rr)]);
        }
        return static_cast<std::int64_t>(
            hwy::RoundUpTo(static_cast<std::size_t>(most), static_cast<std::size_t>(n)));
      };
      if (alibi_fold) {
        for (std::int64_t rr = 0; rr < br; ++rr) {
          w.alibi_off[rr] = static_cast<float>(std::max<std::int64_t>(p.j - p.i + r0 + rr, 0) -
                                               c0);  // exact: |.| < 2^24
        }
      }
      const auto qk_rows = [&](auto rows_tag, std::int64_t rr) {
        constexpr int R = decltype(rows_tag)::value;
        const AlibiFold fold{w.alibi_off.get() + rr, neg_slope};
        float* srow = s + rr * cols;
        const std::int64_t vis = visible_cols(rr, rr + R);
        if (alibi_fold) {
          QKRows<R, true>(df, w.q.get() + rr * d, d, kt, ld, vis, srow, cols, fold);
        } else {
          QKRows<R, false>(df, w.q.get() + rr * d, d, kt, ld, vis, srow, cols, fold);
        }
      };
      for (; r + kRows <= br; r += kRows) qk_rows(std::integral_constant<int, kRows>(), r);
      for (; r < br; ++r) qk_rows(std::integral_constant<int, 1>(), r);
    }

    // Bias, mask, online softmax.
    for (r = 0; r < rows; ++r) {
      float* srow = s + r * cols;
      std::int64_t& lim = w.lim[static_cast<std::size_t>(r)];
      const std::int64_t qr = r0 + r % br;
      const float row_max =
          BiasMaskMax(df, p, bb, hh + r / br, qr, p.j - p.i + qr, c0, cols, lim, alibi_fold, srow);
      const float m_old = w.m[r];
      const float m_new = std::max(m_old, row_max);
      if (m_new == kNegInf) {
        // Nothing with a finite score yet: no contribution, nothing to
        // rescale. The vector max may have dropped NaN scores (x86 max
        // returns one operand), so look for them: they poison the row's sum.
        for (std::int64_t c = 0; c < lim; ++c) {
          if (std::isnan(srow[c])) w.l[r] = std::numeric_limits<float>::quiet_NaN();
        }
        lim = 0;
        w.alpha[r] = 1.0f;
        continue;
      }
      const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
      const VF vm = hn::Set(df, m_new);
      VF sum = hn::Zero(df);
      const std::int64_t span =
          hwy::RoundUpTo(static_cast<std::size_t>(lim), static_cast<std::size_t>(n));
      for (std::int64_t x = 0; x < span; x += n) {
        const VF e = SafeExp(df, hn::Sub(hn::Load(df, srow + x), vm));
        hn::Store(e, df, srow + x);
        sum = hn::Add(sum, e);
      }
      w.l[r] = w.l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
      w.m[r] = m_new;
      w.alpha[r] = alpha;
    }

    // O = alpha O + P V, each row over its own visible keys only. The
    // direct path reads float32 value rows in place (else converts this
    // block's rows once, for all rows of the task).
    if (direct) {
      // Tiles two rows by twice the width of the blocked path: each value
      // row is read whole, once per two rows (d <= 128 on AVX-512), which
      // keeps the decode path's reads of V sequential.
      if (v_direct) {
        PVBlock<2, 2 * kVecs>(df, w, rows, s, cols,
                              static_cast<const float*>(p.v) + v_base + c0 * p.v_stride[2],
                              p.v_stride[2], dp);
      } else {
        for (std::int64_t c = 0; c < max_lim; ++c) {
          float* vrow = vp + c * dp;
          PackRow(p.v, p.dtype, v_base + (c0 + c) * p.v_stride[2], p.v_stride[3], d, 1.0f, vrow);
          for (std::int64_t x = d; x < dp; ++x) vrow[x] = 0.0f;
        }
        PVBlock<2, 2 * kVecs>(df, w, rows, s, cols, vp, dp, dp);
      }
      continue;
    }
    PVBlock<kRows, kVecs>(df, w, rows, s, cols, vp, dp, dp);
  }
}

// log-sum-exp of a row from its softmax state (max m, sum l of exp(s - m)).
// ALiBi rows before the first key (q_r < 0) were scored with -slope * c
// instead of -slope * (c - q_r): add back the constant slope * q_r.
float AttentionRowLse(const FusedAttentionParams& p, std::int64_t hh, std::int64_t r, float m,
                      float l) {
  if (std::isnan(l)) return l;
  if (l == 0.0f || m == kNegInf) return kNegInf;
  float lse = m + std::log(l);
  const std::int64_t qpos = p.j - p.i + r;
  if (p.bias == FusedBias::kAlibi && qpos < 0) lse += p.slopes[hh] * static_cast<float>(qpos);
  return lse;
}

void Run(const FusedAttentionParams& p, std::int64_t block_q, std::int64_t block_k,
         std::int64_t splits) {
  const DF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  if (p.b == 0 || p.h == 0 || p.i == 0) return;
  const std::int64_t d = p.d;
  const std::int64_t dp = hwy::RoundUpTo(static_cast<std::size_t>(d), static_cast<std::size_t>(n));
  AttentionBlocking bl;
  bl.bq = std::min(block_q, p.i);
  bl.bk = std::max<std::int64_t>(1, std::min(block_k, p.j));
  bl.nqb = (p.i + bl.bq - 1) / bl.bq;
  bl.nkb = (p.j + bl.bk - 1) / bl.bk;
  // Grouped-query decode: one task reads a kv head's keys and values once
  // for as many of its query heads as fit in kMaxGroupRows rows (a divisor
  // of the group, so a task never straddles two kv heads).
  const std::int64_t group = p.h / p.hk;
  bl.hg = 1;
  if (bl.bq <= kDirectRows) {
    for (std::int64_t g = group; g > 1; --g) {
      if (group % g == 0 && g * bl.bq <= kMaxGroupRows) {
        bl.hg = g;
        break;
      }
    }
  }
  const std::int64_t rows_per_task = bl.hg * bl.bq;
  const std::int64_t head_slots = p.b * (p.h / bl.hg);  // (batch, group of hg query heads)
  const std::int64_t base_tasks = head_slots * bl.nqb;
  const int threads = omp_get_max_threads();
  if (splits <= 0) {
    splits = 1;
    if (base_tasks < threads && bl.nkb >= 2) {
      splits = std::min<std::int64_t>(bl.nkb, (2 * threads + base_tasks - 1) / base_tasks);
    }
  }
  bl.splits =
      std::min<std::int64_t>(std::max<std::int64_t>(splits, 1), std::max<std::int64_t>(bl.nkb, 1));
  const std::int64_t bkp =
      hwy::RoundUpTo(static_cast<std::size_t>(bl.bk), static_cast<std::size_t>(n));
  bl.bkp = bkp;
  bl.pack_heads =
      bl.nqb * bl.splits > 1 &&
      4.0 * static_cast<double>(bl.nkb) * static_cast<double>(bkp) * static_cast<double>(d + dp) <=
          kMaxPackBytes;
  const std::int64_t tasks = base_tasks * bl.splits;
  // Split partial states: [tasks][rows_per_task] m and l, and O with dp
  // floats per row.
  std::vector<float> part_m, part_l, part_o;
  if (bl.splits > 1) {
    part_m.assign(static_cast<std::size_t>(tasks * rows_per_task), kNegInf);
    part_l.assign(static_cast<std::size_t>(tasks * rows_per_task), 0.0f);
    part_o.assign(static_cast<std::size_t>(tasks * rows_per_task * dp), 0.0f);
  }
  const double flops = static_cast<double>(p.b * p.h) * static_cast<double>(p.i) *
                       static_cast<double>(std::max<std::int64_t>(p.j, 1)) * static_cast<double>(d);
  const bool parallel = tasks > 1 && flops >= 65536.0 && threads > 1;
  // Where row x of the task of head slot `slot` and query block starting at
  // r0 (br rows per head) goes in out / lse: [b, h, i] row-major.
  const auto out_row = [&](std::int64_t slot, std::int64_t r0, std::int64_t br, std::int64_t x) {
    const std::int64_t bb = slot / (p.h / bl.hg);
    const std::int64_t hh = slot % (p.h / bl.hg) * bl.hg + x / br;
    return (bb * p.h + hh) * p.i + r0 + x % br;
  };

#pragma omp parallel if (parallel)
  {
    AttentionWork w(rows_per_task, bkp, d, dp);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      // Head-major, so that a thread's consecutive tasks share the head's
      // packed keys; within a head the largest (last) query blocks first,
      // since causal work grows with the block.
      const std::int64_t split = t % bl.splits;
      const std::int64_t rest = t / bl.splits;
      const std::int64_t slot = rest / bl.nqb;
      const std::int64_t qb = bl.nqb - 1 - rest % bl.nqb;
      const std::int64_t bb = slot / (p.h / bl.hg);
      const std::int64_t hh = slot % (p.h / bl.hg) * bl.hg;
      const std::int64_t r0 = qb * bl.bq;
      const std::int64_t br = std::min(bl.bq, p.i - r0);
      const std::int64_t rows = bl.hg * br;
      std::int64_t kb_end = bl.nkb;
      if (p.causal) {
        const std::int64_t last = p.j - p.i + r0 + br - 1;  // last visible key of the block
        kb_end = last < 0 ? 0 : std::min(bl.nkb, last / bl.bk + 1);
      }
      const std::int64_t kb0 = kb_end * split / bl.splits;
      const std::int64_t kb1 = kb_end * (split + 1) / bl.splits;
      RunTask(p, bl, bb, hh, bl.hg, qb, kb0, kb1, w);
      if (bl.splits > 1) {
        const std::size_t at = static_cast<std::size_t>(t * rows_per_task);
        std::copy(w.m.get(), w.m.get() + rows, part_m.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(w.l.get(), w.l.get() + rows, part_l.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(w.o.get(), w.o.get() + rows * dp,
                  part_o.begin() + static_cast<std::ptrdiff_t>(at * static_cast<std::size_t>(dp)));
        continue;
      }
      for (std::int64_t x = 0; x < rows; ++x) {
        const float l = w.l[x];
        float* orow = w.o.get() + x * dp;
        if (l == 0.0f) std::fill(orow, orow + d, 0.0f);  // no visible key
        const std::int64_t row = out_row(slot, r0, br, x);
        StoreRow(orow, d, l == 0.0f ? 0.0f : 1.0f / l, p.dtype, p.out, row * d);
        if (p.lse) p.lse[row] = AttentionRowLse(p, hh + x / br, r0 + x % br, w.m[x], l);
      }
    }
  }
  if (bl.splits == 1) return;

    // Merge the split states: M = max m_s, L = sum l_s e^(m_s - M),
    // O = sum O_s e^(m_s - M) / L.
#pragma omp parallel if (parallel)
  {
    std::vector<float> acc(static_cast<std::size_t>(dp));
#pragma omp for schedule(static)
    for (std::int64_t bt = 0; bt < base_tasks; ++bt) {
      const std::int64_t slot = bt / bl.nqb;
      const std::int64_t qb = bl.nqb - 1 - bt % bl.nqb;
      const std::int64_t r0 = qb * bl.bq;
      const std::int64_t br = std::min(bl.bq, p.i - r0);
      for (std::int64_t x = 0; x < bl.hg * br; ++x) {
        const auto part = [&](std::int64_t sp) {
          return static_cast<std::size_t>((bt * bl.splits + sp) * rows_per_task + x);
        };
        float mx = kNegInf;
        for (std::int64_t sp = 0; sp < bl.splits; ++sp) mx = std::max(mx, part_m[part(sp)]);
        std::fill(acc.begin(), acc.end(), 0.0f);
        float l = 0.0f;
        for (std::int64_t sp = 0; sp < bl.splits; ++sp) {
          // NaN scores seen, maybe no finite one.
          if (std::isnan(part_l[part(sp)])) l = part_l[part(sp)];
        }
        if (mx != kNegInf) {
          for (std::int64_t sp = 0; sp < bl.splits; ++sp) {
            const std::size_t at = part(sp);
            if (part_m[at] == kNegInf) continue;  // this part saw nothing
            const float f = std::exp(part_m[at] - mx);
            l += part_l[at] * f;
            const float* po = part_o.data() + at * static_cast<std::size_t>(dp);
            for (std::int64_t y = 0; y < d; ++y) acc[static_cast<std::size_t>(y)] += f * po[y];
          }
        }
        const std::int64_t row = out_row(slot, r0, br, x);
        StoreRow(acc.data(), d, l == 0.0f ? 0.0f : 1.0f / l, p.dtype, p.out, row * d);
        if (p.lse) p.lse[row] = AttentionRowLse(p, row / p.i % p.h, r0 + x % br, mx, l);
      }
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posbias::detail {

HWY_EXPORT(Run);

void fused_attention_blocked(const FusedAttentionParams& p, std::int64_t block_q,
                             std::int64_t block_k, std::int64_t splits) {
  HWY_DYNAMIC_DISPATCH(Run)(p, block_q, block_k, splits);
}

void fused_attention(const FusedAttentionParams& p) {
  // 256 query rows x 64 keys measured best on AVX-512 (b1 h16 i=j=2048 d64:
  // the packed K^T / V block is reused by 4x more rows than with 64, which
  // is what the L2 -> L1 traffic wants). Halve the query block while that
  // leaves fewer than two tasks per thread.
  const std::int64_t threads = omp_get_max_threads();
  std::int64_t bq = 256;
  while (bq > 64 && p.b * p.h * ((p.i + bq - 1) / bq) < 2 * threads) bq /= 2;
  fused_attention_blocked(p, bq, 64, 0);
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
