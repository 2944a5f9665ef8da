// posbias-attention-loop: one attention case of `posbias bench attention`
// (the same inputs, attention_cases.h) called in a loop with nothing else,
// for a profiler: the suite interleaves every case with its baselines and
// the other cases of its round, so a profile of posbias-bench mixes them.
//
//   perf record -k mono -e cpu-clock -g build/cli/posbias-attention-loop decode_f16
//   perf report --time START, --no-children --sort symbol   # START: printed on stderr
//
// Cases: decode_f32, decode_gqa, decode_f16, decode_bf16 (h 32, j 32768,
// d 128, i = 1; the 16-bit ones with q in float32 when the core takes it,
// else in the cache's dtype; decode_gqa has 8 kv heads), decode_gqa2 (h 32
// on 16 kv heads) and decode_gqa7 (h 28 on 4: Qwen2.5-7B's groups of 7,
// which take the four-, two- and one-row value tiles), decode_gqa_slab
// (decode_gqa's values with K and V laid out [1, j, hk, d], a key
// position's kv heads side by side as in a paged cache: its tasks hold
// several kv heads, as the paged decode's do), decode_f32_slab,
// decode_f16_slab, decode_gqa_f16_slab and decode_gqa_bf16_slab
// (decode_f32's, decode_f16's and decode_gqa's values, the last two in 16
// bits, laid out so), decode_gqa_f16 (decode_gqa in float16), prefill_causal,
// prefill_noncausal (ALiBi, h 16, i = j = 2048, d 64), prefill_nobias
// (prefill_causal without a bias), prefill_bf16kv (prefill_causal with K
// and V in bfloat16, q float32), prefill_gqa_f16kv (causal ALiBi, h 32 on
// 8 kv heads, i = j = 2048, d 128, K and V in float16), paged_decode (the
// bench's paged_decode_alibi_b8_h32_hk8_d128_block16 call), paged_append
// paged_append_contiguous and paged_append_slab (the
// paged_append_alibi_b4_i128_h32_hk8_d128_block16 call and its baselines,
// the dense calls on contiguous copies and the same call on a slab cache). Prints the
// calls made and their mean time.
// --keys J replaces the case's key count (a decode over a cache that fits
// in L2 or L3 shows the kernel's arithmetic rate without the memory). A
// decode whose K and V are less than twice the last-level cache says so on
// stderr: between calls part of them stays there (an Emerald Rapids Xeon
// with 300 MiB of L3 read decode_gqa's 256 MiB at 32 GB/s in this loop,
// 24-25 from memory), and --keys takes it past.
// --target NAME (Highway's name: AVX2, AVX3, AVX3_ZEN4, ...) runs the
// kernels of that instruction set only, if this CPU has it: an AVX-512
// machine can profile the AVX2 code.
// Build tree only (not installed).
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "attention_cases.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace {

using posbias::DType;
using posbias::bench::AttentionInputs;

struct LoopCase {
  std::int64_t h, hk, i, j, d;
  DType kv_dtype;
  bool causal;
  bool slab = false;  // K and V as [1, j, hk, d] (viewed as [1, hk, j, d])
  bool alibi = true;  // else no bias
};

const std::map<std::string, LoopCase>& loop_cases() {
  static const std::map<std::string, LoopCase> cases = {
      {"decode_f32", {32, 32, 1, 32768, 128, DType::kFloat32, true}},
      {"decode_gqa", {32, 8, 1, 32768, 128, DType::kFloat32, true}},
      {"decode_gqa2", {32, 16, 1, 32768, 128, DType::kFloat32, true}},
      {"decode_gqa7", {28, 4, 1, 32768, 128, DType::kFloat32, true}},
      {"decode_gqa_slab", {32, 8, 1, 32768, 128, DType::kFloat32, true, true}},
      {"decode_f16", {32, 32, 1, 32768, 128, DType::kFloat16, true}},
      {"decode_f16_slab", {32, 32, 1, 32768, 128, DType::kFloat16, true, true}},
      {"decode_f32_slab", {32, 32, 1, 32768, 128, DType::kFloat32, true, true}},
      {"decode_gqa_f16_slab", {32, 8, 1, 32768, 128, DType::kFloat16, true, true}},
      {"decode_gqa_bf16_slab", {32, 8, 1, 32768, 128, DType::kBFloat16, true, true}},
      {"decode_gqa_f16", {32, 8, 1, 32768, 128, DType::kFloat16, true}},
      {"decode_bf16", {32, 32, 1, 32768, 128, DType::kBFloat16, true}},
      {"prefill_causal", {16, 16, 2048, 2048, 64, DType::kFloat32, true}},
      {"prefill_noncausal", {16, 16, 2048, 2048, 64, DType::kFloat32, false}},
      {"prefill_nobias", {16, 16, 2048, 2048, 64, DType::kFloat32, true, false, false}},
      {"prefill_bf16kv", {16, 16, 2048, 2048, 64, DType::kBFloat16, true}},
      {"prefill_gqa_f16kv", {32, 8, 2048, 2048, 128, DType::kFloat16, true}},
  };
  return cases;
}

int usage() {
  std::cerr
      << "usage: posbias-attention-loop CASE [--seconds S] [--keys J] [--target NAME]; cases:";
  for (const auto& [name, c] : loop_cases()) std::cerr << " " << name;
  std::cerr << " paged_decode paged_append paged_append_contiguous paged_append_slab (no --keys)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc % 2 != 0) return usage();
  // The paged cases' inputs are the bench's (kvcache_cases.cc), not a LoopCase.
  const std::string name = argv[1];
  const bool paged = name == "paged_decode" || name == "paged_append" ||
                     name == "paged_append_contiguous" || name == "paged_append_slab";
  const auto it = loop_cases().find(argv[1]);
  if (it == loop_cases().end() && !paged) return usage();
  double seconds = 10;
  std::string target;  // empty: the best this CPU has
  LoopCase c = paged ? LoopCase{} : it->second;
  for (int a = 2; a + 1 < argc; a += 2) {
    const std::string flag = argv[a];
    if (flag == "--target") {
      try {
        posbias::bench::use_only_isa(argv[a + 1]);
      } catch (const std::invalid_argument& e) {
        std::cerr << e.what() << "\n";
        return 2;
      }
      target = argv[a + 1];
      continue;
    }
    char* end = nullptr;
    const double value = std::strtod(argv[a + 1], &end);
    if (end == argv[a + 1] || *end != '\0' || !(value > 0)) return usage();
    if (flag == "--seconds") {
      seconds = value;
    } else if (flag == "--keys" && !paged &&
               value == static_cast<double>(static_cast<std::int64_t>(value)) && value <= 1e9) {
      c.j = static_cast<std::int64_t>(value);
      if (c.i > c.j) c.i = c.j;
    } else {
      return usage();
    }
  }
  std::function<void()> call;
  std::size_t kv_bytes = 0;  // decode: the bytes of K and V one call reads
  std::string what;
  AttentionInputs in;
  posbias::AttentionBias bias;
  posbias::AttentionOptions opt;
  if (name == "paged_decode") {
    call = posbias::bench::paged_decode_call(kv_bytes, what);
    call();  // warm-up
  } else if (paged) {
    const std::string prefix = "paged_append_";
    call = posbias::bench::paged_append_call(
        name.size() > prefix.size() ? name.substr(prefix.size()) : "paged", what);
    call();  // warm-up
  } else {
    in = posbias::bench::attention_inputs(c.h, c.hk, c.i, c.j, c.d, c.kv_dtype);
    if (c.slab) {
      in.k = in.k.transpose(1, 2).contiguous_copy().transpose(1, 2);
      in.v = in.v.transpose(1, 2).contiguous_copy().transpose(1, 2);
    }
    if (c.alibi) bias = posbias::AttentionBias::alibi(posbias::alibi_slopes(c.h));
    opt.causal = c.causal;
    call = [&] { posbias::Tensor out = posbias::attention_forward(in.q, in.k, in.v, bias, opt); };
    try {
      call();  // warm-up, or the dtypes this core refuses
    } catch (const std::invalid_argument&) {
      in.q = in.q.to(c.kv_dtype);  // a core that wants one dtype for q, k and v
      call();
    }
    if (c.i == 1) kv_bytes = in.k.numel() * posbias::dtype_size(in.k.dtype()) * 2;
    what = std::string("q ") + posbias::dtype_name(in.q.dtype()) + ", k and v " +
           posbias::dtype_name(in.k.dtype()) + (c.slab ? " [1, j, hk, d]" : "") + ", j " +
           std::to_string(c.j);
  }
  if (kv_bytes > 0) {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0 && kv_bytes < 2 * static_cast<std::size_t>(llc)) {
      std::cerr << "note: K and V (" << (kv_bytes >> 20) << " MiB) are less than twice the L3 ("
                << (llc >> 20) << " MiB): part of them stays in cache between calls\n";
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  // steady_clock is CLOCK_MONOTONIC on Linux: with `perf record -k mono`,
  // `perf report --time START,` keeps the loop's samples only (not the
  // inputs' setup).
  std::cerr << "loop starts at CLOCK_MONOTONIC " << std::fixed << std::setprecision(6)
            << std::chrono::duration<double>(t0.time_since_epoch()).count() << " s\n";
  long calls = 0;
  double elapsed = 0;
  do {
    call();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  std::cout << argv[1] << ": " << calls << " calls, " << elapsed * 1e3 / static_cast<double>(calls)
            << " ms each (" << what;
  if (!target.empty()) std::cout << ", " << target;
  if (kv_bytes > 0) {  // decode: the rate at which K and V were read
    std::cout << ", "
              << static_cast<double>(kv_bytes) / (elapsed / static_cast<double>(calls)) / 1e9
              << " GB/s of K and V";
  }
  std::cout << ")\n";
  return 0;
}
