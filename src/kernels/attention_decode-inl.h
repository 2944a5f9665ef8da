// Internal, per instruction set: the direct (decode) path of the fused
// forward, for tasks of at most kDirectRows query rows per head: S by dot
// products over the key rows in place (nothing transposed), and O += P V
// over the value rows in place; with grouped-query attention one task holds
// the rows of several query heads of one kv head, so each key and value row
// is read once for all of them.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Decode: S by dot products over key rows read in place when their
// elements are contiguous, in their own dtype (a 16-bit row is widened in
// registers: half the bytes of float32), each key once for every row of the
// task. q rows (float32, times scale) have stride d.
template <int R, typename T>
HWY_INLINE void QKDotRows(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                          const T* HWY_RESTRICT krow, float* s, std::int64_t lds) {
  const std::int64_t n = AttnLanes(df);
  VF acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  std::int64_t x = 0;
  for (; x + n <= d; x += n) {
    const VF kv = LoadWide(df, krow + x);
    for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * d + x), kv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    for (std::int64_t y = x; y < d; ++y) sum += q[r * d + y] * AttnToF(krow[y]);
    s[r * lds] = sum;
  }
}

// The scores of every row of the task against one key row.
template <typename T>
HWY_INLINE void QKDotAllRows(DF df, const AttentionTask& t, std::int64_t d, const float* q,
                             const T* krow, float* s, std::int64_t cols) {
  std::int64_t x = 0;
  for (; x + 4 <= t.rows; x += 4) QKDotRows<4>(df, q + x * d, d, krow, s + x * cols, cols);
  switch (t.rows - x) {
    case 1:
      QKDotRows<1>(df, q + x * d, d, krow, s + x * cols, cols);
      break;
    case 2:
      QKDotRows<2>(df, q + x * d, d, krow, s + x * cols, cols);
      break;
    case 3:
      QKDotRows<3>(df, q + x * d, d, krow, s + x * cols, cols);
      break;
    default:
      break;
  }
}

// One query row against four key rows: four independent FMA chains (a
// single row against one key is one chain of d / N dependent FMAs, which
// the FMA latency, not the read, limits).
template <typename T>
HWY_INLINE void QKDot4Keys(DF df, const float* HWY_RESTRICT q, std::int64_t d,
                           const T* const* krows, float* s) {
  const std::int64_t n = AttnLanes(df);
  VF acc[4] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
  std::int64_t x = 0;
  for (; x + n <= d; x += n) {
    const VF qv = hn::LoadU(df, q + x);
    for (int u = 0; u < 4; ++u) acc[u] = hn::MulAdd(qv, LoadWide(df, krows[u] + x), acc[u]);
  }
  for (int u = 0; u < 4; ++u) {
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[u]));
    for (std::int64_t y = x; y < d; ++y) sum += q[y] * AttnToF(krows[u][y]);
    s[u] = sum;
  }
}

template <typename T>
void ScoresDirectT(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                   std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  const std::int64_t d = p.d;
  std::int64_t c = 0;
  if (t.rows == 1 && t.k_direct && p.key_mask == nullptr) {
    for (; c + 4 <= max_lim; c += 4) {
      const T* krows[4];
      for (int u = 0; u < 4; ++u) {
        krows[u] = static_cast<const T*>(p.k) + KeyRowAt(p, t, c0 + c + u, false);
      }
      QKDot4Keys(df, w.q.get(), d, krows, w.s.get() + c);
    }
  }
  for (; c < max_lim; ++c) {
    if (KeyMasked(p, t, c0 + c)) continue;  // never read; masked by BiasMaskMax
    const std::int64_t at = KeyRowAt(p, t, c0 + c, false);
    if (t.k_direct) {
      QKDotAllRows(df, t, d, w.q.get(), static_cast<const T*>(p.k) + at, w.s.get() + c, cols);
    } else {
      PackRow(p.k, p.kv_dtype, at, p.k_stride[3], d, 1.0f, w.row.get());
      QKDotAllRows(df, t, d, w.q.get(), w.row.get(), w.s.get() + c, cols);
    }
  }
}

void ScoresDirect(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                  std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  switch (p.kv_dtype) {
    case DType::kBFloat16:
      ScoresDirectT<bfloat16>(df, p, t, c0, max_lim, cols, w);
      break;
    case DType::kFloat16:
      ScoresDirectT<float16>(df, p, t, c0, max_lim, cols, w);
      break;
    default:
      ScoresDirectT<float>(df, p, t, c0, max_lim, cols, w);
      break;
  }
}

// Decode: O = alpha O + P V reading the value rows in place in their dtype
// (widened in registers), else converting this block's rows once, for all
// rows of the task. Tiles two rows by twice the width of the blocked path:
// each value row is read whole, once per two rows (d <= 128 on AVX-512),
// which keeps the reads of V sequential.
void ValuesDirect(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                  std::int64_t c0, std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  if (t.v_direct) {
    const std::int64_t at = KeyRowAt(p, t, c0, true);
    switch (p.kv_dtype) {
      case DType::kBFloat16:
        PVBlock<2, 2 * kAttnVecs>(df, w, t.rows, w.s.get(), cols,
                                  static_cast<const bfloat16*>(p.v) + at, p.v_stride[2], dp);
        break;
      case DType::kFloat16:
        PVBlock<2, 2 * kAttnVecs>(df, w, t.rows, w.s.get(), cols,
                                  static_cast<const float16*>(p.v) + at, p.v_stride[2], dp);
        break;
      default:
        PVBlock<2, 2 * kAttnVecs>(df, w, t.rows, w.s.get(), cols,
                                  static_cast<const float*>(p.v) + at, p.v_stride[2], dp);
        break;
    }
    return;
  }
  for (std::int64_t c = 0; c < max_lim; ++c) {
    float* vrow = w.v.get() + c * dp;
    if (KeyMasked(p, t, c0 + c)) {  // never read
      std::fill(vrow, vrow + dp, 0.0f);
      continue;
    }
    PackRow(p.v, p.kv_dtype, KeyRowAt(p, t, c0 + c, true), p.v_stride[3], p.d, 1.0f, vrow);
    for (std::int64_t x = p.d; x < dp; ++x) vrow[x] = 0.0f;
  }
  PVBlock<2, 2 * kAttnVecs>(df, w, t.rows, w.s.get(), cols, w.v.get(), dp, dp);
}

// One key block [c0, c0 + max_lim) of a direct (decode) task: scores,
// the online-softmax update, then O = alpha O + P V.
void DirectBlock(DF df, const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                 std::int64_t c0, std::int64_t max_lim, std::int64_t cols, AttentionWork& w) {
  ScoresDirect(df, p, t, c0, max_lim, cols, w);
  SoftmaxBlock(df, p, t, c0, cols, w);
  ValuesDirect(df, p, t, dp, c0, max_lim, cols, w);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_INL_H_ toggle
