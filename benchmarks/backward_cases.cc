// The grouped-query training case of the attention suite
// (attention_cases.h): the backward of a causal ALiBi call with 32 query
// heads on 8 kv heads, interleaved call by call with the same backward on
// the kv heads repeated to 32 (multi-head attention: the same five products
// and flops, each kv head's gradient left per query head).
#include <algorithm>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

// x [1, hk, n, d] float32 with each head repeated `group` times:
// [1, hk group, n, d], query head hh reading kv head hh / group.
Tensor repeat_heads(const Tensor& x, std::int64_t group) {
  const std::int64_t hk = x.shape()[1], n = x.shape()[2], d = x.shape()[3];
  Tensor y = Tensor::empty({1, hk * group, n, d}, DType::kFloat32);
  const float* from = x.data<float>();
  float* to = y.mutable_data<float>();
  for (std::int64_t hh = 0; hh < hk * group; ++hh) {
    std::copy(from + (hh / group) * n * d, from + (hh / group + 1) * n * d, to + hh * n * d);
  }
  return y;
}

// backward_gqa_alibi_causal_h32_hk8_n1024_d128.
void gqa_backward_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::int64_t h = 32, hk = 8, d = 128, n = o.quick ? 256 : 1024;
  const std::string name = "backward_gqa_alibi_causal_h32_hk8_n" + std::to_string(n) + "_d128";
  if (!o.wants(name)) return;
  const AttentionInputs in = attention_inputs(h, hk, n, n, d);
  const Tensor k_mha = repeat_heads(in.k, h / hk), v_mha = repeat_heads(in.v, h / hk);
  const AttentionBias alibi = AttentionBias::alibi(alibi_slopes(h));
  const AttentionOptions causal = causal_options();
  const Tensor grad_out = random_tensor({1, h, n, d}, 15);
  const AttentionForwardResult fwd = attention_forward_lse(in.q, in.k, in.v, alibi, causal);
  const AttentionForwardResult fwd_mha = attention_forward_lse(in.q, k_mha, v_mha, alibi, causal);
  const auto t = time_interleaved(
      {[&] {
         AttentionGradients g =
             attention_backward(in.q, in.k, in.v, alibi, causal, fwd.out, fwd.lse, grad_out);
       },
       [&] {
         AttentionGradients g = attention_backward(in.q, k_mha, v_mha, alibi, causal, fwd_mha.out,
                                                   fwd_mha.lse, grad_out);
       },
       fma.run()},
      o.warmup, o.repetitions);
  fma.record(name, t[2]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["multi_head"] = median(t[1]);
  r.extra["gqa_cost_over_multi_head"] = r.median_ms / r.baselines["multi_head"] - 1.0;
  // Five products of 2 d flops per visible pair (as the packed backward).
  set_gflops(r, 10.0 * static_cast<double>(h * d) * visible_pairs(n, n, 0, -1, 0));
  r.note =
      "the backward (gradients of q, k, v and the slopes) of causal ALiBi, 32 query heads on 8 kv "
      "heads; multi_head = the same call with each kv head repeated for its 4 query heads; gflops "
      "counts 10 d per visible pair (blocks whose every weight is 0 are skipped, as in the "
      "forward)";
  set_target(r, "at most 5% slower than multi_head", r.extra["gqa_cost_over_multi_head"] <= 0.05);
  out.push_back(r);
}

}  // namespace

void backward_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  gqa_backward_case(o, fma, out);
}

}  // namespace posbias::bench
