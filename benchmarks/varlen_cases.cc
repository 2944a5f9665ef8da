// The packed variable-length cases of the attention suite (issue 16,
// attention_cases.h): FlashAttention-2's varlen layout, forward and
// backward, each interleaved call by call with one dense call per sequence
// (and the forward with one right-padded dense batch with a key mask).
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

// A packed self-attention batch: q, k, v [total, h, d] float32 and
// cu_seqlens (int32, b + 1 offsets) of sequences of the given lengths.
struct PackedBatch {
  std::vector<std::int64_t> lengths, starts;
  Tensor q, k, v, cu_seqlens;
  std::int64_t h = 0, d = 0, total = 0, longest = 0;
};

PackedBatch packed_batch(const std::vector<std::int64_t>& lengths, std::int64_t h, std::int64_t d) {
  PackedBatch p;
  p.lengths = lengths;
  p.h = h;
  p.d = d;
  p.cu_seqlens = Tensor::empty({static_cast<std::int64_t>(lengths.size()) + 1}, DType::kInt32);
  std::int32_t* cu = p.cu_seqlens.mutable_data<std::int32_t>();
  cu[0] = 0;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    p.starts.push_back(p.total);
    p.total += lengths[s];
    cu[s + 1] = static_cast<std::int32_t>(p.total);
  }
  p.longest = *std::max_element(lengths.begin(), lengths.end());
  p.q = random_tensor({p.total, h, d}, 11);
  p.k = random_tensor({p.total, h, d}, 12);
  p.v = random_tensor({p.total, h, d}, 13);
  return p;
}

// Sequence s of a packed [total, h, d] float32 tensor as the dense
// [1, h, len, d] view of the same memory (no copy): what a user passes to
// one dense call per sequence.
Tensor sequence_view(const Tensor& packed, const PackedBatch& p, std::size_t s) {
  auto* base = const_cast<float*>(packed.data<float>()) + p.starts[s] * p.h * p.d;
  return Tensor::from_blob(base, {1, p.h, p.lengths[s], p.d},
                           {p.lengths[s] * p.h * p.d, p.d, p.h * p.d, 1}, DType::kFloat32);
}

// The packed batch as one dense [b, h, longest, d] batch with the sequences
// at the start of each row (right padding) and its key mask [b, longest]
// (uint8, 1 = a real key).
struct PaddedBatch {
  Tensor q, k, v, key_mask;
};

PaddedBatch padded_batch(const PackedBatch& p) {
  const auto b = static_cast<std::int64_t>(p.lengths.size());
  const std::int64_t n = p.longest;
  PaddedBatch pb{random_tensor({b, p.h, n, p.d}, 21), random_tensor({b, p.h, n, p.d}, 22),
                 random_tensor({b, p.h, n, p.d}, 23), Tensor::empty({b, n}, DType::kUInt8)};
  std::uint8_t* mask = pb.key_mask.mutable_data<std::uint8_t>();
  const std::pair<const Tensor*, Tensor*> pairs[] = {{&p.q, &pb.q}, {&p.k, &pb.k}, {&p.v, &pb.v}};
  for (std::int64_t s = 0; s < b; ++s) {
    const std::int64_t len = p.lengths[static_cast<std::size_t>(s)];
    for (std::int64_t c = 0; c < n; ++c) mask[s * n + c] = c < len ? 1 : 0;
    for (const auto& [from, to] : pairs) {
      const float* src = from->data<float>() + p.starts[static_cast<std::size_t>(s)] * p.h * p.d;
      float* dst = to->mutable_data<float>();
      for (std::int64_t c = 0; c < len; ++c) {
        for (std::int64_t hh = 0; hh < p.h; ++hh) {
          std::memcpy(dst + ((s * p.h + hh) * n + c) * p.d, src + (c * p.h + hh) * p.d,
                      static_cast<std::size_t>(p.d) * sizeof(float));
        }
      }
    }
  }
  return pb;
}

// Visible pairs of the packed causal batch (each sequence bottom-right).
double packed_pairs(const PackedBatch& p) {
  double pairs = 0;
  for (std::int64_t len : p.lengths) pairs += visible_pairs(len, len, 0, -1, 0);
  return pairs;
}

std::vector<std::int64_t> varlen_lengths(const BenchOptions& o) {
  std::vector<std::int64_t> lengths = {4096, 2048, 1024, 512, 256, 128, 32, 32};
  if (o.quick) {
    for (std::int64_t& len : lengths) len /= 8;
  }
  return lengths;
}

// varlen_alibi_causal_h8_d64_b8: the packed call against one dense call per
// sequence and against one right-padded dense batch with a key mask.
void varlen_forward_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::string name = "varlen_alibi_causal_h8_d64_b8";
  if (!o.wants(name)) return;
  const PackedBatch p = packed_batch(varlen_lengths(o), 8, 64);
  const PaddedBatch pad = padded_batch(p);
  const AttentionBias alibi = AttentionBias::alibi(alibi_slopes(p.h));
  const AttentionOptions causal = causal_options();
  AttentionOptions masked = causal;
  masked.key_mask = pad.key_mask;
  const auto t = time_interleaved(
      {[&] {
         Tensor r =
             attention_varlen_forward(p.q, p.k, p.v, p.cu_seqlens, p.cu_seqlens, alibi, causal);
       },
       [&] {
         for (std::size_t s = 0; s < p.lengths.size(); ++s) {
           Tensor r = attention_forward(sequence_view(p.q, p, s), sequence_view(p.k, p, s),
                                        sequence_view(p.v, p, s), alibi, causal);
         }
       },
       [&] { Tensor r = attention_forward(pad.q, pad.k, pad.v, alibi, masked); }, fma.run()},
      o.warmup, o.repetitions);
  fma.record(name, t[3]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["per_sequence"] = median(t[1]);
  r.baselines["padded"] = median(t[2]);
  r.extra["speedup_over_per_sequence"] = r.baselines["per_sequence"] / r.median_ms;
  r.extra["speedup_over_padded"] = r.baselines["padded"] / r.median_ms;
  set_gflops(r, 4.0 * static_cast<double>(p.h * p.d) * packed_pairs(p));
  r.note = "packed lengths " + std::to_string(p.lengths[0]) + ", " + std::to_string(p.lengths[1]) +
           ", ... (q, k, v [total, 8, 64]); per_sequence = one dense call per sequence on views "
           "of the same memory; padded = one dense [8, 8, " +
           std::to_string(p.longest) + ", 64] batch with a right-padding key mask";
  set_target(
      r, "not slower than per_sequence (within 5%); at least 3x faster than padded",
      r.extra["speedup_over_per_sequence"] >= 1.0 / 1.05 && r.extra["speedup_over_padded"] >= 3.0);
  out.push_back(r);
}

// varlen_backward_alibi_causal_h8_d64_b8: the packed backward against one
// dense backward per sequence (each from its own forward's out and lse).
void varlen_backward_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::string name = "varlen_backward_alibi_causal_h8_d64_b8";
  if (!o.wants(name)) return;
  const PackedBatch p = packed_batch(varlen_lengths(o), 8, 64);
  const AttentionBias alibi = AttentionBias::alibi(alibi_slopes(p.h));
  const AttentionOptions causal = causal_options();
  const Tensor grad_out = random_tensor({p.total, p.h, p.d}, 14);
  const AttentionForwardResult fwd =
      attention_varlen_forward_lse(p.q, p.k, p.v, p.cu_seqlens, p.cu_seqlens, alibi, causal);
  std::vector<AttentionForwardResult> per_fwd;
  for (std::size_t s = 0; s < p.lengths.size(); ++s) {
    per_fwd.push_back(attention_forward_lse(sequence_view(p.q, p, s), sequence_view(p.k, p, s),
                                            sequence_view(p.v, p, s), alibi, causal));
  }
  const auto t = time_interleaved(
      {[&] {
         AttentionGradients g = attention_varlen_backward(
             p.q, p.k, p.v, p.cu_seqlens, p.cu_seqlens, alibi, causal, fwd.out, fwd.lse, grad_out);
       },
       [&] {
         for (std::size_t s = 0; s < p.lengths.size(); ++s) {
           // grad_out's sequence s in the dense [1, h, len, d] layout.
           AttentionGradients g = attention_backward(
               sequence_view(p.q, p, s), sequence_view(p.k, p, s), sequence_view(p.v, p, s), alibi,
               causal, per_fwd[s].out, per_fwd[s].lse, sequence_view(grad_out, p, s));
         }
       },
       fma.run()},
      o.warmup, o.repetitions);
  fma.record(name, t[2]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["per_sequence"] = median(t[1]);
  r.extra["speedup_over_per_sequence"] = r.baselines["per_sequence"] / r.median_ms;
  // Five products of 2 d flops per visible pair: the recomputed q k^T,
  // dP = dO V^T, dV, dQ and dK.
  set_gflops(r, 10.0 * static_cast<double>(p.h * p.d) * packed_pairs(p));
  r.note =
      "the packed case's backward (gradients of q, k, v and the slopes); per_sequence = one dense "
      "attention_backward per sequence on views of the same memory; gflops counts 10 d per "
      "visible pair (five products)";
  set_target(r, "not slower than per_sequence (within 5%)",
             r.extra["speedup_over_per_sequence"] >= 1.0 / 1.05);
  out.push_back(r);
}

}  // namespace

void varlen_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  varlen_forward_case(o, fma, out);
  varlen_backward_case(o, fma, out);
}

}  // namespace posbias::bench
