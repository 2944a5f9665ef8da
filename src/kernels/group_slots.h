// Internal: the grouped-query backward's per-query-head dK and dV partials
// (attention_backward.cc), summed in head order as their tasks end. Not
// installed.
//
// With G query heads on a kv head, each query head's task accumulates its
// own partial dK, dV over the sequence's keys, and the kv head's gradient
// is their sum in head order, ((0 + g0) + g1) + ... + g(G-1), in float32:
// the same additions whatever the thread count and whichever task ends
// first, so the result does not depend on either. A partial lives in a
// slot from its task's start until it has been added; the group's sum
// accumulates in head 0's slot. Slots are reused (the last freed first),
// so a call touches the pages of the partials open at once, about
// (threads + 1) x G of them, rather than one [tokens, dp] pair per query
// head: fresh pages for every head's partial cost a call at h 32 on 8 kv
// heads 7% of its time in page faults (docs/performance-notes.md,
// forty-fifth round).
#ifndef POSBIAS_SRC_KERNELS_GROUP_SLOTS_H_
#define POSBIAS_SRC_KERNELS_GROUP_SLOTS_H_

#include <hwy/aligned_allocator.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/scratch.h"

namespace posbias::detail {

class GroupSlots {
 public:
  // `groups` sums of `group` partials each, slot_floats floats a slot,
  // allocated from `from` (malloc by default; tests pass one that fails).
  GroupSlots(std::int64_t groups, std::int64_t group, std::int64_t slot_floats,
             const ScratchAllocator& from = {})
      : group_(group),
        slot_floats_(slot_floats),
        from_(from),
        next_(static_cast<std::size_t>(groups), 0),
        busy_(static_cast<std::size_t>(groups), 0),
        done_(static_cast<std::size_t>(groups * group), nullptr) {
    // Never more slots than partials: no reallocation inside the tasks.
    owned_.reserve(done_.size());
    free_.reserve(done_.size());
  }

  // A slot (uninitialised): a freed one, or a new one. Thread-safe; throws
  // allocation_error when a new one cannot be had.
  float* Acquire() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      float* slot = free_.back();
      free_.pop_back();
      return slot;
    }
    owned_.push_back(allocate_scratch<float>(slot_floats_,
                                             "the attention backward's per-head dK and dV", from_));
    return owned_.back().get();
  }

  // Head g of group gi has its partial in `slot`. Adds every partial of the
  // group that is ready, in head order: add(acc, x, k) adds head k's
  // partial x into the sum acc (head 0's slot; k >= 1, and the call with k
  // = group - 1 is the last of the group). One thread at a time sums a
  // group, outside the lock; a partial that ends while it does is taken
  // by that thread. Thread-safe.
  template <typename Add>
  void Finish(std::int64_t gi, std::int64_t g, float* slot, const Add& add) {
    const auto at = [&](std::int64_t k) -> float*& {
      return done_[static_cast<std::size_t>(gi * group_ + k)];
    };
    std::unique_lock<std::mutex> lock(mutex_);
    at(g) = slot;
    std::int64_t& next = next_[static_cast<std::size_t>(gi)];
    char& busy = busy_[static_cast<std::size_t>(gi)];
    if (busy != 0) return;  // the thread summing the group will take it
    busy = 1;
    while (next < group_ && at(next) != nullptr) {
      const std::int64_t k = next;
      if (k > 0) {
        lock.unlock();
        add(at(0), at(k), k);
        lock.lock();
        free_.push_back(at(k));
      }
      ++next;
    }
    if (next == group_) free_.push_back(at(0));
    busy = 0;
  }

 private:
  const std::int64_t group_;
  const std::int64_t slot_floats_;
  const ScratchAllocator from_;
  std::mutex mutex_;
  std::vector<hwy::AlignedFreeUniquePtr<float[]>> owned_;
  std::vector<float*> free_;
  std::vector<std::int64_t> next_;  // per group: the next head to add
  std::vector<char> busy_;          // per group: a thread is adding
  std::vector<float*> done_;        // per (group, head): its slot once ended
};

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_GROUP_SLOTS_H_
