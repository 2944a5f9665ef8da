// Internal: one description of an attention call, read by the forward
// (attention_fused.cc) and the backward (attention_backward.cc) kernels, and
// the visible key ranges and block walks both derive from it. Filled once by
// src/attention.cc from the public arguments after their checks. Not
// installed; the contract lives in include/posbias/attention.h.
//
// A new masking rule (a window, a key mask) belongs in visible_keys() and
// in the bias-and-mask step (BiasMaskMax in attention_blocks-inl.h); a new
// bias in FusedBias, RowBiasOf and the checks. The block walks below and the
// kernels' loops follow from them.
#ifndef POSBIAS_SRC_KERNELS_ATTENTION_PARAMS_H_
#define POSBIAS_SRC_KERNELS_ATTENTION_PARAMS_H_

#include <algorithm>
#include <cstdint>

#include "posbias/dtype.h"

namespace posbias::detail {

enum class FusedBias : std::uint8_t { kNone, kAlibi, kTable, kDense };

// Everything is checked by the caller. Strides are in elements.
struct AttentionParams {
  DType dtype = DType::kFloat32;  // of q, k, v and of every tensor output
  const void* q = nullptr;        // [b, h, i, d]
  const void* k = nullptr;        // [b, hk, j, d]
  const void* v = nullptr;        // [b, hk, j, d]
  std::int64_t q_stride[4] = {};
  std::int64_t k_stride[4] = {};
  std::int64_t v_stride[4] = {};
  std::int64_t b = 0, h = 0, hk = 0, i = 0, j = 0, d = 0;
  float scale = 1.0f;
  bool causal = false;
  // Position of query row 0 minus that of key 0: row r sits at position
  // q_offset + r (j - i for the library's bottom-right convention).
  std::int64_t q_offset = 0;

  FusedBias bias = FusedBias::kNone;
  const float* slopes = nullptr;  // kAlibi: [h]
  // kTable: per head, 2j - 1 contiguous floats in *increasing key* order,
  // padded by at least 16 floats: entry (c - qpos) + (j - 1) is the bias of
  // the query at position qpos and key c (the user's table reversed once,
  // so that a row's window is read forwards).
  const float* rtable = nullptr;
  std::int64_t rtable_stride = 0;     // between heads
  const float* dense = nullptr;       // kDense: element [b, h, r, c] at the strides
  std::int64_t dense_stride[4] = {};  // 0 along broadcast dimensions

  // Forward outputs.
  void* out = nullptr;  // contiguous [b, h, i, d] of dtype
  // Optional: the natural log of each row's softmax denominator, including
  // its max (the true scores, also for ALiBi rows before the first key);
  // -inf for a row without a finite score. Contiguous [b, h, i].
  float* lse = nullptr;

  // Backward inputs: the forward's output and lse, and the output gradient.
  const void* saved_out = nullptr;  // [b, h, i, d] at saved_out_stride
  std::int64_t saved_out_stride[4] = {};
  const float* saved_lse = nullptr;  // [b, h, i] at saved_lse_stride
  std::int64_t saved_lse_stride[3] = {};
  const void* dout = nullptr;  // [b, h, i, d] at dout_stride
  std::int64_t dout_stride[4] = {};
  // Backward outputs: dq [b, h, i, d], dk and dv [b, hk, j, d], contiguous,
  // dtype; the bias gradients float32, each optional (null: not wanted).
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dtable = nullptr;   // kTable: [h, 2j - 1] contiguous (table order)
  float* dslopes = nullptr;  // kAlibi: [h]
  float* ddense = nullptr;   // kDense: [b, h, i, j] contiguous
};

// The position of query row r.
inline std::int64_t query_position(const AttentionParams& p, std::int64_t r) {
  return p.q_offset + r;
}

// Index in a reversed distance table (AttentionParams::rtable) of the
// signed distance rel = key - query position.
inline std::int64_t table_index(const AttentionParams& p, std::int64_t rel) {
  return rel + p.j - 1;
}

// Keys [begin, end) that one query position may see; empty when end <= begin.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
};

// The one place that says which keys a query sees (today: all of them, or
// those at or before its position when causal).
inline KeyRange visible_keys(const AttentionParams& p, std::int64_t qpos) {
  KeyRange range{0, p.j};
  if (p.causal) range.end = std::clamp<std::int64_t>(qpos + 1, 0, p.j);
  return range;
}

// Visible keys of a row among the bc keys of the block starting at key c0,
// as a count from c0 (the row sees keys [c0, c0 + count) of the block).
inline std::int64_t visible_in_block(const AttentionParams& p, std::int64_t qpos, std::int64_t c0,
                                     std::int64_t bc) {
  return std::clamp<std::int64_t>(visible_keys(p, qpos).end - c0, 0, bc);
}

// The block walks. Forward: the key blocks [begin, end) (of bk keys, nkb in
// all) that the query rows [r0, r0 + br) visit. Visible ranges only grow
// with the position, so the last row bounds the block.
struct BlockRange {
  std::int64_t begin = 0, end = 0;
};

inline BlockRange key_blocks_of_rows(const AttentionParams& p, std::int64_t r0, std::int64_t br,
                                     std::int64_t bk, std::int64_t nkb) {
  const KeyRange last = visible_keys(p, query_position(p, r0 + br - 1));
  if (last.end <= 0) return {0, 0};
  return {0, std::min(nkb, (last.end + bk - 1) / bk)};
}

// Backward: the first query row that sees a key at or after c0 (the rows
// [first, i) meet the key block starting at c0; i when none does).
inline std::int64_t first_row_meeting_keys(const AttentionParams& p, std::int64_t c0) {
  if (!p.causal) return 0;
  // Row r sees key c0 once q_offset + r >= c0.
  return std::clamp<std::int64_t>(c0 - p.q_offset, 0, p.i);
}

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_PARAMS_H_
