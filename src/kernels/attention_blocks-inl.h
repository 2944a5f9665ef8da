// Internal, per instruction set: the per-block steps of attention, shared by
// the forward (attention_fused.cc) and the backward (attention_backward.cc):
//
//   PackRow       a row of any dtype at any stride -> float32 (times a factor)
//   QKRows        the score tile S = q K^T (register-tiled; ALiBi may be
//                 added as the tile is stored)
//   RowBiasOf, BiasMaskMax
//                 the bias of one query row over one key block, added to its
//                 scores with the mask of the keys it cannot see (-inf), and
//                 the row max
//   MulAddRows    C += A B over strided A: the backward's gradient
//                 products (the forward's P V tile is PVRows, built on
//                 the same MulAddTile)
//
// and the row store is store_floats (float_store.h). The forward's online
// softmax over these scores is in attention_softmax-inl.h, the exp in
// attention_exp-inl.h. Everything here is inline: the two kernel files each
// compile it for every target.

// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_BLOCKS_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_BLOCKS_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_BLOCKS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "checks.h"
#include "kernels/attention_exp-inl.h"
#include "kernels/attention_params.h"
#include "posbias/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Names are unique across src/kernels (every kernel file shares
// HWY_NAMESPACE; a clash of inline members is an ODR violation).
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tile: rows x vectors. AVX-512 has 32 vector registers, AVX2 and
// SSE 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kAttnVecs = 4;
#else
constexpr int kAttnVecs = 2;
#endif

// The forward's blocked tiles (the score tile and the P V tile): 6 rows x
// kAttnVecs vectors, 12 accumulators on AVX2 and SSE (+ kAttnVecs loads and a
// broadcast: 15 of 16 registers), 24 on AVX-512 (29 of 32). Twelve
// independent FMA chains cover the FMA latency (4 cycles x 2 pipes on Zen 3,
// 4 x 2 on Skylake-X) with room, where 4 rows (8 on AVX2) were just at it;
// and each vector load serves 6 broadcasts instead of 4. The backward's
// products (QKAllRows, MulAddRows) use the same height.
constexpr int kFwdRows = 6;

constexpr float kAttnNegInf = -std::numeric_limits<float>::infinity();

// f(std::integral_constant<int, R>(), r) for groups of rows [r, r + R) over
// [0, rows): R = kMax while kMax rows remain, then once R = what remains, so
// the last group also gets a multi-row tile (not one row at a time).
template <int R, class F>
HWY_INLINE void RemainderRowTile(std::int64_t left, std::int64_t r, const F& f) {
  if constexpr (R > 0) {
    if (left == R) {
      f(std::integral_constant<int, R>(), r);
    } else {
      RemainderRowTile<R - 1>(left, r, f);
    }
  }
}

template <int kMax, class F>
HWY_INLINE void ForRowTiles(std::int64_t rows, const F& f) {
  std::int64_t r = 0;
  for (; r + kMax <= rows; r += kMax) f(std::integral_constant<int, kMax>(), r);
  RemainderRowTile<kMax - 1>(rows - r, r, f);
}

HWY_INLINE std::int64_t AttnLanes(DF df) { return static_cast<std::int64_t>(hn::Lanes(df)); }

// x rounded up to whole vectors.
HWY_INLINE std::int64_t AttnRoundUp(DF df, std::int64_t x) {
  return static_cast<std::int64_t>(
      hwy::RoundUpTo(static_cast<std::size_t>(x), static_cast<std::size_t>(AttnLanes(df))));
}

template <typename T>
HWY_INLINE float AttnToF(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_float(x);
  }
}

// One vector of float32 from N consecutive elements of any of the three
// dtypes, widened in registers (a 16-bit K or V is read as 16 bits).
HWY_INLINE VF LoadWide(DF df, const float* p) { return hn::LoadU(df, p); }

HWY_INLINE VF LoadWide(DF df, const bfloat16* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;  // exact: the top half of a float32
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}

HWY_INLINE VF LoadWide(DF df, const float16* p) {
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX2
  // Below AVX2 F16C is not assumed, and Highway's emulation turns inf and
  // NaN into finite numbers: convert lane by lane.
  HWY_ALIGN float tmp[HWY_MAX_BYTES / sizeof(float)];
  for (std::size_t l = 0; l < hn::Lanes(df); ++l) tmp[l] = to_float(p[l]);
  return hn::Load(df, tmp);
#else
  const hn::Rebind<hwy::float16_t, DF> dh;  // one F16C vcvtph2ps on x86
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
}

// dst[0..n) = mul * src[0, stride, 2 stride, ...] as float32.
template <typename T>
HWY_INLINE void PackRowT(const T* src, std::int64_t stride, std::int64_t n, float mul, float* dst) {
  if (stride == 1) {
    const DF df;
    const std::int64_t lanes = AttnLanes(df);
    const VF vm = hn::Set(df, mul);
    std::int64_t x = 0;
    for (; x + lanes <= n; x += lanes) hn::StoreU(hn::Mul(vm, LoadWide(df, src + x)), df, dst + x);
    for (; x < n; ++x) dst[x] = mul * AttnToF(src[x]);
  } else {
    for (std::int64_t x = 0; x < n; ++x) dst[x] = mul * AttnToF(src[x * stride]);
  }
}

// The kLanes x kLanes floats at column x of rows src[0 .. kLanes) (8 or 16
// lanes), transposed: out[i] holds element x + i of every row, in row
// order. Interleaves within 128-bit blocks make a 4 x 4 transpose of each
// 4-row group (u[g][i], block k: element x + 4k + i of rows 4g ... 4g + 3),
// then out[4k + i] gathers block k of u[0][i], u[1][i], ...: halves with
// 8 lanes; with 16, blocks swapped pairwise, then halves.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // 8 or 16 lanes
constexpr bool kTransposeSquare = true;
template <int N>
HWY_INLINE void TransposeSquare(DF df, const float* const* src, std::int64_t x, VF* out) {
  static_assert(N == 8 || N == 16, "8 or 16 lanes");
  const hn::Repartition<double, DF> dd;
  constexpr int kGroups = N / 4;
  VF u[kGroups][4];
  for (int g = 0; g < kGroups; ++g) {
    const VF r0 = hn::LoadU(df, src[4 * g] + x), r1 = hn::LoadU(df, src[4 * g + 1] + x);
    const VF r2 = hn::LoadU(df, src[4 * g + 2] + x), r3 = hn::LoadU(df, src[4 * g + 3] + x);
    const auto t0 = hn::BitCast(dd, hn::InterleaveLower(df, r0, r1));  // a0 b0 a1 b1
    const auto t1 = hn::BitCast(dd, hn::InterleaveUpper(df, r0, r1));  // a2 b2 a3 b3
    const auto t2 = hn::BitCast(dd, hn::InterleaveLower(df, r2, r3));  // c0 d0 c1 d1
    const auto t3 = hn::BitCast(dd, hn::InterleaveUpper(df, r2, r3));  // c2 d2 c3 d3
    u[g][0] = hn::BitCast(df, hn::InterleaveLower(dd, t0, t2));        // a0 b0 c0 d0
    u[g][1] = hn::BitCast(df, hn::InterleaveUpper(dd, t0, t2));        // a1 b1 c1 d1
    u[g][2] = hn::BitCast(df, hn::InterleaveLower(dd, t1, t3));
    u[g][3] = hn::BitCast(df, hn::InterleaveUpper(dd, t1, t3));
  }
  for (int i = 0; i < 4; ++i) {
    if constexpr (N == 8) {
      out[i] = hn::ConcatLowerLower(df, u[1][i], u[0][i]);
      out[4 + i] = hn::ConcatUpperUpper(df, u[1][i], u[0][i]);
    } else {
      // [u0 b0, u1 b0, u0 b2, u1 b2] and [u0 b1, u1 b1, u0 b3, u1 b3]; the
      // same of u2, u3; then their lower and upper halves.
      const VF e01 = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(u[1][i]), u[0][i]);
      const VF o01 = hn::OddEvenBlocks(u[1][i], hn::SwapAdjacentBlocks(u[0][i]));
      const VF e23 = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(u[3][i]), u[2][i]);
      const VF o23 = hn::OddEvenBlocks(u[3][i], hn::SwapAdjacentBlocks(u[2][i]));
      out[i] = hn::ConcatLowerLower(df, e23, e01);
      out[4 + i] = hn::ConcatLowerLower(df, o23, o01);
      out[8 + i] = hn::ConcatUpperUpper(df, e23, e01);
      out[12 + i] = hn::ConcatUpperUpper(df, o23, o01);
    }
  }
}
#else
constexpr bool kTransposeSquare = false;
#endif

// dst[x * ld + u] = rows[u][x] for the MaxLanes rows u and x < d: a group of
// rows as that many columns of a transposed block (K^T, V^T). With
// kTransposeSquare a vector of each row at a time (TransposeSquare: one
// load and one store a vector, where the element-by-element copy took a
// load and a store an element), the last d % lanes element by element.
HWY_INLINE void TransposeRowGroup(DF df, const float* const* rows, std::int64_t d, float* dst,
                                  std::int64_t ld) {
  constexpr std::size_t kN = hn::MaxLanes(DF());
  constexpr auto n = static_cast<std::int64_t>(kN);
  std::int64_t x = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  for (; x + n <= d; x += n) {
    VF cols[kN];
    TransposeSquare<static_cast<int>(kN)>(df, rows, x, cols);
    for (std::int64_t i = 0; i < n; ++i) hn::StoreU(cols[i], df, dst + (x + i) * ld);
  }
#else
  (void)df;
#endif
  for (; x < d; ++x) {
    for (std::int64_t u = 0; u < n; ++u) dst[x * ld + u] = rows[u][x];
  }
}

// f(T()) with T the element type of a float32, bfloat16 or float16 tensor
// (the API checks dtypes first: any other throws unsupported_dtype, which
// inside a parallel region ends the process). The kernels' own copy of
// dtype_dispatch.h's with_float_type: that one is compiled for the
// baseline, and GCC does not inline a lambda compiled for this target into
// it (the lambda would be a call).
template <class F>
HWY_INLINE void VisitKvType(DType dt, const F& f) {
  switch (dt) {
    case DType::kBFloat16:
      f(bfloat16());
      return;
    case DType::kFloat16:
      f(float16());
      return;
    case DType::kFloat32:
      f(float());
      return;
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kBool:
      break;
  }
  detail::unsupported_dtype("attention kernel", dt);
}

// dst[0..n) = mul * base[offset + x * stride] (of dtype dt: float32,
// bfloat16 or float16) as float32.
inline void PackRow(const void* base, DType dt, std::int64_t offset, std::int64_t stride,
                    std::int64_t n, float mul, float* dst) {
  VisitKvType(dt, [&](auto tag) {
    using T = decltype(tag);
    PackRowT(static_cast<const T*>(base) + offset, stride, n, mul, dst);
  });
}

// ALiBi folded into the score tile's store: row r of the tile adds
// neg_slope * |x + lane - row_off[r]| to column x + lane, where row_off[r] is
// the row's ALiBi anchor minus the block's first key (see RowBiasOf). The
// distances are exact integers in float32 and the add is the same
// single-rounding FMA as BiasMaskMax's, so the scores are bit for bit those
// of the separate pass, without its load and store of every score.
struct AlibiFold {
  const float* row_off = nullptr;  // per row of the tile
  float neg_slope = 0.0f;
};

// S[r][x..x + V N) for rows [0, R) of q (row stride ldq) against kt (rows of
// ld floats, one per element of d); with kAlibi, plus the ALiBi bias of
// `fold`.
// acc[r][u] = sum over d of q[r][kk] kt[kk][x + u N ...]: the score tile's
// broadcast-FMA loop (rows [0, R) of q with row stride ldq, kt rows of ld
// floats, one per element of d).
template <int R, int V>
HWY_INLINE void QKAccumulate(DF df, const float* HWY_RESTRICT q, std::int64_t ldq, std::int64_t d,
                             const float* HWY_RESTRICT kt, std::int64_t ld, std::int64_t x,
                             VF (&acc)[R][V]) {
  const std::int64_t n = AttnLanes(df);
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) acc[r][u] = hn::Zero(df);
  }
  // Unrolled by 4: the rows' broadcasts then address with constant
  // offsets, and a prefill took 0.92-0.96x the time (Zen 3, AVX2).
#pragma GCC unroll 4
  for (std::int64_t kk = 0; kk < d; ++kk) {
    const float* krow = kt + kk * ld + x;
    VF kv[V];
    for (int u = 0; u < V; ++u) kv[u] = hn::LoadU(df, krow + u * n);
    for (int r = 0; r < R; ++r) {
      const VF qv = hn::Set(df, q[r * ldq + kk]);
      for (int u = 0; u < V; ++u) acc[r][u] = hn::MulAdd(qv, kv[u], acc[r][u]);
    }
  }
}

// Adds the ALiBi bias of `fold` to the tile acc over columns x + u N ...
template <int R, int V>
HWY_INLINE void AddAlibiFold(DF df, std::int64_t x, const AlibiFold& fold, VF (&acc)[R][V]) {
  const std::int64_t n = AttnLanes(df);
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

// S[r][x..x + V N) for rows [0, R) of q (row stride ldq) against kt (rows of
// ld floats, one per element of d); with kAlibi, plus the ALiBi bias of
// `fold`.
template <int R, int V, bool kAlibi>
HWY_INLINE void QKTile(DF df, const float* HWY_RESTRICT q, std::int64_t ldq, std::int64_t d,
                       const float* HWY_RESTRICT kt, std::int64_t ld, std::int64_t x,
                       float* HWY_RESTRICT s, std::int64_t lds, const AlibiFold& fold) {
  const std::int64_t n = AttnLanes(df);
  VF acc[R][V];
  QKAccumulate<R, V>(df, q, ldq, d, kt, ld, x, acc);
  if constexpr (kAlibi) AddAlibiFold<R, V>(df, x, fold, acc);
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) hn::Store(acc[r][u], df, s + r * lds + x + u * n);
  }
}

// S rows [0, R) over columns [0, cols) (a multiple of the vector length);
// s is vector aligned and lds a multiple of the vector length.
template <int R, bool kAlibi>
HWY_INLINE void QKRows(DF df, const float* q, std::int64_t ldq, std::int64_t d, const float* kt,
                       std::int64_t ld, std::int64_t cols, float* s, std::int64_t lds,
                       const AlibiFold& fold) {
  const std::int64_t n = AttnLanes(df);
  std::int64_t x = 0;
  for (; x + kAttnVecs * n <= cols; x += kAttnVecs * n) {
    QKTile<R, kAttnVecs, kAlibi>(df, q, ldq, d, kt, ld, x, s, lds, fold);
  }
  for (; x < cols; x += n) QKTile<R, 1, kAlibi>(df, q, ldq, d, kt, ld, x, s, lds, fold);
}

// Every row of S = q K^T (no bias) for `rows` rows.
HWY_INLINE void QKAllRows(DF df, std::int64_t rows, const float* q, std::int64_t ldq,
                          std::int64_t d, const float* kt, std::int64_t ld, std::int64_t cols,
                          float* s, std::int64_t lds) {
  const AlibiFold none;
  ForRowTiles<kFwdRows>(rows, [&](auto rows_tag, std::int64_t r) {
    QKRows<decltype(rows_tag)::value, false>(df, q + r * ldq, ldq, d, kt, ld, cols, s + r * lds,
                                             lds, none);
  });
}

// How MulAddTile starts C.
enum class TileInit : std::uint8_t {
  kZero,   // C = A B
  kAdd,    // C += A B
  kScale,  // C = alpha[r] C + A B
};

// C[r][0 .. V N) for rows [0, R): A is read through two strides (row
// a_row, inner index a_t), so transposed operands need no copy; B rows
// (stride ldb) and C rows (stride ldc) may be unaligned.
template <int R, int V, typename TB = float>
HWY_INLINE void MulAddTile(DF df, const float* HWY_RESTRICT a, std::int64_t a_row, std::int64_t a_t,
                           const TB* HWY_RESTRICT b, std::int64_t ldb, std::int64_t t_count,
                           TileInit init, const float* alpha, float* HWY_RESTRICT c,
                           std::int64_t ldc) {
  const std::int64_t n = AttnLanes(df);
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) {
      if (init == TileInit::kZero) {
        acc[r][u] = hn::Zero(df);
      } else if (init == TileInit::kAdd) {
        acc[r][u] = hn::LoadU(df, c + r * ldc + u * n);
      } else {
        acc[r][u] = hn::Mul(hn::Set(df, alpha[r]), hn::LoadU(df, c + r * ldc + u * n));
      }
    }
  }
#pragma GCC unroll 4  // as QKAccumulate's loop
  for (std::int64_t t = 0; t < t_count; ++t) {
    VF bv[V];
    for (int u = 0; u < V; ++u) bv[u] = LoadWide(df, b + t * ldb + u * n);
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(df, a[r * a_row + t * a_t]);
      for (int u = 0; u < V; ++u) acc[r][u] = hn::MulAdd(av, bv[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int u = 0; u < V; ++u) hn::StoreU(acc[r][u], df, c + r * ldc + u * n);
  }
}

// MulAddTile over columns [0, cols) (a multiple of the vector length), VW
// vectors at a time.
template <int R, int VW = kAttnVecs, typename TB = float>
HWY_INLINE void MulAddRowsOf(DF df, const float* a, std::int64_t a_row, std::int64_t a_t,
                             const TB* b, std::int64_t ldb, std::int64_t t_count, TileInit init,
                             const float* alpha, float* c, std::int64_t ldc, std::int64_t cols) {
  const std::int64_t n = AttnLanes(df);
  std::int64_t x = 0;
  for (; x + VW * n <= cols; x += VW * n) {
    MulAddTile<R, VW, TB>(df, a, a_row, a_t, b + x, ldb, t_count, init, alpha, c + x, ldc);
  }
  for (; x < cols; x += n) {
    MulAddTile<R, 1, TB>(df, a, a_row, a_t, b + x, ldb, t_count, init, alpha, c + x, ldc);
  }
}

// C[rows][cols] += A[rows][t_count] B[t_count][cols]; cols a multiple of
// the vector length. Tiles of kFwdRows rows (the last rows one tile of
// what remains), as the forward's: each B vector serves that many
// broadcasts. A row's sums run in t's order whatever the tile, so the
// tile's height changes no bit.
HWY_INLINE void MulAddRows(DF df, std::int64_t rows, std::int64_t cols, std::int64_t t_count,
                           const float* a, std::int64_t a_row, std::int64_t a_t, const float* b,
                           std::int64_t ldb, float* c, std::int64_t ldc) {
  ForRowTiles<kFwdRows>(rows, [&](auto rows_tag, std::int64_t r) {
    MulAddRowsOf<decltype(rows_tag)::value>(df, a + r * a_row, a_row, a_t, b, ldb, t_count,
                                            TileInit::kAdd, nullptr, c + r * ldc, ldc, cols);
  });
}

// The bias of one query row over the key block starting at key c0.
struct RowBias {
  FusedBias kind = FusedBias::kNone;  // kNone also when the tile added ALiBi
  float softcap = 0.0f;               // > 0: cap * tanh(s / cap) before the bias
  float neg_slope = 0.0f;
  std::int64_t alibi_rel0 = 0;    // kAlibi: signed distance of column 0
  const float* window = nullptr;  // kTable: the row's entries from column 0
  const float* dense = nullptr;   // kDense: column 0 of the row
  std::int64_t dense_step = 0;    // kDense: between columns
};

// The ALiBi distance anchor of a query position. With `from_first_key`,
// rows before the first key (qpos < 0, non-causal i > j) use -slope * c
// instead of -slope * (c - qpos): the same softmax (a per-row constant), but
// scores near 0 rather than around -slope * |qpos|, where float32 would
// round them to the ulp of hundreds (the forward; its lse adds the constant
// back). The backward recomputes the true scores against the true lse.
HWY_INLINE std::int64_t AlibiAnchor(std::int64_t qpos, bool from_first_key) {
  return from_first_key ? std::max<std::int64_t>(qpos, 0) : qpos;
}

// Row qr (position qpos) of head hh, batch bb, over the block at key c0, of
// which it sees `lim` keys (0: no bias is read); `alibi_added`: the score
// tile already added ALiBi.
HWY_INLINE RowBias RowBiasOf(const AttentionParams& p, std::int64_t bb, std::int64_t hh,
                             std::int64_t qr, std::int64_t qpos, std::int64_t c0, std::int64_t lim,
                             bool alibi_from_first_key, bool alibi_added) {
  RowBias rb;
  rb.kind = alibi_added ? FusedBias::kNone : p.bias;
  rb.softcap = p.softcap;
  if (lim == 0) return rb;  // a table window would start outside the table
  switch (rb.kind) {
    case FusedBias::kNone:
      break;
    case FusedBias::kAlibi:
      rb.neg_slope = -slope_of(p, bb, hh);
      // |value| < 2^24 keeps the float32 distances exact.
      rb.alibi_rel0 = c0 - AlibiAnchor(qpos, alibi_from_first_key);
      break;
    case FusedBias::kTable:
      rb.window = p.rtable + hh * p.rtable_stride + table_index(p, c0 - qpos);
      break;
    case FusedBias::kDense:
      rb.dense = p.dense + bb * p.dense_stride[0] + hh * p.dense_stride[1] +
                 qr * p.dense_stride[2] + c0 * p.dense_stride[3];
      rb.dense_step = p.dense_stride[3];
      break;
  }
  return rb;
}

// |distance| of columns [x, x + N) from the row's ALiBi anchor (exact).
HWY_INLINE VF AlibiDistance(DF df, const RowBias& rb, std::int64_t x) {
  return hn::Abs(hn::Add(hn::Set(df, static_cast<float>(rb.alibi_rel0 + x)), hn::Iota(df, 0.0f)));
}

// Adds the row's bias to scores s over columns [0, cols) (aligned, a
// multiple of the vector length) of which the first `lim` are visible,
// masks the others with -inf, and returns the row max. Only the vectors
// holding visible keys are touched: the rest of the row is never read.
HWY_INLINE float BiasMaskMaxGeneral(DF df, const RowBias& rb, std::int64_t cols, std::int64_t lim,
                                    float* HWY_RESTRICT s, std::int64_t first,
                                    const float* HWY_RESTRICT keep);

template <bool kCap>
HWY_INLINE float BiasMaskMaxRow(DF df, const RowBias& rb, std::int64_t cols, std::int64_t lim,
                                float* HWY_RESTRICT s);

HWY_INLINE float BiasMaskMax(DF df, const RowBias& rb, std::int64_t cols, std::int64_t lim,
                             float* HWY_RESTRICT s, std::int64_t first = 0,
                             const float* HWY_RESTRICT keep = nullptr) {
  // A row that sees no key of this block reads nothing (with i > j a
  // distance-table window would start outside the table).
  if (lim <= first) return kAttnNegInf;
  if (first > 0 || keep != nullptr || (rb.softcap > 0.0f && rb.kind == FusedBias::kDense)) {
    return BiasMaskMaxGeneral(df, rb, cols, lim, s, first, keep);
  }
  if (rb.softcap > 0.0f) return BiasMaskMaxRow<true>(df, rb, cols, lim, s);
  return BiasMaskMaxRow<false>(df, rb, cols, lim, s);
}

// BiasMaskMax of a row without a window edge or key mask: a loop per bias
// kind over the whole vectors it sees (no branch or mask inside), then the
// one masked tail vector; with kCap each score is soft-capped first (not
// with kDense).
template <bool kCap>
HWY_INLINE float BiasMaskMaxRow(DF df, const RowBias& rb, std::int64_t cols, std::int64_t lim,
                                float* HWY_RESTRICT s) {
  const std::int64_t n = AttnLanes(df);
  [[maybe_unused]] const VF cap = hn::Set(df, rb.softcap);
  [[maybe_unused]] const VF inv_cap = hn::Set(df, kCap ? 1.0f / rb.softcap : 0.0f);
  const auto capped = [&](VF v) {
    if constexpr (kCap) {
      return hn::Mul(cap, SoftcapTanh(df, hn::Mul(v, inv_cap)));
    } else {
      return v;
    }
  };
  if (rb.kind == FusedBias::kDense) {
    if (rb.dense_step == 1) {
      for (std::int64_t c = 0; c < lim; ++c) s[c] += rb.dense[c];
    } else {
      for (std::int64_t c = 0; c < lim; ++c) s[c] += rb.dense[c * rb.dense_step];
    }
  }
  VF vmax = hn::Set(df, kAttnNegInf);
  const VF neg_slope = hn::Set(df, rb.neg_slope);
  const std::int64_t span = std::min(cols, AttnRoundUp(df, lim));
  // One loop per bias kind (no branch inside); the masked tail is at most
  // one vector and handled after.
  const std::int64_t full = std::min(span, lim - lim % n);
  if (rb.kind == FusedBias::kAlibi) {
    VF dist = hn::Add(hn::Set(df, static_cast<float>(rb.alibi_rel0)), hn::Iota(df, 0.0f));
    const VF step = hn::Set(df, static_cast<float>(n));
    for (std::int64_t x = 0; x < full; x += n) {
      const VF v = hn::MulAdd(neg_slope, hn::Abs(dist), capped(hn::Load(df, s + x)));
      hn::Store(v, df, s + x);
      vmax = hn::Max(vmax, v);
      dist = hn::Add(dist, step);
    }
  } else if (rb.kind == FusedBias::kTable) {
    for (std::int64_t x = 0; x < full; x += n) {
      const VF v = hn::Add(capped(hn::Load(df, s + x)), hn::LoadU(df, rb.window + x));
      hn::Store(v, df, s + x);
      vmax = hn::Max(vmax, v);
    }
  } else {
    for (std::int64_t x = 0; x < full; x += n) {
      const VF v = capped(hn::Load(df, s + x));
      if constexpr (kCap) hn::Store(v, df, s + x);
      vmax = hn::Max(vmax, v);
    }
  }
  for (std::int64_t x = full; x < span; x += n) {
    VF v = capped(hn::Load(df, s + x));
    if (rb.kind == FusedBias::kAlibi) {
      v = hn::MulAdd(neg_slope, AlibiDistance(df, rb, x), v);
    } else if (rb.kind == FusedBias::kTable) {
      v = hn::Add(v, hn::LoadU(df, rb.window + x));
    }
    const std::int64_t kept = std::max<std::int64_t>(0, lim - x);
    v = hn::IfThenElse(hn::FirstN(df, static_cast<std::size_t>(kept)), v, hn::Set(df, kAttnNegInf));
    hn::Store(v, df, s + x);
    vmax = hn::Max(vmax, v);
  }
  return hn::GetLane(hn::MaxOfLanes(df, vmax));
}

// BiasMaskMax with a window's left edge (columns before `first` are masked
// and their bias is not read), a key mask (keep[c] == 0: masked; null:
// none) and soft-capping (cap * tanh(s / cap), then the bias). Columns
// [0, cols) of the row all end up written: -inf where masked.
HWY_INLINE float BiasMaskMaxGeneral(DF df, const RowBias& rb, std::int64_t cols, std::int64_t lim,
                                    float* HWY_RESTRICT s, std::int64_t first,
                                    const float* HWY_RESTRICT keep) {
  const std::int64_t n = AttnLanes(df);
  bool capped = rb.softcap > 0.0f;
  if (rb.kind == FusedBias::kDense) {  // cap (whole vectors), then the bias one element at a time
    if (capped) {
      const VF cap = hn::Set(df, rb.softcap);
      const VF inv_cap = hn::Set(df, 1.0f / rb.softcap);
      const std::int64_t end = std::min(cols, AttnRoundUp(df, lim));
      for (std::int64_t x = first - first % n; x < end; x += n) {
        hn::Store(hn::Mul(cap, SoftcapTanh(df, hn::Mul(hn::Load(df, s + x), inv_cap))), df, s + x);
      }
    }
    for (std::int64_t c = first; c < lim; ++c) s[c] += rb.dense[c * rb.dense_step];
    capped = false;
  }
  const VF ninf = hn::Set(df, kAttnNegInf);
  const std::int64_t x0 = first - first % n;
  for (std::int64_t x = 0; x < x0; x += n) hn::Store(ninf, df, s + x);
  const std::int64_t span = std::min(cols, AttnRoundUp(df, lim));
  const VF cap = hn::Set(df, rb.softcap);
  const VF inv_cap = hn::Set(df, capped ? 1.0f / rb.softcap : 0.0f);
  const VF neg_slope = hn::Set(df, rb.neg_slope);
  VF vmax = ninf;
  for (std::int64_t x = x0; x < span; x += n) {
    VF v = hn::Load(df, s + x);
    if (capped) v = hn::Mul(cap, SoftcapTanh(df, hn::Mul(v, inv_cap)));
    if (rb.kind == FusedBias::kAlibi) {
      v = hn::MulAdd(neg_slope, AlibiDistance(df, rb, x), v);
    } else if (rb.kind == FusedBias::kTable) {
      v = hn::Add(v, hn::LoadU(df, rb.window + x));
    }
    auto in =
        hn::AndNot(hn::FirstN(df, static_cast<std::size_t>(std::max<std::int64_t>(0, first - x))),
                   hn::FirstN(df, static_cast<std::size_t>(std::max<std::int64_t>(0, lim - x))));
    if (keep != nullptr) in = hn::And(in, hn::Ne(hn::LoadU(df, keep + x), hn::Zero(df)));
    v = hn::IfThenElse(in, v, ninf);
    hn::Store(v, df, s + x);
    vmax = hn::Max(vmax, v);
  }
  return hn::GetLane(hn::MaxOfLanes(df, vmax));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_BLOCKS_INL_H_ toggle
