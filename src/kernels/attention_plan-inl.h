// Internal, per instruction set: the plan of a fused forward call
// (attention_fused.cc) -- its blocking (block sizes, query heads per task,
// the key split), the list of its tasks, and how the threads share them
// (whole kv heads first, then whatever is left, a task at a time).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_PLAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_PLAN_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_PLAN_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_PLAN_INL_H_
#endif

#include <hwy/highway.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_fused.h"  // flushed_skips_enabled
#include "kernels/attention_params.h"
#include "kernels/attention_task-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {

// The most bytes one pass over a decode block may read when the task
// holds several kv heads side by side (PlanBlocking cuts its key block to
// fit): half of this machine's L2 a core (sysconf; 256 KiB where it is not
// known), within [128 KiB, 1 MiB]. Measured with the bench's paged decode
// (8 kv heads a task, float32, d = 128): on a Zen 3 (512 KiB of L2) 64 keys
// a block took 0.83x the time of 256; on a Zen 5 (1 MiB) 128 keys took
// 0.98-1.02x the time of 64 on two threads and 0.93x on one, the slab
// layout 0.97x (docs/performance-notes.md, twenty-sixth round).
HWY_INLINE std::int64_t DecPassBytes() {
  static const std::int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? std::clamp<std::int64_t>(l2 / 2, 128 << 10, 1 << 20) : std::int64_t{256 << 10};
  }();
  return bytes;
}
// The fewest keys of such a block: whole groups of the score pass's keys
// (a vector of lanes) on every target.
constexpr std::int64_t kDecMinKeys = 16;

// The blocking of a call: query and key blocks (block_q, block_k, cut to
// the call's sizes), the query heads a decode task holds (hg), the key
// split (splits; 0 picks one: enough tasks for every thread), and whether
// a thread keeps a kv head's packed keys for its next task (pack_heads).
// base_tasks_hg1: the call's tasks with one query head each.
AttentionBlocking PlanBlocking(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k,
                               std::int64_t splits, std::int64_t base_tasks_hg1, int threads) {
  const DF df;
  AttentionBlocking bl;
  bl.dp = AttnRoundUp(df, p.d);
  bl.bq = std::min(block_q, p.i);
  bl.nqb = (p.i + bl.bq - 1) / bl.bq;
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
    // kv heads side by side within a key position (a paged cache, [blocks,
    // block_size, hk, d]): a task takes several whole kv heads, so that it
    // reads a position's heads together (contiguous bytes) instead of one
    // row per hk * d elements, a TLB miss per row (0.29 of contiguous; in
    // huge pages, a task a kv head still took 1.52-1.57x the time on a
    // Zen 5, docs/performance-notes.md, twenty-sixth round).
    if (bl.hg == group && p.k_stride[1] < p.k_stride[2] && p.v_stride[1] < p.v_stride[2] &&
        p.k_stride[3] == 1 && p.v_stride[3] == 1 && p.key_mask == nullptr) {
      for (std::int64_t m = p.hk; m > 1; --m) {
        if (p.hk % m == 0 && m * group * bl.bq <= kMaxGroupRows) {
          bl.hg = m * group;
          break;
        }
      }
    }
  }
  // A decode task over several kv heads side by side (a paged cache, or
  // slabs [b, len, hk, d]) walks each pass over the block kv head by kv
  // head: its key block is cut so that one pass's rows of all its heads
  // stay within DecPassBytes(). With 256 keys of 8 heads (1 MiB of float32
  // K, as much V) the bench's paged decode ran at 0.71 of its dense calls;
  // 64 keys took 0.83 of that time (Zen 3). Probably the lines of the
  // neighbouring heads that the hardware fetches along with each row now
  // stay in L2 until their head's walk comes to them.
  if (bl.bq <= kDirectRows && bl.hg > group) {
    const std::int64_t row_bytes =
        bl.hg / group * p.d * static_cast<std::int64_t>(dtype_size(p.kv_dtype));
    const std::int64_t fit = DecPassBytes() / std::max<std::int64_t>(row_bytes, 1);
    block_k =
        std::min(block_k, std::max<std::int64_t>(kDecMinKeys, fit / kDecMinKeys * kDecMinKeys));
  }
  bl.bk = std::max<std::int64_t>(1, std::min(block_k, p.j));
  bl.bkp = AttnRoundUp(df, bl.bk);
  bl.nkb = (p.j + bl.bk - 1) / bl.bk;
  const std::int64_t base_tasks = base_tasks_hg1 / bl.hg;
  if (splits <= 0) {
    splits = 1;
    if (base_tasks < threads && bl.nkb >= 2) {
      splits = std::min<std::int64_t>(bl.nkb, (2 * threads + base_tasks - 1) / base_tasks);
    }
  }
  bl.splits =
      std::min<std::int64_t>(std::max<std::int64_t>(splits, 1), std::max<std::int64_t>(bl.nkb, 1));
  // Shared when a thread may run more than one task of a kv head: several
  // query blocks or key splits, or several query heads on one kv head
  // (grouped-query prefill: consecutive tasks are the group's heads).
  bl.pack_heads = bl.nqb * bl.splits * (group / bl.hg) > 1 &&
                  4.0 * static_cast<double>(bl.nkb) * static_cast<double>(bl.bkp) *
                          static_cast<double>(p.d + bl.dp) <=
                      kMaxPackBytes;
  bl.skip_flushed = flushed_skips_enabled();
  return bl;
}

// One unit of work before the key split: a sequence, a group of hg query
// heads (slot), a query block; and its key blocks.
struct AttentionTaskRef {
  std::int64_t s = 0, slot = 0, qb = 0;
  BlockRange kbs;
  double cost = 0.0;
};

// The key blocks that rows [r0, r0 + br) of sequence sq visit: from the
// first row's first visible key to the last row's last (visible ranges
// only move forwards with the position), so blocks outside a causal or
// window band are never touched.
BlockRange TaskKeyBlocks(const AttentionParams& p, const Sequence& sq, std::int64_t r0,
                         std::int64_t br, std::int64_t bk) {
  const KeyRange first = visible_keys(p, sq.j, sq.q_offset + r0);
  const KeyRange last = visible_keys(p, sq.j, sq.q_offset + r0 + br - 1);
  if (last.end <= first.begin) return {0, 0};
  return {first.begin / bk, (last.end + bk - 1) / bk};
}

// Every task of the call. Within a sequence: head-major, the largest
// (last) query blocks of a head first, so a thread's consecutive tasks share
// the head's packed keys. With ALiBi the query heads of a kv head go in
// order of their slopes' size, the shallowest first: it computes (and so
// packs) the most key blocks, and the steeper heads that skip a block as
// flushed then take its key norms from that packing instead of reading
// the rows again (attention_skip-inl.h). Ragged calls (varlen, KV cache): sequences by
// their work, most first, so the long ones start at once and the short ones
// fill in (no barrier per sequence); a sequence without rows has no task.
// (Sorting the tasks themselves longest first interleaved the heads of a
// sequence, so every task packed its keys again.)
std::vector<AttentionTaskRef> ListTasks(const AttentionParams& p, const AttentionBlocking& bl) {
  std::vector<AttentionTaskRef> list;
  std::vector<double> work(static_cast<std::size_t>(p.b), 0.0);  // per sequence
  const std::int64_t slots = p.h / bl.hg;
  const std::int64_t group = p.h / p.hk;
  std::vector<std::int64_t> order(static_cast<std::size_t>(slots));
  for (std::int64_t s = 0; s < p.b; ++s) {
    const Sequence sq = sequence(p, s);
    const std::int64_t nqb = (sq.i + bl.bq - 1) / bl.bq;
    std::iota(order.begin(), order.end(), std::int64_t{0});
    if (bl.hg == 1 && group > 1 && bl.pack_heads && p.bias == FusedBias::kAlibi) {
      for (std::int64_t g = 0; g < slots; g += group) {
        std::stable_sort(order.begin() + g, order.begin() + g + group,
                         [&](std::int64_t x, std::int64_t y) {
                           return std::abs(slope_of(p, s, x)) < std::abs(slope_of(p, s, y));
                         });
      }
    }
    for (const std::int64_t slot : order) {
      for (std::int64_t q = 0; q < nqb; ++q) {
        AttentionTaskRef t;
        t.s = s;
        t.slot = slot;
        t.qb = nqb - 1 - q;
        const std::int64_t r0 = t.qb * bl.bq;
        const std::int64_t br = std::min(bl.bq, sq.i - r0);
        t.kbs = TaskKeyBlocks(p, sq, r0, br, bl.bk);
        t.cost = static_cast<double>(br) * static_cast<double>(t.kbs.end - t.kbs.begin + 1);
        work[static_cast<std::size_t>(s)] += t.cost;
        list.push_back(t);
      }
    }
  }
  if (p.cu_q != nullptr || p.seqlen_k != nullptr) {
    std::stable_sort(
        list.begin(), list.end(), [&work](const AttentionTaskRef& a, const AttentionTaskRef& b) {
          return work[static_cast<std::size_t>(a.s)] > work[static_cast<std::size_t>(b.s)];
        });
  }
  return list;
}

// Where each thread should take whole kv heads: the first task of each run
// of a kv head's tasks (of one sequence) in the list, and the end (empty:
// take tasks one by one in list order). Each thread packs the keys of the
// kv head it works on (the packing is per thread); taking the tasks in list
// order, two threads shared a kv head and both packed it, every head twice
// (the packing was 5.5% of a causal prefill's samples on a Zen 5, 3.75%
// with whole heads). Only where the runs are enough for each thread to have
// one.
std::vector<std::int64_t> KvHeadRuns(const AttentionParams& p, const AttentionBlocking& bl,
                                     const std::vector<AttentionTaskRef>& list, int threads) {
  std::vector<std::int64_t> starts;
  if (threads < 2 || !bl.pack_heads || bl.bq <= kDirectRows) return starts;
  const std::int64_t group = p.h / p.hk;  // bl.hg is 1 here: a slot is a query head
  for (std::size_t x = 0; x < list.size(); ++x) {
    if (x == 0 || list[x].s != list[x - 1].s || list[x].slot / group != list[x - 1].slot / group) {
      starts.push_back(static_cast<std::int64_t>(x) * bl.splits);
    }
  }
  if (starts.size() < static_cast<std::size_t>(threads)) return {};
  starts.push_back(static_cast<std::int64_t>(list.size()) * bl.splits);
  return starts;
}

// Runs every task once over the team, in runs [starts[u], starts[u + 1]):
// thread tid takes the tasks of runs tid, tid + nt, ... in order, then
// helps with whatever is left of the others' (a task at a time; the claims
// are atomic).
template <typename F>
void ForOwnRunsFirst(const std::vector<std::int64_t>& starts,
                     std::vector<std::atomic<std::int64_t>>& claimed, int tid, int nt, const F& f) {
  const std::size_t runs = claimed.size();
  const auto drain = [&](std::size_t u) {
    const std::int64_t len = starts[u + 1] - starts[u];
    for (std::int64_t n; (n = claimed[u].fetch_add(1, std::memory_order_relaxed)) < len;) {
      f(starts[u] + n);
    }
  };
  for (std::size_t u = static_cast<std::size_t>(tid); u < runs; u += static_cast<std::size_t>(nt)) {
    drain(u);
  }
  for (std::size_t u = 0; u < runs; ++u) drain(u);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_PLAN_INL_H_ toggle
