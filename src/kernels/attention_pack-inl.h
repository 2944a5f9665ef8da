// Internal, per instruction set: the blocked path's key block operands
// (attention_fused.cc) -- K^T and V of a key block packed in float32 (16-bit
// rows widened, strided and paged rows gathered, float32 keys transposed in
// registers), or V's rows read in place, and the rows' ALiBi anchors or
// distance-table rows for the score tile.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_PACK_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_PACK_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_PACK_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_params.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// K^T [d][ld] of key rows [c0, c0 + keys), a vector's lanes of keys at a time
// (TransposeRowGroup: one load and one store per vector, where the
// element-by-element copy took a load and a store per element): float32
// rows with contiguous elements and no key mask read in place, the others
// first widened (a masked key as zeros) into `group`, MaxLanes rows of d
// floats. Returns the keys done, a multiple of the lanes (0 where the
// target has no register transposes).
std::int64_t PackKeysTransposed(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                                std::int64_t keys, std::int64_t ld, bool far, float* kt,
                                float* group) {
  if constexpr (!kTransposeSquare) {
    (void)p, (void)t, (void)c0, (void)keys, (void)ld, (void)far, (void)kt, (void)group;
    return 0;
  } else {
    constexpr std::size_t kN = hn::MaxLanes(DF());
    constexpr auto n = static_cast<std::int64_t>(kN);
    const DF df;
    const std::int64_t d = p.d;
    const std::size_t esize = dtype_size(p.kv_dtype);
    const bool in_place =
        p.kv_dtype == DType::kFloat32 && p.k_stride[3] == 1 && p.key_mask == nullptr;
    const auto row_at = [&](std::int64_t c) {
      return static_cast<const char*>(p.k) +
             static_cast<std::size_t>(KeyRowAt(p, t, c0 + c, false)) * esize;
    };
    // The group loop, compiled for rows in place and for widened rows.
    const auto run = [&](auto in_place_tag) {
      constexpr bool kInPlace = decltype(in_place_tag)::value;
      const float* rows[kN];
      std::int64_t c = 0;
      for (; c + n <= keys; c += n) {
        // Rows a page apart (a paged cache): the next group's lines into
        // the caches while this one is transposed.
        if (far && c + 2 * n <= keys) {
          for (std::int64_t u = 0; u < n; ++u) {
            const char* next = row_at(c + n + u);
            for (std::size_t b = 0; b < static_cast<std::size_t>(d) * esize; b += 64) {
              hwy::Prefetch(next + b);
            }
          }
        }
        for (std::int64_t u = 0; u < n; ++u) {
          if constexpr (kInPlace) {
            rows[u] = reinterpret_cast<const float*>(row_at(c + u));
          } else {
            float* g = group + u * d;
            if (KeyMasked(p, t, c0 + c + u)) {
              std::fill(g, g + d, 0.0f);
            } else {
              PackRow(p.k, p.kv_dtype, KeyRowAt(p, t, c0 + c + u, false), p.k_stride[3], d, 1.0f,
                      g);
            }
            rows[u] = g;
          }
        }
        TransposeRowGroup(df, rows, d, kt + c, ld);
      }
      return c;
    };
    return in_place ? run(std::true_type()) : run(std::false_type());
  }
}

// Key rows [c0, c0 + keys) as K^T [d][ld] (zero columns up to ld) and,
// unless P V reads them in place (vp null), V [keys][dp] (zero past d).
void PackKeyBlock(const AttentionParams& p, const AttentionTask& t, std::int64_t dp,
                  std::int64_t c0, std::int64_t keys, std::int64_t ld, float* kt, float* vp,
                  float* tmp) {
  const std::int64_t d = p.d;
  const std::size_t esize = dtype_size(p.kv_dtype);
  // Rows further apart than a 4 KiB page (a paged cache's kv heads side by
  // side: one row per hk * d elements) are not followed by the hardware's
  // stream prefetchers: each would wait for memory on its own. Those are
  // prefetched kAhead keys ahead.
  constexpr std::int64_t kAhead = 8;
  const bool far =
      p.key_layout == KeyLayout::kPaged && static_cast<std::size_t>(p.k_stride[2]) * esize >= 4096;
  const auto prefetch_row = [&](const void* base, std::int64_t at) {
    const char* row = static_cast<const char*>(base) + static_cast<std::size_t>(at) * esize;
    for (std::size_t b = 0; b < static_cast<std::size_t>(d) * esize; b += 64)
      hwy::Prefetch(row + b);
  };
  // K^T by register transposes, so that only V (where it is packed) and
  // the last keys go row by row (tmp: MaxLanes rows of d floats).
  const std::int64_t done = PackKeysTransposed(p, t, c0, keys, ld, far, kt, tmp);
  // The rows still to read: K's past those transposed, V's where packed.
  const auto prefetch_key = [&](std::int64_t c) {
    if (c >= done) prefetch_row(p.k, KeyRowAt(p, t, c0 + c, false));
    if (vp != nullptr) prefetch_row(p.v, KeyRowAt(p, t, c0 + c, true));
  };
  if (far && (vp != nullptr || done < keys)) {
    for (std::int64_t a = 1; a < std::min(kAhead, keys); ++a) prefetch_key(a);
  }
  for (std::int64_t c = 0; c < keys; ++c) {
    float* vrow = vp != nullptr ? vp + c * dp : nullptr;
    if (far && c + kAhead < keys) prefetch_key(c + kAhead);
    if (c >= done) {                  // K^T element by element
      if (KeyMasked(p, t, c0 + c)) {  // never read: zeros
        for (std::int64_t x = 0; x < d; ++x) kt[x * ld + c] = 0.0f;
        std::fill(vrow, vrow + dp, 0.0f);
        continue;
      }
      PackRow(p.k, p.kv_dtype, KeyRowAt(p, t, c0 + c, false), p.k_stride[3], d, 1.0f, tmp);
      for (std::int64_t x = 0; x < d; ++x) kt[x * ld + c] = tmp[x];
    }
    if (vp == nullptr) continue;
    PackRow(p.v, p.kv_dtype, KeyRowAt(p, t, c0 + c, true), p.v_stride[3], d, 1.0f, vrow);
    for (std::int64_t x = d; x < dp; ++x) vrow[x] = 0.0f;
  }
  for (std::int64_t x = 0; x < d; ++x) {
    for (std::int64_t c = keys; c < ld; ++c) kt[x * ld + c] = 0.0f;
  }
}

// A key block's operands for the blocked path: K^T [d][ld] and V [keys][dp]
// (vp), or V's rows in place (v_rows, of p.kv_dtype, ldv elements apart).
struct KeyBlockOperands {
  const float* kt;
  std::int64_t ld;
  const float* vp;
  const void* v_rows = nullptr;
  std::int64_t ldv = 0;
};

// The rows' ALiBi anchors less the block's first key c0 (w.alibi_off), or
// their distance-table rows from it (w.table_rows), for the score tile and
// the flushed tiles' test.
HWY_INLINE void BlockRowBias(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                             AttentionWork& w) {
  if (p.bias == FusedBias::kAlibi) {  // the score tile's ALiBi (QKRows or QKSoftmaxTile)
    for (std::int64_t rr = 0; rr < t.br; ++rr) {
      const std::int64_t qpos = TaskPosition(t, t.r0 + rr);
      w.alibi_off[rr] = static_cast<float>(AlibiAnchor(qpos, true) - c0);  // exact: |.| < 2^24
    }
  } else if (p.bias == FusedBias::kTable) {  // QKSoftmaxTile's table (one query head here)
    for (std::int64_t rr = 0; rr < t.br; ++rr) {
      const std::int64_t qpos = TaskPosition(t, t.r0 + rr);
      w.table_rows[static_cast<std::size_t>(rr)] =
          w.lim[static_cast<std::size_t>(rr)] > 0
              ? p.rtable + t.hh * p.rtable_stride + table_index(p, c0 - qpos)
              : nullptr;
    }
  }
}

// Where key block kb lies in the head's shared packing (w.pack): its K^T
// [d][bkp] and its V rows [bk][dp] (the packing's V, even where the task
// reads V in place and it is not filled).
struct HeadPackPlace {
  float* kt;
  float* v;
};
HWY_INLINE HeadPackPlace HeadPackBlock(const AttentionParams& p, const AttentionBlocking& bl,
                                       std::int64_t kb, AttentionWork& w) {
  return {w.pack.kt.get() + kb * p.d * bl.bkp, w.pack.v.get() + kb * bl.bk * bl.dp};
}

// Blocked: K^T and V of key block kb, from the head's shared packing or
// packed here for this block.
KeyBlockOperands PackedKeyBlock(const AttentionParams& p, const AttentionBlocking& bl,
                                const AttentionTask& t, std::int64_t kb, std::int64_t max_lim,
                                std::int64_t cols, AttentionWork& w) {
  const std::int64_t dp = bl.dp;
  const std::int64_t c0 = kb * bl.bk;
  float* kt = w.kt.get();
  float* vp = w.v.get();
  std::int64_t ld = cols;
  std::int64_t keys = max_lim;
  if (t.use_pack) {
    ld = bl.bkp;
    keys = std::min(bl.bk, t.sq.j - c0);
    const HeadPackPlace place = HeadPackBlock(p, bl, kb, w);
    kt = place.kt;
    vp = place.v;
  }
  if (t.v_in_place) vp = nullptr;
  if (!t.use_pack || !w.pack.ready[static_cast<std::size_t>(kb)]) {
    PackKeyBlock(p, t, dp, c0, keys, ld, kt, vp, w.row.get());
    if (t.use_pack) w.pack.ready[static_cast<std::size_t>(kb)] = 1;
  }
  if (t.v_in_place) {
    const std::int64_t at = t.v_base + c0 * p.v_stride[2];
    return {kt, ld, nullptr,
            static_cast<const char*>(p.v) + static_cast<std::size_t>(at) * dtype_size(p.kv_dtype),
            p.v_stride[2]};
  }
  return {kt, ld, vp};
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_PACK_INL_H_ toggle
