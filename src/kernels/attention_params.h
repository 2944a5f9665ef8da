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

// How the keys of a sequence are addressed.
enum class KeyLayout : std::uint8_t {
  kDense,  // key c of sequence s at k + s k_stride[0] + (k_row0_s + c) k_stride[2]
  kPaged,  // key c of s: block block_table[s][c / block_size], row c % block_size
};

// Everything is checked by the caller. Strides are in elements.
//
// A call is b sequences (batch entries). In a dense call every sequence has
// i queries and j keys; in a packed (varlen) call sequence s has the query
// rows [cu_q[s], cu_q[s + 1]) and key rows [cu_k[s], cu_k[s + 1]) of the
// token dimension (dimension 2 of the strides below; dimension 0 has stride
// 0); in a KV-cache call sequence s has seqlen_k[s] keys and the i queries
// at its last positions. i and j are then the longest sequence's (for
// blocking and scratch sizes). sequence() below is the one place that reads
// these.
struct AttentionParams {
  DType dtype = DType::kFloat32;     // of q and of every tensor output
  DType kv_dtype = DType::kFloat32;  // of k and v (16-bit with a float32 q)
  const void* q = nullptr;           // [b, h, i, d]
  const void* k = nullptr;           // [b, hk, j, d], or the paged cache
  const void* v = nullptr;           // [b, hk, j, d], or the paged cache
  // q, out-like tensors: [sequence, head, row, element]. k, v: [sequence,
  // kv head, key, element] (dense), [block, kv head, row in block, element]
  // (paged).
  std::int64_t q_stride[4] = {};
  std::int64_t k_stride[4] = {};
  std::int64_t v_stride[4] = {};
  std::int64_t b = 0, h = 0, hk = 0, i = 0, j = 0, d = 0;
  float scale = 1.0f;
  bool causal = false;
  // Dense calls: position of query row 0 minus that of key 0; row r sits at
  // position q_offset + r (j - i is bottom-right). Ragged calls ignore it
  // (bottom-right per sequence).
  std::int64_t q_offset = 0;
  // Window: key c visible to position qpos iff qpos - window_left <= c <=
  // qpos + window_right; -1: unbounded.
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // Soft-capping: score = softcap * tanh(scale q.k / softcap); 0: off.
  float softcap = 0.0f;
  // Key mask (dense calls): key c of sequence s is visible only if
  // key_mask[s * key_mask_stride[0] + c * key_mask_stride[1]] != 0. Null: none.
  const std::uint8_t* key_mask = nullptr;
  std::int64_t key_mask_stride[2] = {};

  // Ragged batches (null: dense). Offsets into the token dimension.
  const std::int32_t* cu_q = nullptr;      // varlen: b + 1 query offsets
  const std::int32_t* cu_k = nullptr;      // varlen: b + 1 key offsets
  const std::int32_t* seqlen_k = nullptr;  // KV cache: keys of each sequence
  KeyLayout key_layout = KeyLayout::kDense;
  const std::int32_t* block_table = nullptr;  // kPaged: [b, max_blocks]
  std::int64_t block_table_stride[2] = {};
  std::int64_t block_size = 0;

  FusedBias bias = FusedBias::kNone;
  // kAlibi: the slope of sequence s, head x is slopes[s * slopes_seq_stride
  // + x] (slopes_seq_stride 0: one set for every sequence, h: [b, h]).
  const float* slopes = nullptr;
  std::int64_t slopes_seq_stride = 0;
  // kTable: per head, the entries |rel| <= table_centre of the user's table
  // (read at its own centre (n - 1) / 2; zeros past its ends) reversed once
  // (increasing key order, so a row's window is read forwards), with 16
  // floats before and at least 16 after: entry (c - qpos) + table_centre is
  // the bias of the query at position qpos and key c. table_centre is the
  // reach the front copied (every visible distance and every |rel| < j),
  // not necessarily the user's centre.
  const float* rtable = nullptr;
  std::int64_t table_centre = 0;
  std::int64_t rtable_stride = 0;     // between heads
  const float* dense = nullptr;       // kDense: element [b, h, r, c] at the strides
  std::int64_t dense_stride[4] = {};  // 0 along broadcast dimensions

  // Forward outputs.
  void* out = nullptr;  // [b, h, i, d] of dtype at out_stride
  // [sequence, head, row, element] like q: dense {h i d, i d, d, 1}; varlen
  // [total_q, h, d] is {0, d, h d, 1}; KV cache [b, i, h, d] {i h d, d, h d, 1}.
  std::int64_t out_stride[4] = {};
  // Optional: the natural log of each row's softmax denominator, including
  // its max (the true scores, also for ALiBi rows before the first key);
  // -inf for a row without a finite score. [sequence, head, row] at
  // lse_stride: dense {h i, i, 1}; varlen [h, total_q] {0, total_q, 1}.
  float* lse = nullptr;
  std::int64_t lse_stride[3] = {};

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
  float* dtable = nullptr;   // kTable: [h, 2 table_centre + 1] contiguous (table order)
  float* dslopes = nullptr;  // kAlibi: as slopes ([h], or [b, h] with slopes_seq_stride h)
  float* ddense = nullptr;   // kDense: [b, h, i, j] contiguous
};

// One sequence of a call: its query rows and keys, where they start in the
// token dimension, and the position of its row 0.
struct Sequence {
  std::int64_t q_row0 = 0;    // first query row in the token dimension (varlen)
  std::int64_t i = 0;         // queries
  std::int64_t k_row0 = 0;    // first key row in the token dimension (varlen)
  std::int64_t j = 0;         // keys
  std::int64_t q_offset = 0;  // row r sits at position q_offset + r
};

inline Sequence sequence(const AttentionParams& p, std::int64_t s) {
  if (p.cu_q != nullptr) {
    Sequence q;
    q.q_row0 = p.cu_q[s];
    q.i = p.cu_q[s + 1] - p.cu_q[s];
    q.k_row0 = p.cu_k[s];
    q.j = p.cu_k[s + 1] - p.cu_k[s];
    q.q_offset = q.j - q.i;
    return q;
  }
  if (p.seqlen_k != nullptr) {
    const std::int64_t j = p.seqlen_k[s];
    return Sequence{0, p.i, 0, j, j - p.i};
  }
  return Sequence{0, p.i, 0, p.j, p.q_offset};
}

// The position of query row r (dense calls: every sequence shares it).
inline std::int64_t query_position(const AttentionParams& p, std::int64_t r) {
  return p.q_offset + r;
}

// Index in a reversed distance table (AttentionParams::rtable) of the
// signed distance rel = key - query position.
inline std::int64_t table_index(const AttentionParams& p, std::int64_t rel) {
  return rel + p.table_centre;
}

// The ALiBi slope of sequence s, query head x.
inline float slope_of(const AttentionParams& p, std::int64_t s, std::int64_t x) {
  return p.slopes[s * p.slopes_seq_stride + x];
}

// Keys [begin, end) that one query position may see; empty when end <= begin.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
};

// The one place that says which key positions a query at qpos sees among
// j keys: the causal limit and the window (the key mask, per key, is applied
// on top by the bias-and-mask step and by the block skipping).
inline KeyRange visible_keys(const AttentionParams& p, std::int64_t j, std::int64_t qpos) {
  std::int64_t lo = 0, hi = j;
  if (p.causal) hi = std::min(hi, qpos + 1);
  if (p.window_right >= 0) hi = std::min(hi, qpos + p.window_right + 1);
  if (p.window_left >= 0) lo = std::max(lo, qpos - p.window_left);
  lo = std::clamp<std::int64_t>(lo, 0, j);
  hi = std::clamp<std::int64_t>(hi, lo, j);
  return KeyRange{lo, hi};
}

// Dense calls (every sequence has p.j keys).
inline KeyRange visible_keys(const AttentionParams& p, std::int64_t qpos) {
  return visible_keys(p, p.j, qpos);
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
