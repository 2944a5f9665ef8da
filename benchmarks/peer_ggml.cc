// ggml's CPU flash attention as a same-run peer (peer_ggml.h).
#include "peer_ggml.h"

#include <dirent.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "baselines.h"
#include "posbias/dtype.h"

namespace posbias::bench {

namespace ggml {
// The calls and types used here, as ggml's public headers declare them
// (ggml.h, ggml-backend.h, ggml-cpu.h). Handles are opaque.
struct Context;
struct TensorT;
struct Graph;
struct Backend;
struct Buffer;
struct InitParams {  // struct ggml_init_params, passed by value
  std::size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
constexpr int kF32 = 0, kF16 = 1, kBF16 = 30;  // enum ggml_type
}  // namespace ggml

struct GgmlPeer::Api {
  void* base = nullptr;  // libggml-base.so
  void* cpu = nullptr;   // the chosen libggml-cpu-<core>.so
  ggml::Context* (*init)(ggml::InitParams) = nullptr;
  void (*free_ctx)(ggml::Context*) = nullptr;
  ggml::TensorT* (*new_tensor_4d)(ggml::Context*, int, std::int64_t, std::int64_t, std::int64_t,
                                  std::int64_t) = nullptr;
  ggml::TensorT* (*flash_attn_ext)(ggml::Context*, ggml::TensorT*, ggml::TensorT*, ggml::TensorT*,
                                   ggml::TensorT*, float, float, float) = nullptr;
  ggml::Graph* (*new_graph)(ggml::Context*) = nullptr;
  void (*build_forward_expand)(ggml::Graph*, ggml::TensorT*) = nullptr;
  std::size_t (*nbytes)(const ggml::TensorT*) = nullptr;
  const char* (*version)() = nullptr;
  const char* (*commit)() = nullptr;
  ggml::Buffer* (*buffer_from_ptr)(void*, std::size_t) = nullptr;
  int (*tensor_alloc)(ggml::Buffer*, ggml::TensorT*, void*) = nullptr;
  void (*buffer_free)(ggml::Buffer*) = nullptr;
  int (*graph_compute)(ggml::Backend*, ggml::Graph*) = nullptr;
  void (*backend_free)(ggml::Backend*) = nullptr;
  ggml::Backend* (*cpu_init)() = nullptr;
  void (*cpu_set_n_threads)(ggml::Backend*, int) = nullptr;

  // The libraries stay loaded until the process ends (no dlclose, here or
  // in best_cpu_library): ggml's CPU libraries allocate at load time and
  // keep the pointers in their own globals, which dlclose unmaps, so that
  // LeakSanitizer then reported those blocks as leaks (the bench's tests
  // in the sanitizer build, after scripts/fetch-ggml.sh).
};

namespace {

// The directory of the libraries: $POSBIAS_GGML_DIR, else the source
// tree's third_party/ggml (scripts/fetch-ggml.sh).
std::string ggml_dir() {
  if (const char* env = std::getenv("POSBIAS_GGML_DIR"); env != nullptr && *env != '\0') return env;
#ifdef POSBIAS_GGML_DEFAULT_DIR
  return POSBIAS_GGML_DEFAULT_DIR;
#else
  return "";
#endif
}

// dlsym into fn; false (why set) when the symbol is missing.
template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string* why) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) *why = std::string("ggml library lacks ") + name;
  return fn != nullptr;
}

// The CPU library variant this machine scores highest (ggml_backend_score
// of each libggml-cpu-*.so: 0 where the core lacks its instructions), as
// llama.cpp's own loader picks it.
void* best_cpu_library(const std::string& dir, std::string* chosen) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return nullptr;
  void* best = nullptr;
  int best_score = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("libggml-cpu", 0) != 0 || name.size() < 3 ||
        name.compare(name.size() - 3, 3, ".so") != 0) {
      continue;
    }
    void* lib = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) continue;
    auto score = reinterpret_cast<int (*)()>(dlsym(lib, "ggml_backend_score"));
    const int s = score != nullptr ? score() : 0;
    if (s > best_score) {  // the others stay loaded (see Api)
      best = lib;
      best_score = s;
      *chosen = name;
    }
  }
  closedir(d);
  return best;
}

int ggml_type_of(DType t) {
  if (t == DType::kFloat32) return ggml::kF32;
  if (t == DType::kFloat16) return ggml::kF16;
  if (t == DType::kBFloat16) return ggml::kBF16;
  throw std::invalid_argument("ggml peer: no ggml type for " + std::string(dtype_name(t)));
}

// Rows of the mask: ggml wants at least the query rows rounded up to its
// GGML_KQ_MASK_PAD (64 in the releases that pad; more rows are allowed).
constexpr std::int64_t kMaskPad = 64;

// The largest difference from posbias's output that still counts as the
// same attention (ggml rounds the mask, and with 16-bit K and V q or P V,
// to 16 bits).
constexpr double kGgmlTolerance = 1e-2;

}  // namespace

struct GgmlCall::State {
  const GgmlPeer::Api* api = nullptr;  // the peer's (it outlives its calls)
  ggml::Context* ctx = nullptr;
  ggml::Backend* backend = nullptr;
  ggml::Graph* graph = nullptr;
  std::vector<ggml::Buffer*> buffers;
  Tensor mask, out;  // storage ggml reads and writes (64-byte aligned)

  ~State() {
    for (ggml::Buffer* b : buffers) api->buffer_free(b);
    if (backend != nullptr) api->backend_free(backend);
    if (ctx != nullptr) api->free_ctx(ctx);
  }

  // tensor's data at `data` (bytes of its own, wrapped as a CPU buffer).
  void place(ggml::TensorT* tensor, const void* data) {
    void* p = const_cast<void*>(data);  // ggml writes only the output
    ggml::Buffer* b = api->buffer_from_ptr(p, api->nbytes(tensor));
    if (b == nullptr) throw std::runtime_error("ggml peer: ggml_backend_cpu_buffer_from_ptr failed");
    buffers.push_back(b);
    if (api->tensor_alloc(b, tensor, p) != 0) {
      throw std::runtime_error("ggml peer: ggml_backend_tensor_alloc failed");
    }
  }
};

std::shared_ptr<GgmlPeer> GgmlPeer::load(std::string* why) {
  const std::string dir = ggml_dir();
  if (dir.empty()) {
    *why = "ggml peer: no library directory (set POSBIAS_GGML_DIR)";
    return nullptr;
  }
  std::shared_ptr<GgmlPeer> peer(new GgmlPeer());
  peer->api_ = std::make_unique<Api>();
  Api& a = *peer->api_;
  a.base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (a.base == nullptr) {
    *why = "ggml peer not installed (bash scripts/fetch-ggml.sh): no " + dir + "/libggml-base.so";
    return nullptr;
  }
  a.cpu = best_cpu_library(dir, &peer->library_);
  if (a.cpu == nullptr) {
    *why = "ggml peer: no libggml-cpu-*.so in " + dir + " runs on this CPU";
    return nullptr;
  }
  const bool ok =
      resolve(a.base, "ggml_init", a.init, why) && resolve(a.base, "ggml_free", a.free_ctx, why) &&
      resolve(a.base, "ggml_new_tensor_4d", a.new_tensor_4d, why) &&
      resolve(a.base, "ggml_flash_attn_ext", a.flash_attn_ext, why) &&
      resolve(a.base, "ggml_new_graph", a.new_graph, why) &&
      resolve(a.base, "ggml_build_forward_expand", a.build_forward_expand, why) &&
      resolve(a.base, "ggml_nbytes", a.nbytes, why) &&
      resolve(a.base, "ggml_version", a.version, why) &&
      resolve(a.base, "ggml_commit", a.commit, why) &&
      resolve(a.base, "ggml_backend_cpu_buffer_from_ptr", a.buffer_from_ptr, why) &&
      resolve(a.base, "ggml_backend_tensor_alloc", a.tensor_alloc, why) &&
      resolve(a.base, "ggml_backend_buffer_free", a.buffer_free, why) &&
      resolve(a.base, "ggml_backend_graph_compute", a.graph_compute, why) &&
      resolve(a.base, "ggml_backend_free", a.backend_free, why) &&
      resolve(a.cpu, "ggml_backend_cpu_init", a.cpu_init, why) &&
      resolve(a.cpu, "ggml_backend_cpu_set_n_threads", a.cpu_set_n_threads, why);
  if (!ok) return nullptr;
  peer->threads_ = omp_get_max_threads();
  return peer;
}

GgmlPeer::~GgmlPeer() = default;

std::string GgmlPeer::describe() const {
  return "ggml " + std::string(api_->version()) + " (" + api_->commit() + "), " + library_ + ", " +
         std::to_string(threads_) + " threads";
}

std::unique_ptr<GgmlCall> GgmlPeer::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               bool causal) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(0) != 1 ||
      q.dtype() != DType::kFloat32 || !q.is_contiguous() || !k.is_contiguous() ||
      !v.is_contiguous() || k.shape() != v.shape() || k.dtype() != v.dtype() || k.size(0) != 1 ||
      k.size(3) != q.size(3) || q.size(1) % k.size(1) != 0 || q.size(2) > k.size(2)) {
    throw std::invalid_argument(
        "ggml peer: wants q [1, h, i, d] float32, k = v [1, hk, j, d], i <= j");
  }
  const std::int64_t h = q.size(1), i = q.size(2), hk = k.size(1), j = k.size(2), d = q.size(3);
  std::unique_ptr<GgmlCall> call(new GgmlCall());
  call->s_ = std::make_unique<GgmlCall::State>();
  GgmlCall::State& s = *call->s_;
  s.api = api_.get();
  const Api& a = *api_;
  s.ctx = a.init({std::size_t{16} << 20, nullptr, true});  // objects only: no_alloc
  if (s.ctx == nullptr) throw std::runtime_error("ggml peer: ggml_init failed");
  const std::int64_t mask_rows = (i + kMaskPad - 1) / kMaskPad * kMaskPad;
  ggml::TensorT* tq = a.new_tensor_4d(s.ctx, ggml::kF32, d, i, h, 1);
  ggml::TensorT* tk = a.new_tensor_4d(s.ctx, ggml_type_of(k.dtype()), d, j, hk, 1);
  ggml::TensorT* tv = a.new_tensor_4d(s.ctx, ggml_type_of(v.dtype()), d, j, hk, 1);
  ggml::TensorT* tm = a.new_tensor_4d(s.ctx, ggml::kF16, j, mask_rows, 1, 1);
  ggml::TensorT* to = a.flash_attn_ext(s.ctx, tq, tk, tv, tm,
                                       1.0f / std::sqrt(static_cast<float>(d)), 8.0f, 0.0f);
  s.graph = a.new_graph(s.ctx);
  a.build_forward_expand(s.graph, to);
  // llama.cpp's KQ mask of an ALiBi model, times each head's slope in the
  // kernel: -|p_q - p_k| for the keys a query sees (row r sits at key
  // position j - i + r), -inf for those a causal query does not.
  std::vector<float> mask(static_cast<std::size_t>(mask_rows * j));
  for (std::int64_t r = 0; r < mask_rows; ++r) {
    const std::int64_t pos = j - i + std::min(r, i - 1);
    for (std::int64_t c = 0; c < j; ++c) {
      mask[r * j + c] = causal && c > pos ? -INFINITY : -static_cast<float>(std::abs(pos - c));
    }
  }
  s.mask = Tensor::from_vector({mask_rows, j}, mask).to(DType::kFloat16);
  s.out = Tensor::empty({i, h, d}, DType::kFloat32);  // ggml's order [d, h, i]
  if (a.nbytes(to) != static_cast<std::size_t>(h * i * d) * sizeof(float)) {
    throw std::runtime_error("ggml peer: unexpected output size");
  }
  s.place(tq, q.raw_data());
  s.place(tk, k.raw_data());
  s.place(tv, v.raw_data());
  s.place(tm, s.mask.raw_data());
  s.place(to, s.out.raw_mutable_data());
  s.backend = a.cpu_init();
  if (s.backend == nullptr) throw std::runtime_error("ggml peer: ggml_backend_cpu_init failed");
  // No persistent thread pool: its threads poll for work between calls
  // and took the cores from the calls interleaved with them (every case
  // and the read ran 2-3x slower in the same rounds). Without one, the
  // backend starts its threads for each call and joins them after (tens
  // of microseconds against calls of milliseconds; a pool paused between
  // calls timed the same).
  a.cpu_set_n_threads(s.backend, threads_);
  return call;
}

GgmlCall::~GgmlCall() = default;

void GgmlCall::run() {
  if (s_->api->graph_compute(s_->backend, s_->graph) != 0) {
    throw std::runtime_error("ggml peer: ggml_backend_graph_compute failed");
  }
}

std::vector<float> GgmlCall::output() const {
  return s_->out.transpose(0, 1).contiguous_copy().to_float_vector();  // [h, i, d]
}

GgmlCompared ggml_compared(GgmlPeer* peer, const Tensor& q, const Tensor& k, const Tensor& v,
                           bool causal, const Tensor& ours) {
  GgmlCompared g;
  if (peer == nullptr) return g;
  g.call = peer->attention(q, k, v, causal);
  g.call->run();
  const std::vector<float> theirs = g.call->output();
  const std::vector<float> mine = ours.to_float_vector();
  if (theirs.size() != mine.size()) throw std::invalid_argument("ggml peer: output sizes differ");
  for (std::size_t x = 0; x < mine.size(); ++x) {
    g.max_abs_diff = std::max(g.max_abs_diff, static_cast<double>(std::fabs(theirs[x] - mine[x])));
  }
  return g;
}

void add_ggml_baseline(CaseResult& r, const GgmlPeer& peer, const GgmlCompared& g,
                       const std::vector<double>& times_ms) {
  const double ms = median(times_ms);
  r.baselines["ggml_ms"] = ms;
  r.extra["speedup_vs_ggml"] = ms / r.median_ms;
  r.extra["ggml_max_abs_diff"] = g.max_abs_diff;
  r.note += "; ggml_ms = " + peer.describe() + ", same rounds, same tensors";
  // Not the same computation: its time compares nothing. (Seen: 1e-7 with
  // float32 K and V, 5e-4 with 16-bit ones.)
  if (!(g.max_abs_diff <= kGgmlTolerance)) {
    r.error += (r.error.empty() ? "" : "; ") + std::string("ggml's output differs from posbias's by ") +
               std::to_string(g.max_abs_diff);
  }
}

}  // namespace posbias::bench
