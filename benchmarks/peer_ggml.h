// ggml's CPU flash attention (llama.cpp's backend, `ggml_flash_attn_ext`) as
// a same-run peer of the decode and prefill cases: the project's guide
// names it the peer to lead on the CPU.
//
// ggml is not a Debian package. scripts/fetch-ggml.sh takes its prebuilt
// shared libraries from the npm package @node-llama-cpp/linux-x64 (one
// libggml-cpu-<core>.so per x86 core generation, as llama.cpp ships them)
// into third_party/ggml/; the bench loads them at run time (dlopen), so
// nothing links against them and a machine without them runs every case
// without the peer. The handful of ggml calls used here are declared in
// peer_ggml.cc from ggml's public headers (ggml.h, ggml-backend.h,
// ggml-cpu.h): the types are opaque, the one struct passed by value is
// ggml_init_params.
//
// The peer runs as llama.cpp runs attention: q float32 [d, i, h], K and V
// [d, j, hk] in float32, float16 or bfloat16 in place (ggml's layout is
// the transpose of the index order of posbias's [1, hk, j, d], the same
// bytes: both read the very same K and V buffers), ALiBi through
// max_bias with a float16 mask of -|p_q - p_k| (llama.cpp's KQ mask for
// ALiBi models, -inf above a causal diagonal), on as many threads as
// OpenMP's (ggml's own threads, started for each call: a persistent pool
// polls between calls and slowed everything interleaved with it).
#ifndef POSBIAS_BENCHMARKS_PEER_GGML_H_
#define POSBIAS_BENCHMARKS_PEER_GGML_H_

#include <memory>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "posbias/tensor.h"

namespace posbias::bench {

class GgmlCall;

// The loaded libraries. load() returns null with `why` set when they are
// not there or lack a call (the peer is optional).
class GgmlPeer {
 public:
  static std::shared_ptr<GgmlPeer> load(std::string* why);
  ~GgmlPeer();
  GgmlPeer(const GgmlPeer&) = delete;
  GgmlPeer& operator=(const GgmlPeer&) = delete;

  // "ggml <version> (<commit>), <library file>, N threads".
  std::string describe() const;

  // An attention call: q [1, h, i, d] float32 (the last i of the j key
  // positions), k and v [1, hk, j, d] contiguous (float32, float16 or
  // bfloat16; h a multiple of hk, a power of two for ggml's max_bias slopes
  // to be ALiBi's standard ones), scale 1 / sqrt(d), ALiBi with max_bias
  // 8, causal or not (the symmetric -slope |p_q - p_k|). The tensors, and
  // the peer, must outlive the call's object. Throws
  // std::invalid_argument for other shapes.
  std::unique_ptr<GgmlCall> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      bool causal);

  struct Api;  // the resolved calls (peer_ggml.cc)

 private:
  GgmlPeer() = default;
  std::unique_ptr<Api> api_;
  std::string library_;
  int threads_ = 1;
};

// One prepared ggml graph: run() computes it once; output() is its last
// result in posbias's [1, h, i, d] order (float32).
class GgmlCall {
 public:
  ~GgmlCall();
  GgmlCall(const GgmlCall&) = delete;
  GgmlCall& operator=(const GgmlCall&) = delete;
  void run();
  std::vector<float> output() const;

 private:
  friend class GgmlPeer;
  GgmlCall() = default;
  struct State;
  std::unique_ptr<State> s_;
};

// A peer call prepared on a case's inputs (null without the peer), with
// the largest difference of its output from posbias's `ours` (the same
// call's output, [1, h, i, d]), from one run.
struct GgmlCompared {
  std::unique_ptr<GgmlCall> call;
  double max_abs_diff = 0;
};
GgmlCompared ggml_compared(GgmlPeer* peer, const Tensor& q, const Tensor& k, const Tensor& v,
                           bool causal, const Tensor& ours);

// The peer's figures for a case from its times in the case's rounds:
// baseline ggml_ms (the median), extra speedup_vs_ggml (> 1: posbias
// faster) and ggml_max_abs_diff, and `describe` in the note.
void add_ggml_baseline(CaseResult& r, const GgmlPeer& peer, const GgmlCompared& g,
                       const std::vector<double>& times_ms);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_PEER_GGML_H_
