// Internal: the kernels' working memory and the errors of their threads. Not
// installed.
//
// Every scratch buffer of a kernel is sized by the caller's checked shapes,
// and may still fail to allocate (an address-space limit, memory taken by
// other processes). hwy::AllocateAligned returns null then and std::vector
// throws std::bad_alloc; both become detail::allocation_error (a
// std::length_error naming the bytes and the buffer) here, so that no null
// pointer is ever used. Inside an OpenMP parallel region an exception must
// not leave the region (std::terminate): ThreadErrors keeps the first one
// and the caller rethrows it after the region.
#ifndef POSBIAS_SRC_KERNELS_SCRATCH_H_
#define POSBIAS_SRC_KERNELS_SCRATCH_H_

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "checks.h"

namespace posbias::detail {

// Where a kernel's aligned scratch comes from: null means malloc. Tests pass
// an allocator that fails, to reach the failure paths deterministically.
struct ScratchAllocator {
  hwy::AllocPtr alloc = nullptr;
  void* opaque = nullptr;
};

// `count` elements of T (at least one is allocated), vector-aligned and
// uninitialised. Throws allocation_error(bytes, what) when the allocation
// fails or its byte size overflows.
template <typename T>
hwy::AlignedFreeUniquePtr<T[]> allocate_scratch(std::int64_t count, const char* what,
                                                const ScratchAllocator& from = {}) {
  const std::size_t n = static_cast<std::size_t>(std::max<std::int64_t>(count, 1));
  if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
    throw allocation_error(std::numeric_limits<std::size_t>::max(), what);
  }
  hwy::AlignedFreeUniquePtr<T[]> p = hwy::AllocateAligned<T>(n, from.alloc, nullptr, from.opaque);
  if (!p) throw allocation_error(n * sizeof(T), what);
  return p;
}

// v resized to `count` elements (new ones `value`); std::bad_alloc becomes
// allocation_error(bytes, what).
template <typename T>
void resize_scratch(std::vector<T>& v, std::int64_t count, const char* what, T value = T()) {
  const std::size_t n = static_cast<std::size_t>(std::max<std::int64_t>(count, 0));
  try {
    v.resize(n, value);
  } catch (const std::bad_alloc&) {
    throw allocation_error(n * sizeof(T), what);
  } catch (const std::length_error&) {
    throw allocation_error(n * sizeof(T), what);
  }
}

// The first exception thrown by any thread of a parallel region. Use:
//
//   ThreadErrors errors;
//   #pragma omp parallel
//   errors.run([&] { ... });   // or test errors.failed() to skip work
//   errors.rethrow();          // after the region, on the calling thread
class ThreadErrors {
 public:
  template <typename Fn>
  void run(Fn&& fn) noexcept {
    try {
      fn();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
  std::atomic<bool> failed_{false};
};

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_SCRATCH_H_
