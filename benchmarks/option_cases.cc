// The dense-option cases of the attention suite (issue 16,
// attention_cases.h): a sliding window, a left-padding key mask and
// soft-capping, each interleaved call by call with the same call without the
// option.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

// window_alibi_causal_h4_n16384_d64_w1024: a causal sliding window against
// the same call without it.
void window_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::int64_t h = 4, d = 64, n = o.quick ? 2048 : 16384, w = o.quick ? 128 : 1024;
  const std::string name =
      "window_alibi_causal_h4_n" + std::to_string(n) + "_d64_w" + std::to_string(w);
  if (!o.wants(name)) return;
  const AttentionInputs in = attention_inputs(h, h, n, n, d);
  const AttentionBias alibi = AttentionBias::alibi(alibi_slopes(h));
  const AttentionOptions full = causal_options();
  AttentionOptions windowed = full;
  windowed.window = AttentionWindow{w - 1, 0};
  const auto t = time_interleaved(
      {[&] { Tensor r = attention_forward(in.q, in.k, in.v, alibi, windowed); },
       [&] { Tensor r = attention_forward(in.q, in.k, in.v, alibi, full); }, fma.run()},
      o.warmup, o.repetitions);
  fma.record(name, t[2]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["full"] = median(t[1]);
  r.extra["speedup_over_full"] = r.baselines["full"] / r.median_ms;
  set_gflops(r, 4.0 * static_cast<double>(h * d) * visible_pairs(n, n, 0, w - 1, 0));
  r.note = "causal ALiBi with window {" + std::to_string(w - 1) +
           ", 0}; full = the same call without a window";
  set_target(r, "at least 5x faster than full", r.extra["speedup_over_full"] >= 5.0);
  out.push_back(r);
}

// masked_... and softcap_alibi_causal_h16_n2048_d64: a left-padding key
// mask and soft-capping, in the same rounds as the plain causal call.
void mask_softcap_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::int64_t h = 16, d = 64, n = o.quick ? 512 : 2048, hidden = n / 4;
  const std::string shape = "_h16_n" + std::to_string(n) + "_d64";
  const std::string masked_name = "masked_alibi_causal" + shape;
  const std::string softcap_name = "softcap_alibi_causal" + shape;
  if (!o.wants(masked_name) && !o.wants(softcap_name)) return;
  const AttentionInputs in = attention_inputs(h, h, n, n, d);
  const AttentionBias alibi = AttentionBias::alibi(alibi_slopes(h));
  const AttentionOptions plain = causal_options();
  AttentionOptions masked = plain;
  masked.key_mask = Tensor::empty({1, n}, DType::kUInt8);
  std::uint8_t* mask = masked.key_mask.mutable_data<std::uint8_t>();
  for (std::int64_t c = 0; c < n; ++c) mask[c] = c < hidden ? 0 : 1;
  AttentionOptions capped = plain;
  capped.softcap = 30.0f;
  const auto t = time_interleaved(
      {[&] { Tensor r = attention_forward(in.q, in.k, in.v, alibi, masked); },
       [&] { Tensor r = attention_forward(in.q, in.k, in.v, alibi, capped); },
       [&] { Tensor r = attention_forward(in.q, in.k, in.v, alibi, plain); }, fma.run()},
      o.warmup, o.repetitions);
  fma.record(masked_name, t[3]);
  fma.record(softcap_name, t[3]);
  const double plain_ms = median(t[2]);
  const double per_pair = 4.0 * static_cast<double>(h * d);
  {
    CaseResult r;
    r.name = masked_name;
    r.median_ms = median(t[0]);
    r.baselines["plain"] = plain_ms;
    r.extra["mask_cost_over_plain"] = r.median_ms / plain_ms - 1.0;
    // Row r sees keys [hidden, r]: the causal pairs of the last n - hidden
    // rows over the last n - hidden keys.
    set_gflops(r, per_pair * visible_pairs(n - hidden, n - hidden, 0, -1, 0));
    r.note = "key mask [1, " + std::to_string(n) + "] hiding the first " + std::to_string(hidden) +
             " keys (left padding); plain = causal ALiBi without a mask, same rounds";
    set_target(r, "at most 5% slower than plain", r.extra["mask_cost_over_plain"] <= 0.05);
    out.push_back(r);
  }
  {
    CaseResult r;
    r.name = softcap_name;
    r.median_ms = median(t[1]);
    r.baselines["plain"] = plain_ms;
    r.extra["softcap_cost_over_plain"] = r.median_ms / plain_ms - 1.0;
    set_gflops(r, per_pair * visible_pairs(n, n, 0, -1, 0));
    r.note = "softcap 30 (30 tanh(scale q.k / 30), then ALiBi); plain = causal ALiBi, same rounds";
    set_target(r, "at most 35% slower than plain", r.extra["softcap_cost_over_plain"] <= 0.35);
    out.push_back(r);
  }
}

}  // namespace

void option_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  window_case(o, fma, out);
  mask_softcap_cases(o, fma, out);
}

}  // namespace posbias::bench
