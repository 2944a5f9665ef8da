// Trains a DynamicPositionBias in C++ to reproduce a target bias (here an
// ALiBi matrix), with Adam or plain SGD on the mean squared error, and prints
// the loss as it falls. Shows the training loop a user writes around
// DynamicPositionBias::backward:
//
//   train_dpb [--steps N] [--sgd] [--lr LR] [--save FILE]
//
// Exit code 0 when the final loss is at most 1/20 of the first one.
#include <posbias/posbias.h>

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

struct AdamState {
  std::vector<float> m, v;
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  bool sgd = false;
  float lr = 0.01f;
  std::string save_path;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--steps" && a + 1 < argc) {
      steps = std::atoi(argv[++a]);
    } else if (arg == "--sgd") {
      sgd = true;
    } else if (arg == "--lr" && a + 1 < argc) {
      lr = std::strtof(argv[++a], nullptr);
    } else if (arg == "--save" && a + 1 < argc) {
      save_path = argv[++a];
    } else {
      std::cerr << "usage: train_dpb [--steps N] [--sgd] [--lr LR] [--save FILE]\n";
      return 2;
    }
  }
  if (steps < 1 || !(lr > 0.0f)) {
    std::cerr << "train_dpb: --steps must be >= 1 and --lr > 0\n";
    return 2;
  }
  if (sgd && lr == 0.01f) lr = 0.002f;

  const std::int64_t heads = 4, dim = 32, n = 64;
  // Target: ALiBi of 4 heads; the MLP must learn -m_h * |distance| per head.
  const posbias::Tensor target = posbias::alibi_bias(posbias::alibi_slopes(heads), heads, n, n);
  const std::vector<float> want = target.to_float_vector();

  posbias::DynamicPositionBias module(dim, heads, /*seed=*/42);
  std::map<std::string, AdamState> adam;
  const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  const auto count = static_cast<float>(want.size());
  double first_loss = 0, loss = 0;
  std::cout << (sgd ? "SGD" : "Adam") << ", lr " << lr << ", fitting ALiBi (" << heads
            << " heads, " << n << "x" << n << ") with DynamicPositionBias(dim=" << dim
            << ", heads=" << heads << ")\n";
  for (int step = 1; step <= steps; ++step) {
    const std::vector<float> got = module.forward(n, n).to_float_vector();
    // Mean squared error and its gradient with respect to the bias.
    std::vector<float> grad(got.size());
    loss = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      const float d = got[k] - want[k];
      loss += static_cast<double>(d) * d;
      grad[k] = 2.0f * d / count;
    }
    loss /= count;
    if (step == 1) first_loss = loss;
    if (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0 || step == steps) {
      std::cout << "step " << std::setw(5) << step << "  loss " << std::scientific
                << std::setprecision(4) << loss << std::defaultfloat << "\n";
    }
    const posbias::TensorMap grads =
        module.backward(n, n, posbias::Tensor::from_vector({heads, n, n}, grad));
    for (const auto& [name, g] : grads) {
      posbias::Tensor& p = module.mutable_parameter(name);
      float* w = p.mutable_data<float>();
      const float* gw = g.data<float>();
      const auto size = static_cast<std::size_t>(p.numel());
      if (sgd) {
        for (std::size_t k = 0; k < size; ++k) w[k] -= lr * gw[k];
        continue;
      }
      AdamState& s = adam[name];
      s.m.resize(size, 0.0f);
      s.v.resize(size, 0.0f);
      const float c1 = 1.0f - std::pow(beta1, static_cast<float>(step));
      const float c2 = 1.0f - std::pow(beta2, static_cast<float>(step));
      for (std::size_t k = 0; k < size; ++k) {
        s.m[k] = beta1 * s.m[k] + (1.0f - beta1) * gw[k];
        s.v[k] = beta2 * s.v[k] + (1.0f - beta2) * gw[k] * gw[k];
        w[k] -= lr * (s.m[k] / c1) / (std::sqrt(s.v[k] / c2) + eps);
      }
    }
  }
  std::cout << "loss fell from " << first_loss << " to " << loss << " (" << first_loss / loss
            << "x)\n";
  if (!save_path.empty()) {
    module.save(save_path);
    std::cout << "weights saved to " << save_path
              << " (load in PyTorch with safetensors.torch.load_file)\n";
  }
  return loss * 20 <= first_loss ? 0 : 1;
}
