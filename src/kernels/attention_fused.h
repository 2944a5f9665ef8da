// Internal: the fused attention kernel (FlashAttention-2 style online
// softmax over query blocks x key blocks). Not installed; the contract and
// argument checks live in include/posbias/attention.h and src/attention.cc.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/attention_params.h"

namespace posbias::detail {

// The whole forward: reads q, k, v and the bias of p, writes p.out (and
// p.lse when not null). Threaded with OpenMP (best instruction set of this
// CPU).
void fused_attention(const AttentionParams& p);

// Same with explicit block sizes and key split (for tests: small blocks
// exercise every boundary on small shapes). block_q and block_k >= 1;
// splits >= 1 (0 = choose from the thread count).
void fused_attention_blocked(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k,
                             std::int64_t splits);

// Whether the flushed skips (the forward's tiles, the backward's blocks)
// are on: unless POSBIAS_FLUSHED_TILES=0 in the environment, read at each
// call (the tests and the bench turn them off to compare).
inline bool flushed_skips_enabled() {
  const char* skip = std::getenv("POSBIAS_FLUSHED_TILES");
  return skip == nullptr || std::string_view(skip) != "0";
}

// Tiles of query rows that skipped a key block of which they see some key,
// every p exactly 0 (attention_skip-inl.h), counted over the process's
// calls: the results are the same bits either way, so this is how the
// tests see the skip.
std::int64_t flushed_tiles_skipped();
void count_flushed_tiles(std::int64_t tiles);

// Key blocks (of a sequence, every kv head) whose key norms and value
// finiteness were measured from whole key positions before a call's tasks
// (FillBlockNorms, attention_skip-inl.h), counted over the process's calls.
std::int64_t block_norms_measured();
void count_block_norms(std::int64_t blocks);

// The kernels' exp (attention_exp-inl.h) over n values x, into out (for
// tests; best instruction set, or the one SetSupportedTargetsForTest left).
//   kUnclamped:   ExpUnclamped, for x <= 88 or NaN (0 below -40).
//   kFlushed:     ExpFlushed (0 below -40 and for NaN; x above 88 as 88).
//   kSafe:        SafeExp (ExpFlushed, but NaN stays NaN).
//   kSoftcapTanh: SoftcapTanh, the soft-cap's tanh built on SafeExp.
enum class SoftmaxExpKind : std::uint8_t { kUnclamped, kFlushed, kSafe, kSoftcapTanh };
void softmax_exp(SoftmaxExpKind kind, const float* x, float* out, std::int64_t n);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_FUSED_H_
