// GroupSlots (src/kernels/group_slots.h), the grouped-query backward's
// per-head partials: each group's sum is ((0 + g0) + g1) + ... in head order
// whatever order the heads end in and on whichever thread, summed once, and
// freed slots are reused. The threaded test is also one of the concurrency
// tests that ThreadSanitizer runs (posbias_concurrency_tests).
#include "kernels/group_slots.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace posbias::detail {
namespace {

// Head k's partial of group gi: values whose float32 sum depends on the
// order of the additions (1e8 - 1e8 + 1 is 1 in head order, 0 if the 1
// came second).
float partial(std::int64_t gi, std::int64_t k, std::int64_t e) {
  const float big = 1e8f * static_cast<float>(1 + (gi + e) % 3);
  if (k == 0) return big;
  if (k == 1) return -big;
  return 1.0f + 0.25f * static_cast<float>(k + e % 2);
}

// The sum in head order, as the backward defines it.
float in_order(std::int64_t gi, std::int64_t group, std::int64_t e) {
  float acc = 0.0f;
  for (std::int64_t k = 0; k < group; ++k) acc += partial(gi, k, e);
  return acc;
}

constexpr std::int64_t kFloats = 8;

// acc += x as the backward does (acc = (0 + acc) + x for k == 1); records
// the group's result once its last head is in.
struct Summer {
  std::int64_t group;
  std::vector<std::vector<float>>* results;  // per group
  std::vector<int>* finished;                // per group: how many times the last head came
  std::int64_t gi;
  void operator()(float* acc, const float* x, std::int64_t k) const {
    for (std::int64_t e = 0; e < kFloats; ++e) {
      acc[e] = (k == 1 ? 0.0f + acc[e] : acc[e]) + x[e];
    }
    if (k == group - 1) {
      (*results)[static_cast<std::size_t>(gi)].assign(acc, acc + kFloats);
      ++(*finished)[static_cast<std::size_t>(gi)];
    }
  }
};

void fill(float* slot, std::int64_t gi, std::int64_t k) {
  for (std::int64_t e = 0; e < kFloats; ++e) slot[e] = partial(gi, k, e);
}

void expect_sums(const std::vector<std::vector<float>>& results, const std::vector<int>& finished,
                 std::int64_t group) {
  for (std::size_t gi = 0; gi < results.size(); ++gi) {
    SCOPED_TRACE("group " + std::to_string(gi));
    ASSERT_EQ(finished[gi], 1);
    ASSERT_EQ(results[gi].size(), static_cast<std::size_t>(kFloats));
    for (std::int64_t e = 0; e < kFloats; ++e) {
      const float want = in_order(static_cast<std::int64_t>(gi), group, e);
      EXPECT_EQ(std::memcmp(&results[gi][static_cast<std::size_t>(e)], &want, sizeof(float)), 0)
          << "element " << e << ": " << results[gi][static_cast<std::size_t>(e)] << " against "
          << want;
    }
  }
}

TEST(GroupSlots, SumsInHeadOrderWhicheverHeadEndsFirst) {
  constexpr std::int64_t kGroup = 4;
  std::vector<std::int64_t> order = {0, 1, 2, 3};
  std::vector<std::vector<std::int64_t>> orders;
  do {
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  const auto groups = static_cast<std::int64_t>(orders.size());
  GroupSlots slots(groups, kGroup, kFloats);
  std::vector<std::vector<float>> results(orders.size());
  std::vector<int> finished(orders.size(), 0);
  std::set<float*> distinct;
  for (std::int64_t gi = 0; gi < groups; ++gi) {
    std::vector<float*> held(kGroup);
    for (std::int64_t k = 0; k < kGroup; ++k) {
      held[static_cast<std::size_t>(k)] = slots.Acquire();
      distinct.insert(held[static_cast<std::size_t>(k)]);
      fill(held[static_cast<std::size_t>(k)], gi, k);
    }
    for (const std::int64_t k : orders[static_cast<std::size_t>(gi)]) {
      slots.Finish(gi, k, held[static_cast<std::size_t>(k)],
                   Summer{kGroup, &results, &finished, gi});
    }
  }
  expect_sums(results, finished, kGroup);
  // Every group's slots came back before the next group took its own.
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kGroup));
}

TEST(GroupSlots, AGroupOfOneSlotTwoHeads) {
  // Two heads (the smallest group): the first addition is also the last.
  GroupSlots slots(1, 2, kFloats);
  std::vector<std::vector<float>> results(1);
  std::vector<int> finished(1, 0);
  float* a = slots.Acquire();
  float* b = slots.Acquire();
  fill(a, 0, 0);
  fill(b, 0, 1);
  slots.Finish(0, 1, b, Summer{2, &results, &finished, 0});
  EXPECT_EQ(finished[0], 0);
  slots.Finish(0, 0, a, Summer{2, &results, &finished, 0});
  expect_sums(results, finished, 2);
}

TEST(GroupSlots, ASlotThatCannotBeHadThrowsWithItsSize) {
  // The backward calls Acquire inside its tasks, whose exceptions its
  // ThreadErrors carries out of the parallel region.
  ScratchAllocator fails;
  fails.alloc = [](void*, std::size_t) -> void* { return nullptr; };
  GroupSlots slots(1, 2, 1000, fails);
  try {
    slots.Acquire();
    FAIL() << "no exception";
  } catch (const std::length_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the attention backward's per-head dK and dV"), std::string::npos) << what;
    EXPECT_NE(what.find("4000 bytes"), std::string::npos) << what;
  }
}

TEST(GroupSlots, ManyThreadsSumEachGroupOnceInHeadOrder) {
  // Tasks handed out in order (group-major) to 8 threads that take a
  // random while over each, as the backward's dynamic schedule does.
  constexpr std::int64_t kGroup = 4, kGroups = 96;
  constexpr int kThreads = 8;
  GroupSlots slots(kGroups, kGroup, kFloats);
  std::vector<std::vector<float>> results(kGroups);
  std::vector<int> finished(kGroups, 0);
  std::atomic<std::int64_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(t + 1));
      std::uniform_int_distribution<int> spin(0, 20000);
      for (std::int64_t task = next++; task < kGroups * kGroup; task = next++) {
        const std::int64_t gi = task / kGroup, k = task % kGroup;
        float* slot = slots.Acquire();
        fill(slot, gi, k);
        volatile float sink = 0.0f;
        for (int x = spin(rng); x > 0; --x) sink = sink + 1.0f;
        slots.Finish(gi, k, slot, Summer{kGroup, &results, &finished, gi});
      }
    });
  }
  for (std::thread& th : threads) th.join();
  expect_sums(results, finished, kGroup);
}

}  // namespace
}  // namespace posbias::detail
