// Internal, per instruction set: the decode score passes' register
// helpers (attention_decode-inl.h): the transpose-add tree that turns N
// vectors of partial dot products into one vector of N sums, and a vector
// of q held in a register.
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_DECODE_SUMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_SUMS_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_DECODE_SUMS_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_DECODE_SUMS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_decode_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Node i of level L of the transpose-add tree over acc: level 0 is acc[i];
// a node of level L merges nodes 2i + 1 and 2i of level L - 1 into one
// vector of their pairwise sums (even + odd lanes), so the top node's lane
// u is the sum of the lanes of acc[u]. Evaluated depth first, so that few
// partial vectors are live at once: level by level, the 16 accumulators
// of a tile went through the stack (a store and a reload each).
#if HWY_TARGET != HWY_SCALAR
template <int L>
HWY_INLINE VF DecTreeNode(DF df, const VF* acc, std::size_t i) {
  if constexpr (L == 0) {
    (void)df;
    return acc[i];
  } else {
    const VF hi = DecTreeNode<L - 1>(df, acc, 2 * i + 1);
    const VF lo = DecTreeNode<L - 1>(df, acc, 2 * i);
    return hn::Add(hn::ConcatEven(df, hi, lo), hn::ConcatOdd(df, hi, lo));
  }
}
#endif

constexpr int DecLog2(std::size_t n) { return n <= 1 ? 0 : 1 + DecLog2(n / 2); }

#if HWY_TARGET != HWY_SCALAR
// Within each 128-bit block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
HWY_INLINE VF DecPairSums(DF df, VF a, VF b) {
  return hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
}
// Within each 128-bit block, from DecPairSums(a, b) and DecPairSums(c, e):
// the sums of the block's lanes of a, b, c and e.
HWY_INLINE VF DecQuadSums(DF df, VF ab, VF ce) {
  const hn::Repartition<double, DF> dd;
  const auto x = hn::BitCast(dd, ab), y = hn::BitCast(dd, ce);
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, x, y)),
                 hn::BitCast(df, hn::InterleaveUpper(dd, x, y)));
}
#endif

// Lane u of the result: the sum of the lanes of acc[u] (kDecLanes vectors),
// N - 1 merges for N sums. With 4 or 8 lanes the merges stay within the
// 128-bit blocks (an unpack pair and an add each) and 8 lanes cross the
// blocks once at the end (21 instructions for 8 sums); the general tree's
// full-width even/odd merges take two lane-crossing permutes each on AVX2
// (35 instructions, a fifth of a grouped-query score pass's samples on a
// Zen 3).
HWY_INLINE VF DecLaneSums(DF df, const VF* acc) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  return acc[0];
#else
  if constexpr (kDecLanes == 4) {
    return DecQuadSums(df, DecPairSums(df, acc[0], acc[1]), DecPairSums(df, acc[2], acc[3]));
  } else if constexpr (kDecLanes == 8) {
    const VF lo = DecQuadSums(df, DecPairSums(df, acc[0], acc[1]), DecPairSums(df, acc[2], acc[3]));
    const VF hi = DecQuadSums(df, DecPairSums(df, acc[4], acc[5]), DecPairSums(df, acc[6], acc[7]));
    return hn::Add(hn::ConcatLowerLower(df, hi, lo), hn::ConcatUpperUpper(df, hi, lo));
  } else {
    return DecTreeNode<DecLog2(kDecLanes)>(df, acc, 0);
  }
#endif
}

// A vector of q loaded into a register that the compiler keeps there: an
// empty asm needs it in a register, so GCC cannot fold the load into each
// FMA that uses it as a memory operand (one load per use). GCC only:
// clang rejects the operand ("tied indirect register inputs"), and there
// it is a plain load.
HWY_INLINE VF DecLoadHeld(DF df, const float* p) {
  VF v = hn::LoadU(df, p);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_COMPILER_GCC_ACTUAL
  asm("" : "+x"(v.raw));
#endif
  return v;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_DECODE_SUMS_INL_H_ toggle
