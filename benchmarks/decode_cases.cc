// The decode cases of the attention suite (attention_cases.h): one query row
// per head against a long KV cache, where the only cost that should matter
// is reading K and V once; each case is interleaved call by call with a
// read of the same bytes (issue 17's fraction_of_read), and, where its
// libraries are installed (scripts/fetch-ggml.sh), with ggml's CPU flash
// attention on the very same K and V (peer_ggml.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "attention_cases.h"
#include "peer_ggml.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

constexpr std::int64_t kHeads = 32, kDim = 128;

// One decode call's inputs and the bytes of K and V it must read.
struct DecodeInputs {
  AttentionInputs in;
  std::size_t kv_bytes = 0;
  bool q16 = false;  // q in the cache's 16-bit dtype (see decode_inputs)
};

// Whether attention_forward takes float32 q with 16-bit k and v (issue 17
// item 2); asked once with a tiny call.
bool accepts_f32_q_with(DType kv_dtype) {
  AttentionInputs tiny = attention_inputs(1, 1, 1, 4, 8, kv_dtype);
  try {
    Tensor o = attention_forward(tiny.q, tiny.k, tiny.v, AttentionBias::none(), causal_options());
    return o.numel() > 0;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// q float32 [1, 32, 1, 128], K and V [1, hk, j, 128] in kv_dtype. A build
// whose core still wants one dtype for all three gets q in kv_dtype too
// (q16, said in the case's note).
DecodeInputs decode_inputs(std::int64_t hk, std::int64_t j, DType kv_dtype) {
  DecodeInputs d;
  d.in = attention_inputs(kHeads, hk, 1, j, kDim, kv_dtype);
  d.kv_bytes = 2 * static_cast<std::size_t>(hk * j * kDim) * dtype_size(kv_dtype);
  if (kv_dtype != DType::kFloat32 && !accepts_f32_q_with(kv_dtype)) {
    d.in.q = d.in.q.to(kv_dtype);
    d.q16 = true;
  }
  return d;
}

std::function<void()> decode_call(const DecodeInputs& d, const std::vector<float>& slopes) {
  return [&d, &slopes] {
    Tensor out =
        attention_forward(d.in.q, d.in.k, d.in.v, AttentionBias::alibi(slopes), causal_options());
  };
}

std::function<void()> read_call(const DecodeInputs& d, volatile float& sink) {
  return [&d, &sink] {
    sink = sink + stream_read(d.in.k.raw_data(), d.kv_bytes / 2) +
           stream_read(d.in.v.raw_data(), d.kv_bytes / 2);
  };
}

// A decode case from its times and those of the read of its bytes.
CaseResult decode_result(const std::string& name, const DecodeInputs& d, std::int64_t j,
                         const std::vector<double>& times, const std::vector<double>& read_times) {
  CaseResult r;
  r.name = name;
  r.median_ms = median(times);
  r.extra["gbps"] = gbps(d.kv_bytes, r.median_ms);
  r.baselines["read_gbps"] = gbps(d.kv_bytes, median(read_times));
  r.extra["fraction_of_read"] = r.extra["gbps"] / r.baselines["read_gbps"];
  set_read_best(r, times, read_times);
  set_gflops(r, 4.0 * kHeads * kDim * visible_pairs(1, j, j - 1, -1, 0));
  return r;
}

}  // namespace

void decode_cases(const BenchOptions& o, FmaPeak& fma, GgmlPeer* peer, const std::string& why,
                  std::vector<CaseResult>& out) {
  // (fma: its probe runs in these rounds too; the decode cases are judged by
  // their reads, the peak is for the record)
  const std::int64_t j = o.quick ? 4096 : 32768;
  const std::string shape = "_n" + std::to_string(j) + "_d128";
  const std::vector<std::string> names = {
      "decode_alibi_h32" + shape, "decode_gqa_alibi_h32_hk8" + shape,
      "decode_alibi_h32" + shape + "_f16kv", "decode_alibi_h32" + shape + "_bf16kv",
      "decode_alibi_h32" + shape + "_f16"};
  if (std::none_of(names.begin(), names.end(), [&](const std::string& s) { return o.wants(s); })) {
    return;
  }
  const std::vector<float> slopes = alibi_slopes(kHeads);
  volatile float sink = 0;
  const DecodeInputs f32 = decode_inputs(kHeads, j, DType::kFloat32);
  const DecodeInputs gqa = decode_inputs(8, j, DType::kFloat32);
  const DecodeInputs f16 = decode_inputs(kHeads, j, DType::kFloat16);
  const DecodeInputs bf16 = decode_inputs(kHeads, j, DType::kBFloat16);
  // All of q, k, v and out in float16 (a model run in half precision
  // throughout): the same bytes of K and V as f16kv.
  DecodeInputs all16 = decode_inputs(kHeads, j, DType::kFloat16);
  all16.in.q = all16.in.q.to(DType::kFloat16);
  // ggml's flash attention on the same tensors (f32kv, grouped-query,
  // f16kv, bf16kv; it has no float16 q), when installed.
  const DecodeInputs* const peer_cases[] = {&f32, &gqa, &f16, &bf16};
  GgmlCompared g[4];
  for (int c = 0; c < 4; ++c) {
    const DecodeInputs& in = *peer_cases[c];
    if (in.q16) continue;  // ggml takes float32 q only
    g[c] = ggml_compared(peer, in.in.q, in.in.k, in.in.v, true,
                         attention_forward(in.in.q, in.in.k, in.in.v, AttentionBias::alibi(slopes),
                                           causal_options()));
  }
  // All in one round, call by call: the 16-bit caches' f32kv baseline is
  // the float32 decode of the same rounds. The peer's calls follow ours
  // (indices 10 on).
  std::vector<std::function<void()>> calls = {decode_call(f32, slopes),   read_call(f32, sink),
                                              decode_call(gqa, slopes),   read_call(gqa, sink),
                                              decode_call(f16, slopes),   read_call(f16, sink),
                                              decode_call(bf16, slopes),  read_call(bf16, sink),
                                              decode_call(all16, slopes), read_call(all16, sink)};
  int peer_at[4] = {-1, -1, -1, -1};
  for (int c = 0; c < 4; ++c) {
    if (g[c].call == nullptr) continue;
    peer_at[c] = static_cast<int>(calls.size());
    calls.push_back([&call = *g[c].call] { call.run(); });
  }
  const int probe_at = static_cast<int>(calls.size());
  calls.push_back(fma.run());
  const auto t = time_interleaved(calls, o.warmup, o.repetitions);
  for (const std::string& name : names) fma.record(name, t[probe_at]);
  const auto peer_figures = [&](CaseResult& r, int c) {
    if (peer_at[c] >= 0) {
      // ggml's own fraction of the same read (its float16 mask holds
      // positions above 2048 to a few units, and its 16-bit paths round q
      // or P V to 16 bits: ggml_max_abs_diff).
      add_ggml_baseline(r, *peer, g[c], t[peer_at[c]]);
      r.extra["ggml_fraction_of_read"] =
          gbps(peer_cases[c]->kv_bytes, median(t[peer_at[c]])) / r.baselines["read_gbps"];
    } else if (c == 0) {
      r.note += "; " + (peer != nullptr ? std::string("ggml peer: no call for this case") : why);
    }
  };
  const std::string read_target = "fraction_of_read at least 0.85";
  // Every decode case's note ends with what fraction_of_read_best is.
  const std::string best_note =
      "; fraction_of_read_best = the fastest round over the read's fastest (the targets are "
      "judged on the medians)";
  CaseResult r = decode_result(names[0], f32, j, t[0], t[1]);
  r.note = "i = 1 against j cached keys; read_gbps = reading the K and V bytes (GB/s, not ms)" +
           best_note;
  set_target(r, read_target, r.extra["fraction_of_read"] >= 0.85);
  peer_figures(r, 0);
  out.push_back(r);

  // Grouped-query attention (8 kv heads for the 32 query heads, as
  // Llama-2-70B and Mistral): a quarter of the bytes.
  CaseResult gq = decode_result(names[1], gqa, j, t[2], t[3]);
  gq.baselines["multi_head_ms"] = r.median_ms;
  gq.extra["speedup_over_multi_head"] = r.median_ms / gq.median_ms;
  gq.note =
      "i = 1, 32 query heads on 8 kv heads; read_gbps = reading its K and V bytes; "
      "multi_head_ms = the float32 case above, in the same rounds" +
      best_note;
  set_target(gq, read_target, gq.extra["fraction_of_read"] >= 0.85);
  peer_figures(gq, 1);
  out.push_back(gq);

  // 16-bit caches (llama.cpp's arrangement: q and out float32): half the
  // bytes of the float32 case.
  const auto half = [&](const DecodeInputs& d, const std::string& name, std::size_t at, int pc) {
    CaseResult c = decode_result(name, d, j, t[at], t[at + 1]);
    c.baselines["f32kv"] = r.median_ms;
    c.extra["speedup_over_f32kv"] = r.median_ms / c.median_ms;
    c.note = std::string("i = 1, K and V in ") + dtype_name(d.in.k.dtype()) +
             (d.q16 ? ", q and out too (this build refuses float32 q with 16-bit K and V)"
                    : ", q and out float32") +
             "; read_gbps = reading its K and V bytes; f32kv = the float32 case, same rounds" +
             best_note;
    set_target(c, read_target + " and at least 1.7x faster than f32kv",
               c.extra["fraction_of_read"] >= 0.85 && c.extra["speedup_over_f32kv"] >= 1.7);
    peer_figures(c, pc);
    out.push_back(c);
  };
  half(f16, names[2], 4, 2);
  half(bf16, names[3], 6, 3);

  CaseResult a = decode_result(names[4], all16, j, t[8], t[9]);
  a.baselines["f32kv"] = r.median_ms;
  a.baselines["f16kv_ms"] = out[out.size() - 2].median_ms;
  a.extra["speedup_over_f32kv"] = r.median_ms / a.median_ms;
  a.note =
      "i = 1, q, K, V and out all float16; read_gbps = reading its K and V bytes; f32kv = the "
      "float32 case, f16kv_ms = the float16 cache with float32 q, same rounds" +
      best_note;
  set_target(a, read_target + " and at least 1.7x faster than f32kv",
             a.extra["fraction_of_read"] >= 0.85 && a.extra["speedup_over_f32kv"] >= 1.7);
  if (peer_at[2] >= 0) {  // ggml has no float16 q: its float16 cache call, same K and V bytes
    const double ms = median(t[peer_at[2]]);
    a.baselines["ggml_ms"] = ms;
    a.extra["speedup_vs_ggml"] = ms / a.median_ms;
    a.note += "; ggml_ms = ggml's f16kv call (float32 q), same rounds";
  }
  out.push_back(a);
}

}  // namespace posbias::bench
