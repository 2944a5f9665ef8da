#include "bench_suite.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "baselines.h"
#include "bench_report.h"
#include "child_measure.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias::bench {
namespace {

std::string dtype_tag(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "f32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "f16";
  }
  return "?";
}

double gbps(std::size_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) / ms / 1e6 : 0.0;
}

// Runs a PyTorch peer script of benchmarks/ with /usr/bin/python3 (or
// $POSBIAS_PEER_PYTHON) and `args` (shell words); returns its JSON line, or "" with `why` set when
// Python or torch is missing (the peer is optional: torch is not a build
// dependency).
// `text` in single quotes for /bin/sh (a path with spaces or quotes stays
// one word).
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string run_peer(const std::string& script, const std::string& args, std::string* why) {
#ifdef POSBIAS_BENCH_DIR
  const char* env = std::getenv("POSBIAS_PEER_PYTHON");
  const std::string python = env ? env : "/usr/bin/python3";
  const std::string cmd = shell_quote(python) + " " +
                          shell_quote(std::string(POSBIAS_BENCH_DIR) + "/" + script) + " " + args +
                          " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) {
    *why = "could not start " + python;
    return "";
  }
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe.get()) != nullptr) text += buf;
  // The last line is the peer's JSON object.
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::size_t line_start = text.find_last_of('\n');
  text = line_start == std::string::npos ? text : text.substr(line_start + 1);
  if (text.empty() || text.front() != '{') {
    *why = "PyTorch peer unavailable (" + python + " without torch?)";
    return "";
  }
  return text;
#else
  (void)script;
  (void)args;
  *why = "PyTorch peer scripts not found in this installation";
  return "";
#endif
}

// The number under `key` in a peer's JSON line, or -1 when the line does not
// parse or has no such number.
double json_field(const std::string& text, const std::string& key) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return -1;
  const auto it = doc.find(key);
  return it != doc.end() && it->is_number() ? it->get<double>() : -1;
}

// The ALiBi peer (peer_alibi.py) at one size and dtype, run once and kept
// for every case that reads it; nothing when options.quick.
class AlibiPeer {
 public:
  explicit AlibiPeer(const BenchOptions& o) : o_(o) {}

  // The peer's figure `field` ("module_ms", "into_ms") as baseline `name` of
  // r, or why it is missing in r's note.
  void add(CaseResult& r, std::int64_t heads, std::int64_t n, DType dtype, const char* field,
           const std::string& name);

 private:
  const BenchOptions& o_;
  std::map<std::string, std::pair<std::string, std::string>> runs_;  // args -> text, why
};

// Records a PyTorch peer's median `ms` as baseline `name` ("pytorch_..._ms")
// and its ratio as extra "speedup_vs_pytorch_..." (> 1: posbias faster).
void add_pytorch_baseline(CaseResult& r, const std::string& name, double ms) {
  r.baselines[name] = ms;
  const std::string stem = name.size() > 3 && name.compare(name.size() - 3, 3, "_ms") == 0
                               ? name.substr(0, name.size() - 3)
                               : name;
  r.extra["speedup_vs_" + stem] = ms / r.median_ms;
}

void AlibiPeer::add(CaseResult& r, std::int64_t heads, std::int64_t n, DType dtype,
                    const char* field, const std::string& name) {
  if (o_.quick) return;
  const std::string args = "--heads " + std::to_string(heads) + " -n " + std::to_string(n) +
                           " --reps " + std::to_string(std::max(3, o_.repetitions / 2)) +
                           " --dtype " + dtype_name(dtype);
  auto it = runs_.find(args);
  if (it == runs_.end()) {
    std::string why;
    std::string text = run_peer("peer_alibi.py", args, &why);
    it = runs_.emplace(args, std::make_pair(std::move(text), std::move(why))).first;
  }
  const auto& [text, why] = it->second;
  const double ms = text.empty() ? -1 : json_field(text, field);
  if (ms > 0) {
    add_pytorch_baseline(r, name, ms);
  } else {
    r.note += "; " + (text.empty() ? why : std::string("the PyTorch peer gave no ") + field);
  }
}

// Materialising into a pre-faulted buffer: the kernel itself, against a
// streaming fill of the same bytes in the same buffer.
CaseResult materialise_case(std::int64_t heads, std::int64_t n, DType dtype, const BenchOptions& o,
                            AlibiPeer& peer) {
  const std::vector<float> slopes = alibi_slopes(heads);
  Tensor buf = Tensor::empty({heads, n, n}, dtype);
  const std::size_t bytes = static_cast<std::size_t>(buf.numel()) * dtype_size(dtype);
  stream_fill(buf.raw_mutable_data(), bytes);  // fault the pages in once
  void* out = buf.raw_mutable_data();
  const auto t =
      time_interleaved({[&] { alibi_bias_into(slopes, heads, n, n, dtype, out); },
                        [&] { stream_fill(out, bytes); }, [&] { store_fill(out, bytes); }},
                       o.warmup, o.repetitions);
  CaseResult r;
  r.name = "alibi_h" + std::to_string(heads) + "_n" + std::to_string(n) + "_" + dtype_tag(dtype);
  r.median_ms = median(t[0]);
  r.baselines["fill"] = median(t[1]);
  r.baselines["fill_store"] = median(t[2]);
  r.extra["bytes"] = static_cast<double>(bytes);
  r.extra["gbps"] = gbps(bytes, r.median_ms);
  r.extra["fill_gbps"] = gbps(bytes, r.baselines["fill"]);
  r.extra["fraction_of_fill"] = r.baselines["fill"] / r.median_ms;
  r.note =
      "into a pre-faulted buffer; fill = streaming stores, fill_store = ordinary stores of the "
      "same bytes";
  if (!o.quick) {
    r.note +=
        "; pytorch_into_ms = -|k - q| (built once) times the slopes into a reused, pre-faulted "
        "buffer of the same dtype (torch.mul out=)";
  }
  peer.add(r, heads, n, dtype, "into_ms", "pytorch_into_ms");
  return r;
}

// A call that returns a new [shape] float32 tensor, against a fresh
// allocation of the same shape plus the streaming fill (what any allocating
// call costs at least: page faults, the kernel's zeroing, the writes).
CaseResult against_alloc_fill(const std::string& name, const std::function<void()>& call,
                              const std::vector<std::int64_t>& shape, const BenchOptions& o) {
  std::int64_t count = 1;
  for (std::int64_t e : shape) count *= e;
  const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
  const auto t = time_interleaved({call,
                                   [&] {
                                     Tensor b = Tensor::empty(shape, DType::kFloat32);
                                     stream_fill(b.raw_mutable_data(), bytes);
                                   }},
                                  o.warmup, o.repetitions);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["alloc_fill"] = median(t[1]);
  r.extra["fraction_of_alloc_fill"] = r.baselines["alloc_fill"] / r.median_ms;
  return r;
}

// A module's first call: allocation, page faults and the fill, against a
// fresh allocation plus the streaming fill, and the PyTorch peer.
CaseResult forward_miss_case(std::int64_t heads, std::int64_t n, const BenchOptions& o,
                             AlibiPeer& peer) {
  AlibiPositionalBias module(heads);
  module.set_cache_limit_bytes(0);  // every call computes
  CaseResult r = against_alloc_fill(
      "alibi_forward_h" + std::to_string(heads) + "_n" + std::to_string(n) + "_f32",
      [&] { Tensor b = module.forward(n, n); }, {heads, n, n}, o);
  r.note = "AlibiPositionalBias::forward on a cache miss (new allocation)";
  if (!o.quick) r.note += "; pytorch_module_ms = the PyTorch module's forward (a new tensor)";
  peer.add(r, heads, n, DType::kFloat32, "module_ms", "pytorch_module_ms");
  return r;
}

// A cache hit returns a view: its cost must not depend on the size.
CaseResult cache_hit_case(std::int64_t heads, std::int64_t n_small, std::int64_t n,
                          const BenchOptions& o) {
  AlibiPositionalBias big(heads), small(heads);
  big.forward(n, n);
  small.forward(n_small, n_small);
  constexpr int kCalls = 10000;
  const auto t = time_interleaved({[&] {
                                     for (int k = 0; k < kCalls; ++k)
                                       Tensor v = big.forward(n - 1, n - 1);
                                   },
                                   [&] {
                                     for (int k = 0; k < kCalls; ++k)
                                       Tensor v = small.forward(n_small - 1, n_small - 1);
                                   }},
                                  o.warmup, o.repetitions);
  CaseResult r;
  r.name = "alibi_cache_hit_h" + std::to_string(heads) + "_n" + std::to_string(n);
  r.median_ms = median(t[0]) / kCalls;
  r.baselines["cache_hit_n" + std::to_string(n_small)] = median(t[1]) / kCalls;
  r.extra["ratio_to_small"] = r.median_ms / (median(t[1]) / kCalls);
  r.note = "one forward() served from the stored bias (a view), per call";
  return r;
}

std::vector<CaseResult> alibi_suite(const BenchOptions& o) {
  const std::int64_t n = o.quick ? 1024 : 4096;
  std::vector<CaseResult> out;
  AlibiPeer peer(o);
  out.push_back(materialise_case(16, n, DType::kFloat32, o, peer));
  out.push_back(materialise_case(16, n, DType::kBFloat16, o, peer));
  out.push_back(materialise_case(16, n, DType::kFloat16, o, peer));
  out.push_back(materialise_case(16, o.quick ? 256 : 512, DType::kFloat32, o, peer));
  out.push_back(forward_miss_case(16, n, o, peer));
  out.push_back(cache_hit_case(16, 256, n, o));
  return out;
}

// The naive path of the DPB table: the MLP evaluated one distance at a
// time with plain loops (what a straightforward port does).
void naive_dpb_table(const DynamicPositionBias& m, std::int64_t j, std::vector<float>& out) {
  const std::int64_t dim = m.dim(), heads = m.heads();
  const float* w0 = m.parameter("mlp.0.weight").data<float>();
  const float* b0 = m.parameter("mlp.0.bias").data<float>();
  const float* w2 = m.parameter("mlp.2.weight").data<float>();
  const float* b2 = m.parameter("mlp.2.bias").data<float>();
  const float* w4 = m.parameter("mlp.4.weight").data<float>();
  const float* b4 = m.parameter("mlp.4.bias").data<float>();
  std::vector<float> h1(static_cast<std::size_t>(dim)), h2(static_cast<std::size_t>(dim));
  auto silu = [](float v) { return v / (1.0f + std::exp(-v)); };
  out.resize(static_cast<std::size_t>(heads * j));
  for (std::int64_t d = 0; d < j; ++d) {
    const auto x = static_cast<float>(d);
    for (std::int64_t u = 0; u < dim; ++u) h1[u] = silu(w0[u] * x + b0[u]);
    for (std::int64_t u = 0; u < dim; ++u) {
      float acc = b2[u];
      for (std::int64_t v = 0; v < dim; ++v) acc += w2[u * dim + v] * h1[v];
      h2[u] = silu(acc);
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      float acc = b4[h];
      for (std::int64_t v = 0; v < dim; ++v) acc += w4[h * dim + v] * h2[v];
      out[static_cast<std::size_t>(h * j + d)] = acc;
    }
  }
}

std::vector<CaseResult> dpb_suite(const BenchOptions& o) {
  const std::int64_t dim = 64, heads = 8;
  const std::int64_t n = o.quick ? 1024 : 4096;
  const std::int64_t nb = o.quick ? 512 : 2048;
  const DynamicPositionBias module(dim, heads, /*seed=*/0);
  std::string why;
  std::string peer;
  if (!o.quick) {
    peer = run_peer("peer_dpb.py",
                    "--dim 64 --heads 8 -n " + std::to_string(n) + " --backward-n " +
                        std::to_string(nb) + " --reps " +
                        std::to_string(std::max(3, o.repetitions / 3)),
                    &why);
  }
  // The peer's figure `field` as baseline `name` (pytorch_..._ms) with its
  // ratio speedup_vs_pytorch_... (> 1: posbias faster).
  auto add_peer = [&](CaseResult& r, const char* field, const std::string& name) {
    const double ms = peer.empty() ? -1 : json_field(peer, field);
    if (ms > 0) {
      add_pytorch_baseline(r, name, ms);
    } else if (!peer.empty()) {
      r.note += std::string("; the PyTorch peer gave no ") + field;
    } else if (!o.quick && r.note.find(why) == std::string::npos) {
      r.note += "; " + why;
    }
  };
  std::vector<CaseResult> out;
  const std::string tag = "_d64_h8_n";
  {
    // Forward: the MLP on n distances plus the gather of heads*n*n values
    // into a pre-faulted buffer, against a streaming fill of the same bytes.
    Tensor buf = Tensor::empty({heads, n, n}, DType::kFloat32);
    const std::size_t bytes = static_cast<std::size_t>(buf.numel()) * sizeof(float);
    stream_fill(buf.raw_mutable_data(), bytes);
    void* dst = buf.raw_mutable_data();
    const auto t = time_interleaved({[&] { module.forward_into(n, n, DType::kFloat32, dst); },
                                     [&] { stream_fill(dst, bytes); }},
                                    o.warmup, o.repetitions);
    CaseResult r;
    r.name = "dpb_forward" + tag + std::to_string(n);
    r.median_ms = median(t[0]);
    r.baselines["fill"] = median(t[1]);
    r.extra["fraction_of_fill"] = r.baselines["fill"] / r.median_ms;
    r.extra["gbps"] = gbps(bytes, r.median_ms);
    r.note =
        "forward_into a pre-faulted buffer; fill = streaming stores of the same bytes; "
        "pytorch_into_ms = the MLP then index_select into a reused, pre-faulted [h, i, j] buffer "
        "(index built once)";
    add_peer(r, "forward_into_ms", "pytorch_into_ms");
    out.push_back(r);
  }
  {
    // The same through forward(): a fresh tensor each call, so the pages are
    // faulted in and zeroed by the kernel first; against an allocation plus
    // the streaming fill.
    CaseResult r = against_alloc_fill(
        "dpb_forward_alloc" + tag + std::to_string(n), [&] { Tensor b = module.forward(n, n); },
        {heads, n, n}, o);
    r.note =
        "forward() into a new tensor (page faults included); pytorch_module_ms = the PyTorch "
        "module's forward, also a new tensor each call";
    add_peer(r, "forward_module_ms", "pytorch_module_ms");
    out.push_back(r);
  }
  {
    std::vector<float> naive;
    const auto t = time_interleaved(
        {[&] { Tensor tb = module.table(n); }, [&] { naive_dpb_table(module, n, naive); }},
        o.warmup, o.repetitions);
    CaseResult r;
    r.name = "dpb_table" + tag + std::to_string(n);
    r.median_ms = median(t[0]);
    r.baselines["naive"] = median(t[1]);
    r.extra["speedup_vs_naive"] = r.baselines["naive"] / r.median_ms;
    r.note =
        "the MLP on n distances; naive = scalar loops, one distance at a time; "
        "pytorch_mlp_ms = the module's MLP on the same distances";
    add_peer(r, "table_ms", "pytorch_mlp_ms");
    out.push_back(r);
  }
  {
    // Backward: reduce a [heads, nb, nb] gradient onto the table, then the
    // MLP backward; against a read of the gradient's bytes.
    Tensor grad = Tensor::empty({heads, nb, nb}, DType::kFloat32);
    float* g = grad.mutable_data<float>();
    for (std::int64_t k = 0; k < grad.numel(); ++k) {
      g[k] = static_cast<float>((k * 2654435761u) % 1000) * 1e-3f - 0.5f;
    }
    const std::size_t bytes = static_cast<std::size_t>(grad.numel()) * sizeof(float);
    volatile float sink = 0;
    const auto t = time_interleaved({[&] { TensorMap gr = module.backward(nb, nb, grad); },
                                     [&] { sink = sink + stream_read(grad.raw_data(), bytes); }},
                                    o.warmup, o.repetitions);
    CaseResult r;
    r.name = "dpb_backward" + tag + std::to_string(nb);
    r.median_ms = median(t[0]);
    r.baselines["read"] = median(t[1]);
    r.extra["fraction_of_read"] = r.baselines["read"] / r.median_ms;
    r.note =
        "parameter gradients from a [heads, n, n] bias gradient; read = one pass over it; "
        "pytorch_backward_ms = autograd's out.backward(grad) alone (graph built untimed); "
        "pytorch_forward_backward_ms = forward + backward (not like for like)";
    add_peer(r, "backward_ms", "pytorch_backward_ms");
    add_peer(r, "forward_backward_ms", "pytorch_forward_backward_ms");
    out.push_back(r);
  }
  return out;
}

// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG).
Tensor random_tensor(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.mutable_data<float>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t k = 0; k < t.numel(); ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[k] = static_cast<float>(static_cast<double>(x >> 40) * 0x1p-23 - 1.0);
  }
  return t;
}

struct AttentionInputs {
  Tensor q, k, v;
};

AttentionInputs attention_inputs(std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                                 std::int64_t d) {
  return {random_tensor({1, h, i, d}, 1), random_tensor({1, hk, j, d}, 2),
          random_tensor({1, hk, j, d}, 3)};
}

// Peak resident memory of attention at [1, h, n, n, d] (causal ALiBi), run
// in a child process so that nothing else this process holds counts
// (child_measure.h): a small call first (code pages, OpenMP threads), then
// the peak restarts, q, k, v are allocated and the call is made. Returns
// {peak bytes above the child's RSS before the inputs, or -1 with `error`
// set; bytes of q, k, v and out}.
std::pair<double, double> attention_peak_memory(std::int64_t h, std::int64_t n, std::int64_t d,
                                                std::string* error) {
  const double io = 4.0 * static_cast<double>(h * n * d) * sizeof(float);
  const ChildResult run = run_in_child([&](ChildReport& report) {
    AttentionOptions opt;
    opt.causal = true;
    {
      AttentionInputs small = attention_inputs(h, h, 64, 64, d);
      Tensor warm =
          attention_forward(small.q, small.k, small.v, AttentionBias::alibi(alibi_slopes(h)), opt);
    }
    report.restart_peak();
    AttentionInputs in = attention_inputs(h, h, n, n, d);
    Tensor out = attention_forward(in.q, in.k, in.v, AttentionBias::alibi(alibi_slopes(h)), opt);
    if (out.numel() == 0) throw std::runtime_error("empty output");
  });
  if (!run.ok || run.peak_growth < 0) {
    *error = run.ok ? "could not read /proc/self/status" : run.error;
    return {-1, io};
  }
  return {run.peak_growth, io};
}

std::vector<CaseResult> attention_suite(const BenchOptions& o) {
  std::vector<CaseResult> out;
  const std::int64_t h = 16, d = 64, n = o.quick ? 512 : 2048;
  const std::string shape = "_h16_n" + std::to_string(n) + "_d64";
  const std::vector<float> slopes = alibi_slopes(h);
  {
    // Memory first, while this process is small.
    const std::int64_t nm = o.quick ? 2048 : 16384;
    CaseResult r;
    const auto [peak, io] = attention_peak_memory(h, nm, d, &r.error);
    r.name = "memory_h16_n" + std::to_string(nm) + "_d64";
    r.median_ms = 0;
    r.extra["peak_bytes"] = peak;
    r.extra["io_bytes"] = io;
    r.extra["peak_over_io"] = peak / io;
    r.baselines["io_bytes_times_1.2_plus_64MiB"] = std::floor(1.2 * io) + 64.0 * (1 << 20);
    r.note =
        "peak RSS (VmHWM) of one causal ALiBi call in a child process above its VmRSS "
        "before the inputs were allocated; io = q, k, v, out";
    // q, k, v and out are resident together: a smaller peak is a broken
    // measurement, not a good result.
    if (r.error.empty() && peak < io) {
      r.error = "peak_bytes < io_bytes: the peak memory measurement is broken";
    }
    out.push_back(r);
  }
  AttentionInputs in = attention_inputs(h, h, n, n, d);
  Tensor dpb_table = DynamicPositionBias(16, h, 0).distance_table(n);
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions noncausal;
  const auto run = [&](const AttentionBias& b, const AttentionOptions& opt) {
    return [&in, b, opt] { Tensor r = attention_forward(in.q, in.k, in.v, b, opt); };
  };
  const auto t = time_interleaved(
      {run(AttentionBias::alibi(slopes), causal), run(AttentionBias::none(), causal),
       run(AttentionBias::distance_table(dpb_table), causal),
       run(AttentionBias::alibi(slopes), noncausal)},
      o.warmup, o.repetitions);
  const double alibi_ms = median(t[0]), none_ms = median(t[1]), table_ms = median(t[2]),
               nc_ms = median(t[3]);
  // The sgemm roofline of the non-causal case: in the same run, right after
  // the attention rounds, but not interleaved with them. Interleaved (even
  // with a 300 ms pause after each sgemm for OpenBLAS's worker, which spins
  // for about 0.1 s after a call), it slowed the attention calls of the same
  // rounds: causal ALiBi 82-109 ms against 73-76 ms without it, no bias
  // 75-98 against 73-76 (three alternated runs), which would distort the
  // ALiBi / no-bias ratios this suite exists for.
  SgemmBaseline sgemm(static_cast<int>(n));
  const double sgemm_gflops =
      sgemm.flops() /
      (median(time_interleaved({[&sgemm] { sgemm(); }}, 1, std::max(3, o.repetitions / 2))[0]) *
       1e6);
  std::string why;
  const std::string peer =
      o.quick ? ""
              : run_peer("peer_attention.py",
                         "--heads 16 -n " + std::to_string(n) + " -d 64 --causal --reps 3", &why);
  const double peer_ms = peer.empty() ? -1 : json_field(peer, "median_ms");
  const double flops_full = 4.0 * static_cast<double>(h * n * n * d);
  {
    CaseResult r;
    r.name = "attention_alibi_causal" + shape;
    r.median_ms = alibi_ms;
    r.baselines["no_bias"] = none_ms;
    r.extra["alibi_cost_over_no_bias"] = alibi_ms / none_ms - 1.0;
    if (peer_ms > 0) {
      r.baselines["pytorch"] = peer_ms;
      r.extra["speedup_vs_pytorch"] = peer_ms / alibi_ms;
    }
    r.note = "b 1, causal ALiBi, float32; pytorch = matmul + materialised bias + softmax" +
             (peer.empty() && !o.quick ? "; " + why : std::string());
    out.push_back(r);
  }
  {
    CaseResult r;
    r.name = "attention_none_causal" + shape;
    r.median_ms = none_ms;
    r.baselines["alibi"] = alibi_ms;
    r.extra["gflops"] = flops_full / 2 / (none_ms * 1e6);
    r.note = "the same kernel without a bias (causal: about half the flops of 4 b h i j d)";
    out.push_back(r);
  }
  {
    CaseResult r;
    r.name = "attention_table_causal" + shape;
    r.median_ms = table_ms;
    r.baselines["no_bias"] = none_ms;
    r.extra["table_cost_over_no_bias"] = table_ms / none_ms - 1.0;
    r.note = "a DynamicPositionBias distance table [h, 2j - 1]";
    out.push_back(r);
  }
  {
    CaseResult r;
    r.name = "attention_alibi_noncausal" + shape;
    r.median_ms = nc_ms;
    r.extra["gflops"] = flops_full / (nc_ms * 1e6);
    r.baselines["sgemm_gflops"] = sgemm_gflops;
    r.extra["fraction_of_sgemm"] = r.extra["gflops"] / sgemm_gflops;
    r.note =
        "non-causal ALiBi; gflops = 4 b h i j d / time; sgemm_gflops = OpenBLAS on n x n "
        "(GFLOP/s, not ms), timed right after the attention rounds";
    out.push_back(r);
  }
  {
    // Decode: one query against a long KV cache; judged by the bandwidth of
    // reading K and V.
    const std::int64_t hd = 32, jd = o.quick ? 4096 : 32768, dd = 128;
    const std::vector<float> s32 = alibi_slopes(hd);
    volatile float sink = 0;
    // One decode against hk kv heads, interleaved with a read of its K and V
    // bytes: the case's median and gbps, and the read's read_gbps.
    const auto decode_case = [&](std::int64_t hk, const std::string& name) {
      AttentionInputs dec = attention_inputs(hd, hk, 1, jd, dd);
      const std::size_t bytes = 2 * static_cast<std::size_t>(hk * jd * dd) * sizeof(float);
      const auto td = time_interleaved({[&] {
                                          Tensor o_dec =
                                              attention_forward(dec.q, dec.k, dec.v,
                                                                AttentionBias::alibi(s32), causal);
                                        },
                                        [&] {
                                          sink = sink + stream_read(dec.k.raw_data(), bytes / 2) +
                                                 stream_read(dec.v.raw_data(), bytes / 2);
                                        }},
                                       o.warmup, o.repetitions);
      CaseResult r;
      r.name = name;
      r.median_ms = median(td[0]);
      r.extra["gbps"] = gbps(bytes, r.median_ms);
      r.baselines["read_gbps"] = gbps(bytes, median(td[1]));
      r.extra["fraction_of_read"] = r.extra["gbps"] / r.baselines["read_gbps"];
      return r;
    };
    CaseResult r = decode_case(hd, "decode_alibi_h32_n" + std::to_string(jd) + "_d128");
    r.note = "i = 1 against j cached keys; read_gbps = reading the K and V bytes (GB/s, not ms)";
    out.push_back(r);

    // The same decode with grouped-query attention (8 kv heads for the 32
    // query heads, as Llama-2-70B and Mistral): a quarter of the bytes.
    CaseResult g = decode_case(8, "decode_gqa_alibi_h32_hk8_n" + std::to_string(jd) + "_d128");
    g.baselines["multi_head_ms"] = r.median_ms;
    g.extra["speedup_over_multi_head"] = r.median_ms / g.median_ms;
    g.note =
        "i = 1, 32 query heads on 8 kv heads; read_gbps = reading its K and V bytes; "
        "multi_head_ms = the case above (hk 32), not interleaved with this one";
    out.push_back(g);
  }
  return out;
}

}  // namespace

std::vector<CaseResult> run_suite(const std::string& suite, const BenchOptions& options,
                                  std::ostream& out) {
  if (options.repetitions < 1 || options.warmup < 0) {
    throw std::invalid_argument("bench: repetitions must be >= 1 and warmup >= 0, got " +
                                std::to_string(options.repetitions) + " and " +
                                std::to_string(options.warmup));
  }
  std::vector<CaseResult> results;
  if (suite == "alibi") {
    results = alibi_suite(options);
  } else if (suite == "dpb") {
    results = dpb_suite(options);
  } else if (suite == "attention") {
    results = attention_suite(options);
  } else {
    throw std::invalid_argument("unknown benchmark suite '" + suite + "' (known: " + suite_list() +
                                ")");
  }
  if (options.json) {
    for (const CaseResult& r : results) print_json(r, out);
  } else {
    print_table(results, out);
  }
  return results;
}

}  // namespace posbias::bench
