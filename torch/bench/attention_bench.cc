// posbias_torch_bench: the attention op against the core call and the
// backward against PyTorch's, in one run (medians of --reps runs; ratios).
//
//   posbias_torch_bench [--heads 16] [--n 2048] [--d 64] [--reps 5] [--threads N]
//
// Threads: LibTorch starts with one thread per physical core (1 on a 2-vCPU
// machine with hyper-threads) and sets OpenMP's count, which the core uses
// too; --threads N calls at::set_num_threads(N) for both.
//
// Cases (causal ALiBi, b = 1, q, k, v [1, h, n, d] float32):
//   core forward       posbias::attention_forward on posbias::Tensor inputs
//   op forward         posbias::ops::attention_cpu (torch tensors, no autograd)
//   op forward (grad)  posbias::ops::attention with inputs requiring grad
//   op backward        .backward() of the op's output (posbias::attention_backward)
//   torch backward     .backward() of the plain PyTorch reference: matmul,
//                      materialised ALiBi bias, causal mask, softmax, matmul
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <omp.h>

#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "posbias/torch.h"

namespace {

double median_ms(const std::function<void()>& setup, const std::function<void()>& timed,
                 int reps) {
  std::vector<double> ms;
  for (int r = 0; r < reps + 1; ++r) {
    setup();
    const auto t0 = std::chrono::steady_clock::now();
    timed();
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& bias, const torch::Tensor& mask) {
  auto s = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  s = (s + bias).masked_fill(mask, -INFINITY);
  return torch::matmul(torch::softmax(s, -1), v);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t h = 16, n = 2048, d = 64;
  int reps = 5;
  int threads = 0;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string key = argv[a];
    const long long val = std::atoll(argv[a + 1]);
    if (key == "--heads") h = val;
    else if (key == "--n") n = val;
    else if (key == "--d") d = val;
    else if (key == "--reps") reps = static_cast<int>(val);
    else if (key == "--threads") threads = static_cast<int>(val);
    else {
      std::fprintf(stderr, "posbias_torch_bench: error: unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (threads > 0) at::set_num_threads(threads);
  torch::manual_seed(0);
  const auto q = torch::randn({1, h, n, d});
  const auto k = torch::randn({1, h, n, d});
  const auto v = torch::randn({1, h, n, d});
  const auto go = torch::randn({1, h, n, d});
  const auto slopes = posbias::ops::alibi_slopes(h);
  std::printf(
      "attention h%lld i=j=%lld d%lld causal ALiBi, float32, torch threads %d, OpenMP threads "
      "%d\n",
      static_cast<long long>(h), static_cast<long long>(n), static_cast<long long>(d),
      at::get_num_threads(), omp_get_max_threads());

  // Core call on posbias::Tensor copies of the same values.
  auto to_core = [](const torch::Tensor& t) {
    const auto c = t.contiguous();
    return posbias::Tensor::from_vector(
        c.sizes().vec(), std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel()));
  };
  const posbias::Tensor cq = to_core(q), ck = to_core(k), cv = to_core(v);
  posbias::AttentionOptions opt;
  opt.causal = true;
  const auto bias = posbias::AttentionBias::alibi(posbias::alibi_slopes(h));
  const auto nothing = [] {};
  const double core_fwd = median_ms(nothing, [&] { posbias::attention_forward(cq, ck, cv, bias, opt); }, reps);
  const double op_fwd = median_ms(nothing, [&] {
    posbias::ops::attention_cpu(q, k, v, "alibi", slopes, c10::nullopt, c10::nullopt, c10::nullopt, true);
  }, reps);

  torch::Tensor ql, kl, vl, out;
  const double op_fwd_grad = median_ms(
      [&] {
        ql = q.clone().requires_grad_();
        kl = k.clone().requires_grad_();
        vl = v.clone().requires_grad_();
      },
      [&] {
        out = posbias::ops::attention(ql, kl, vl, "alibi", slopes, c10::nullopt, c10::nullopt,
                                      c10::nullopt, true);
      },
      reps);
  const double op_bwd = median_ms(
      [&] {
        ql = q.clone().requires_grad_();
        kl = k.clone().requires_grad_();
        vl = v.clone().requires_grad_();
        out = posbias::ops::attention(ql, kl, vl, "alibi", slopes, c10::nullopt, c10::nullopt,
                                      c10::nullopt, true);
      },
      [&] { out.backward(go); }, reps);

  const auto qp = torch::arange(0, n).unsqueeze(1);
  const auto cp = torch::arange(0, n).unsqueeze(0);
  const auto dense = -slopes.view({-1, 1, 1}) * (cp - qp).abs().to(torch::kFloat).unsqueeze(0);
  const auto mask = cp > qp;
  torch::Tensor ref_out;
  const double ref_fwd = median_ms(
      [&] {
        ql = q.clone().requires_grad_();
        kl = k.clone().requires_grad_();
        vl = v.clone().requires_grad_();
      },
      [&] { ref_out = reference(ql, kl, vl, dense, mask); }, reps);
  const double ref_bwd = median_ms(
      [&] {
        ql = q.clone().requires_grad_();
        kl = k.clone().requires_grad_();
        vl = v.clone().requires_grad_();
        ref_out = reference(ql, kl, vl, dense, mask);
      },
      [&] { ref_out.backward(go); }, reps);
  // Agreement of the two gradients (same inputs).
  auto q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(),
       v1 = v.clone().requires_grad_();
  posbias::ops::attention(q1, k1, v1, "alibi", slopes, c10::nullopt, c10::nullopt, c10::nullopt,
                          true)
      .backward(go);
  auto q2 = q.clone().requires_grad_(), k2 = k.clone().requires_grad_(),
       v2 = v.clone().requires_grad_();
  reference(q2, k2, v2, dense, mask).backward(go);
  const double dq_diff = (q1.grad() - q2.grad()).abs().max().item<double>();
  const double dk_diff = (k1.grad() - k2.grad()).abs().max().item<double>();

  std::printf("%-34s %10s %10s\n", "case", "median ms", "ratio");
  std::printf("%-34s %10.2f %10s\n", "core attention_forward", core_fwd, "1.00");
  std::printf("%-34s %10.2f %10.3f  (vs core)\n", "op forward (no grad)", op_fwd, op_fwd / core_fwd);
  std::printf("%-34s %10.2f %10.3f  (vs core)\n", "op forward (inputs need grad)", op_fwd_grad,
              op_fwd_grad / core_fwd);
  std::printf("%-34s %10.2f %10.3f  (vs torch)\n", "torch reference forward", ref_fwd, ref_fwd / op_fwd_grad);
  std::printf("%-34s %10.2f %10s\n", "op backward", op_bwd, "1.00");
  std::printf("%-34s %10.2f %10.3f  (torch / op: op is this many times faster)\n",
              "torch reference backward", ref_bwd, ref_bwd / op_bwd);
  std::printf("max |dq op - dq torch| %.3g, max |dk op - dk torch| %.3g\n", dq_diff, dk_diff);
  return 0;
}
