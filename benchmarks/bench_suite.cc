#include "bench_suite.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "baselines.h"
#include "bench_report.h"
#include "posbias/alibi.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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
  results.erase(std::remove_if(results.begin(), results.end(),
                               [&](const CaseResult& r) { return !options.wants(r.name); }),
                results.end());
  if (options.json) {
    for (const CaseResult& r : results) print_json(r, out);
  } else {
    print_table(results, out);
  }
  return results;
}

}  // namespace posbias::bench
