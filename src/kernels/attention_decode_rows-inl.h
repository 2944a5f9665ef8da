// Internal, per instruction set: where the direct (decode) path reads a key
// block's K and V rows (attention_decode-inl.h): each row's element offset,
// one page run after another in a paged cache (a page's base computed once),
// and the rows a pass prefetches ahead of the one it reads, as far and into
// the cache that kernels/decode_prefetch.h chose for this CPU (the
// hardware's prefetchers start again at every page).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_task-inl.h"
#include "kernels/decode_prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of a float vector (compile time: x86 vectors have a fixed size).
constexpr std::size_t kDecLanes = hn::MaxLanes(DF());
// Vectors in a row of d = 128, the row of the dense-row score and value
// passes: 8 on AVX-512, 16 on AVX2.
constexpr int kDecVecs128 = static_cast<int>(128 / kDecLanes);

// bfloat16 rows are read in pair order: each whole block of 2N elements
// [2N b, 2N b + 2N) of a row as N 32-bit words, vector 2b its even
// elements (the words' low halves shifted up: one shift) and vector 2b + 1
// its odd ones (the high halves: one AND), where widening N elements at a
// time took a zero-extending load and a shift per vector (two
// instructions per vector, one of them on the shuffle port). The rest of
// the row (d % 2N elements) stays in element order. The score pass reads
// q in the same order (StartTask lays it out with DecPairOrder), and the
// value pass leaves O in it (RunOneTask puts it back).
template <typename T>
constexpr bool kDecPaired = std::is_same_v<T, bfloat16>;

// The vector of a row of d elements (its dtype T) that starts at element x
// (a multiple of N) in the row's read order, as float32.
template <typename T>
HWY_INLINE VF DecLoadVec(DF df, const T* HWY_RESTRICT row, std::int64_t x, std::int64_t d) {
  if constexpr (kDecPaired<T>) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
                  "element 2l of a block is the low half of word l");
    constexpr auto n = static_cast<std::int64_t>(kDecLanes);
    const std::int64_t b = x - x % (2 * n);
    if (b + 2 * n <= d) {
      const hn::RebindToUnsigned<DF> du;
      const auto words = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(row + b));
      return hn::BitCast(
          df, x == b ? hn::ShiftLeft<16>(words) : hn::And(words, hn::Set(du, 0xFFFF0000u)));
    }
  }
  return LoadWide(df, row + x);
}

// Whether task t reads its key rows (its value rows with `values`) in pair
// order: a direct (decode) task whose bfloat16 rows it reads in place
// (DirectBlockT; rows it converts are float32, in element order).
HWY_INLINE bool DecRowsPaired(const AttentionParams& p, const AttentionTask& t, bool values) {
  return t.direct && (values ? t.v_direct : t.k_direct) && p.kv_dtype == DType::kBFloat16;
}

// v (d floats) from element order into the read order of a row of T
// (DecLoadVec; to_pairs), or back (!to_pairs).
template <typename T>
HWY_INLINE void DecPairOrder(float* HWY_RESTRICT v, std::int64_t d, bool to_pairs) {
  if constexpr (kDecPaired<T>) {
    constexpr auto n = static_cast<std::int64_t>(kDecLanes);
    float tmp[2 * n];
    for (std::int64_t b = 0; b + 2 * n <= d; b += 2 * n) {
      std::copy(v + b, v + b + 2 * n, tmp);
      // Element 2l of the block is at l in read order, element 2l + 1 at n + l.
      for (std::int64_t l = 0; l < n; ++l) {
        if (to_pairs) {
          v[b + l] = tmp[2 * l];
          v[b + n + l] = tmp[2 * l + 1];
        } else {
          v[b + 2 * l] = tmp[l];
          v[b + 2 * l + 1] = tmp[n + l];
        }
      }
    }
  } else {
    (void)v;
    (void)d;
    (void)to_pairs;
  }
}

// Software prefetch. The hardware's stream prefetchers follow a stream
// within a 4 KiB page and start again at each new page; a 16-key group of
// float16 rows (d = 128) is one page, so every group began with its loads
// waiting for memory (perf: a third of the score pass's samples on the
// first key of each group). Both passes prefetch the rows about
// decode_prefetch().ahead_bytes ahead of the one they read (at least one
// key, at most kDecMaxAhead keys, attention_task-inl.h), into L1 or L2 as
// this CPU reads fastest (kernels/decode_prefetch.h).

// One line at p, into L2 (PREFETCHT1) or L1 (PREFETCHT0).
template <bool kToL2>
HWY_INLINE void DecPrefetchLineT(const void* p) {
  if constexpr (kToL2) {
#if HWY_ARCH_X86
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
#else
    __builtin_prefetch(p, 0, 2);
#endif
  } else {
    hwy::Prefetch(p);
  }
}

// The same, the cache chosen at run time (a branch the core predicts).
HWY_INLINE void DecPrefetchLine(const void* p, bool to_l2) {
  if (to_l2) {
    DecPrefetchLineT<true>(p);
  } else {
    DecPrefetchLineT<false>(p);
  }
}

// f(std::true_type()) where the prefetches go to L2, else
// f(std::false_type()): for the specialised score tiles, whose unrolled
// bursts of prefetches then carry no branch.
template <class F>
HWY_INLINE auto DecWithPrefetchCache(bool to_l2, const F& f) {
  return to_l2 ? f(std::true_type()) : f(std::false_type());
}

// Every cache line of the row's bytes [row, row + bytes).
HWY_INLINE void DecPrefetchRow(const void* row, std::int64_t bytes, bool to_l2) {
  const char* b = static_cast<const char*>(row);
#pragma GCC unroll 8
  for (std::int64_t x = 0; x < bytes; x += 64) DecPrefetchLine(b + x, to_l2);
}

// The rows [begin, end) of the task that belong to kv head kv (query heads
// kv * group ... of the task's heads [hh, hh + nh)).
struct DecRowRange {
  std::int64_t begin, end;
};

HWY_INLINE DecRowRange DecRowsOfKvHead(const AttentionParams& p, const AttentionTask& t,
                                       std::int64_t kv) {
  const std::int64_t group = p.h / p.hk;
  const std::int64_t h0 = std::max(kv * group, t.hh), h1 = std::min((kv + 1) * group, t.hh + t.nh);
  return {(h0 - t.hh) * t.br, (h1 - t.hh) * t.br};
}

// The task's last kv head (its first is t.kvh).
HWY_INLINE std::int64_t DecLastKvHead(const AttentionParams& p, const AttentionTask& t) {
  return (t.hh + t.nh - 1) / (p.h / p.hk);
}

// Element offsets of the rows of keys [c0, c0 + n + extra) of the task's
// first kv head in k (v with `values`); the extra keys (past the block,
// within the sequence) are only prefetched. A paged cache is walked page
// run by page run (a page's base once, no division per key). A key of the
// block that the key mask hides gets the offset of a key the block attends
// (BlockKeep found one): its score is masked and its weight is never used,
// so nothing depends on what its row holds.
void DecRowOffsets(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                   std::int64_t n, std::int64_t extra, bool values, std::int64_t* at,
                   const AttentionWork& w) {
  const std::int64_t* st = values ? p.v_stride : p.k_stride;
  const std::int64_t all = n + extra;
  if (p.key_layout == KeyLayout::kPaged) {
    const std::int32_t* table = p.block_table + t.bb * p.block_table_stride[0];
    std::int64_t page = c0 / p.block_size, row = c0 % p.block_size;
    for (std::int64_t c = 0; c < all; ++page, row = 0) {
      const std::int64_t base = table[page * p.block_table_stride[1]] * st[0] + t.kvh * st[1];
      const std::int64_t run = std::min(all - c, p.block_size - row);
      for (std::int64_t k = 0; k < run; ++k) at[c + k] = base + (row + k) * st[2];
      c += run;
    }
  } else {
    const std::int64_t base = (values ? t.v_base : t.k_base) + c0 * st[2];
    for (std::int64_t c = 0; c < all; ++c) at[c] = base + c * st[2];
  }
  if (p.key_mask == nullptr) return;
  std::int64_t kept = 0;
  while (kept < n && w.keep[kept] == 0.0f) ++kept;
  for (std::int64_t c = 0; c < n && kept < n; ++c) {
    if (w.keep[c] == 0.0f) at[c] = at[kept];
  }
}

// Where the decode kernels read a block's rows: base + at[c] (+ a kv
// head's offset) is key c's row, in the dtype T.
// ahead > 0: a pass prefetches the row it will read `ahead` rows later
// (at[] holds `avail` entries; the last one stands for those past it).
template <typename T>
struct DecRows {
  const T* base;
  const std::int64_t* at;
  std::int64_t kv_step;  // elements between the rows of two kv heads
  std::int64_t ahead = 0, avail = 0;
  bool to_l2 = false;            // the prefetches go to L2 (decode_prefetch())
  std::int64_t value_group = 8;  // keys per group of the four-row value tile
  bool f32_value_prefetch = false;  // the one-row float32 value pass prefetches

  // The value pass walks one kv head's keys in order: while reading key c
  // of the kv head at b, key c + ahead's row.
  const T* Ahead(const T* b, std::int64_t c) const {
    return b + at[std::min(c + ahead, avail - 1)];
  }

  // The key pass walks groups of n keys, each group kv head by kv head
  // (nkv of them). While it reads the n keys of one place (group, kv
  // head), it prefetches the rows `ahead` steps further in that order: the
  // last n - ahead % n keys of one place and the first ahead % n of the
  // next. A GroupWalk is that first place (the first key of its group,
  // the task's kv head there): it moves on by one place per call, so no
  // call divides.
  struct GroupWalk {
    std::int64_t group, kv;
  };
  GroupWalk StartGroups(std::int64_t n, std::int64_t nkv) const {
    const std::int64_t span = n * nkv;
    return {ahead / span * n, ahead % span / n};
  }
  // The rows to prefetch while reading the walk's next n keys, into
  // pf[0, n).
  void NextInGroups(GroupWalk& g, std::int64_t n, std::int64_t nkv, const T** pf) const {
    const std::int64_t split = n - ahead % n;
    const T* b = base + g.kv * kv_step;
    for (std::int64_t i = 0; i < split; ++i)
      pf[i] = b + at[std::min(g.group + n - split + i, avail - 1)];
    if (++g.kv == nkv) {  // the next place: the group's next kv head, or the next group
      g.kv = 0;
      g.group += n;
    }
    b = base + g.kv * kv_step;
    for (std::int64_t i = split; i < n; ++i)
      pf[i] = b + at[std::min(g.group + i - split, avail - 1)];
  }
};

// Rows that the other pass of a block step reads next (DirectBlockT's
// cross-pass prefetch of rows of d = 128 in a dense cache: float32 rows of
// four query rows a kv head on AVX-512, 16-bit rows of one query row a kv
// head on AVX2 and AVX-512): the score pass prefetches the block's value
// rows, key by key as it reads their key rows, and the value pass the
// next block's key rows, into L2 on every CPU (a pass ahead is 64-128
// KiB, more than an L1). Each pass then finds its own rows in L2, fetched
// a whole pass earlier, and the memory streams at one pace through both
// passes. Against each pass prefetching its own rows a few keys ahead, on
// an Emerald Rapids Xeon: the bench's grouped-query decode took 0.93-0.95x
// the time (fraction_of_read 0.731-0.761 before, 0.796-0.805 after, three
// alternated runs), and 0.92x from memory on one thread
// (posbias-attention-loop, 512 MiB; docs/performance-notes.md,
// thirty-seventh round); the float16 and bfloat16 decodes (float32 q)
// 0.94-0.97x (fraction_of_read 0.83-0.87 before, 0.885-0.905 after, three
// alternated runs), the AVX2 code's 0.91 and 0.94x from memory, and 1.04-1.08x
// in cache over 512 keys, where the task's first block, which prefetches
// its own key rows too, is half of them (thirty-eighth round). Float32
// rows of one query row measured 0.98 and 1.03x (noise) and keep their
// own prefetch. Not measured on AMD.
struct DecCross {
  const char* rows = nullptr;          // key 0's row (null: nothing to prefetch)
  std::int64_t stride = 0, count = 0;  // bytes between rows; rows there (>= 1)
  // Key c's row, the last one standing for those past it.
  const char* Row(std::int64_t c) const { return rows + std::min(c, count - 1) * stride; }
  // Key c's row, c < count.
  const char* RowIn(std::int64_t c) const { return rows + c * stride; }
};
// The rows of T at `rows`, `stride` elements apart, as a DecCross.
template <typename T>
HWY_INLINE DecCross DecCrossOf(const T* rows, std::int64_t stride, std::int64_t count) {
  return {reinterpret_cast<const char*>(rows), stride * static_cast<std::int64_t>(sizeof(T)),
          count};
}

// Rows read in place: the block's and, to prefetch, up to kDecMaxAhead
// more of the sequence's keys; the passes prefetch the row they will read
// about decode_prefetch().ahead_bytes later (at least one row ahead, at most
// kDecMaxAhead - N so that the key pass's target, up to a group of N keys
// further, stays among them).
template <typename T>
DecRows<T> DecRowsInPlace(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                          std::int64_t max_lim, bool values, std::int64_t* at,
                          const AttentionWork& w) {
  const std::int64_t row_bytes = p.d * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t extra = std::clamp<std::int64_t>(t.sq.j - c0 - max_lim, 0, kDecMaxAhead);
  DecRowOffsets(p, t, c0, max_lim, extra, values, at, w);
  DecRows<T> rows{static_cast<const T*>(values ? p.v : p.k), at,
                  (values ? p.v_stride : p.k_stride)[1]};
  const DecodePrefetch& pf = decode_prefetch();
  rows.ahead = std::clamp<std::int64_t>((pf.ahead_bytes + row_bytes - 1) / row_bytes, 1,
                                        kDecMaxAhead - static_cast<std::int64_t>(kDecLanes));
  rows.to_l2 = pf.to_l2;
  rows.value_group = pf.value_group;
  rows.f32_value_prefetch = pf.f32_value_prefetch;
  rows.avail = max_lim + extra;
  return rows;
}

// The block's rows as the kernels read them: in place in their dtype T
// (TRead = T, buf null) when a row's elements are contiguous, with the
// rows about decode_prefetch().ahead_bytes ahead to prefetch (up to the
// sequence's last key); else converted to float32 rows in buf (TRead = float).
template <typename T, typename TRead>
DecRows<TRead> DecBlockRows(const AttentionParams& p, const AttentionTask& t, std::int64_t c0,
                            std::int64_t max_lim, bool values, std::int64_t* at, float* buf,
                            const AttentionWork& w) {
  if constexpr (!std::is_same_v<TRead, float>) {
    (void)buf;
    return DecRowsInPlace<T>(p, t, c0, max_lim, values, at, w);  // 16-bit rows in place
  } else {
    if constexpr (std::is_same_v<T, float>) {
      if (buf == nullptr) return DecRowsInPlace<float>(p, t, c0, max_lim, values, at, w);
    }
    // Converted (one kv head per task here: PlanBlocking groups kv heads
    // only when their rows are contiguous).
    const std::int64_t* st = values ? p.v_stride : p.k_stride;
    DecRowOffsets(p, t, c0, max_lim, 0, values, at, w);
    for (std::int64_t c = 0; c < max_lim; ++c) {
      PackRow(values ? p.v : p.k, p.kv_dtype, at[c], st[3], p.d, 1.0f, buf + c * p.d);
      at[c] = c * p.d;
    }
    return {buf, at, 0};
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_ROWS_INL_H_ toggle
