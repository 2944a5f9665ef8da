// `posbias demo`'s last section: attention at a long sequence with the bias
// materialised and fused, each variant timed in a child process of its own
// (benchmarks/child_measure.h) so that its peak memory is its own.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "child_measure.h"
#include "demo_script.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias::cli::demo {
namespace {

// A line on stderr that redraws itself: "[#####.....] what (k/n) 3.1 s".
// Drawn only when enabled (by default when stderr is a terminal), so that
// logs and pipes get the demo's text and nothing else.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int total) : enabled_(enabled), total_(std::max(1, total)) {}
  ~ProgressBar() { finish(); }

  void step(const std::string& what) {
    what_ = what;
    ++done_;
    draw();
  }
  void label(const std::string& what) {
    what_ = what;
    draw();
  }
  void finish() {
    if (enabled_ && drawn_) std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }

 private:
  void draw() {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = kWidth * std::min(done_, total_) / total_;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::cerr << "\r\033[K[" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << what_
              << " (" << std::min(done_, total_) << "/" << total_ << ") " << fixed(seconds, 1)
              << " s" << std::flush;
    drawn_ = true;
  }

  bool enabled_;
  int total_;
  int done_ = 0;
  bool drawn_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// One timed variant: `reps` runs of `body` in a child process (its peak
// memory is the child's growth over its start); the last run's output is
// copied to `result` (shared memory) for the parent to compare.
struct VariantRun {
  bool ok = false;
  std::string error;
  std::vector<double> ms;
  double peak_growth = -1;  // bytes
  double median_ms() const {
    std::vector<double> t = ms;
    std::sort(t.begin(), t.end());
    return t.empty() ? 0 : t[t.size() / 2];
  }
};

VariantRun run_variant(const std::function<Tensor()>& body, int reps, float* result,
                       std::int64_t result_size, ProgressBar& bar, const std::string& name) {
  int done = 0;
  const bench::ChildResult child = bench::run_in_child(
      [&](bench::ChildReport& report) {
        Tensor out;
        for (int k = 0; k < reps; ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          out = body();
          const auto t1 = std::chrono::steady_clock::now();
          report.time_ms(std::chrono::duration<double, std::milli>(t1 - t0).count());
          if (k + 1 < reps) out = Tensor();  // free it before the next run, as a caller would
        }
        const std::vector<float> v = out.to_float_vector();
        if (static_cast<std::int64_t>(v.size()) == result_size) {
          std::copy(v.begin(), v.end(), result);
        }
      },
      [&](double) {
        ++done;
        bar.step(name + ", run " + std::to_string(done) + " of " + std::to_string(reps));
      });
  VariantRun run;
  run.ms = child.times_ms;
  run.peak_growth = child.peak_growth;
  run.ok = child.ok && static_cast<int>(run.ms.size()) == reps;
  run.error = child.ok && !run.ok ? "the child process reported too few runs" : child.error;
  return run;
}

}  // namespace

// Attention at a long sequence: the bias materialised as a tensor, then
// fused into the kernel.
void Demo::fused_attention() {
  const std::int64_t n = options_.attention_length;
  const std::int64_t h = 8, d = 64;
  const int reps = options_.repetitions;
  say("== Why the fused attention matters ==");
  say("Causal attention with ALiBi, q, k, v [1, " + std::to_string(h) + ", " + std::to_string(n) +
      ", " + std::to_string(d) + "] float32 (N(0, 1), seed 7):");
  say("  materialised: bias = alibi_bias(slopes, " + std::to_string(h) + ", " +
      std::to_string(n) + ", " + std::to_string(n) + ") (" +
      mib(4.0 * static_cast<double>(h * n * n)) + "),");
  say("                then attention_forward(q, k, v, dense_bias(bias)), as a framework");
  say("                without a fused kernel does (one new bias per call);");
  say("  fused:        attention_forward(q, k, v, AttentionBias::alibi(slopes)): the");
  say("                kernel computes -slope * |c - q_r| as it goes, nothing stored.");
  say("  Each runs " + std::to_string(reps) +
      " times in a child process of its own; time is the median run, peak");
  say("  memory the growth of the child's resident set (VmHWM) over its start.");
  AttentionShape shape;
  shape.h = h;
  shape.hk = h;
  shape.i = n;
  shape.j = n;
  shape.d = d;
  const AttentionInputs in = random_attention_inputs(shape, false, 7);
  const std::vector<float> slopes = alibi_slopes(h);
  AttentionOptions opt;
  opt.causal = true;
  const std::int64_t out_size = h * n * d;
  const std::size_t bytes = static_cast<std::size_t>(2 * out_size) * sizeof(float);
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("mmap of the result buffers failed");
  float* out_materialised = static_cast<float*>(shared);
  float* out_fused = out_materialised + out_size;
  std::fill(out_materialised, out_materialised + 2 * out_size, std::nanf(""));

  ProgressBar bar(options_.progress, 2 * reps);
  bar.label("attention, materialised bias");
  const VariantRun materialised = run_variant(
      [&] {
        const Tensor bias = alibi_bias(slopes, h, n, n);
        return attention_forward(in.q, in.k, in.v, AttentionBias::dense_bias(bias), opt);
      },
      reps, out_materialised, out_size, bar, "attention, materialised bias");
  const VariantRun fused = run_variant(
      [&] { return attention_forward(in.q, in.k, in.v, AttentionBias::alibi(slopes), opt); },
      reps, out_fused, out_size, bar, "attention, fused bias");
  bar.finish();

  check(materialised.ok, "the materialised run (" + materialised.error + ")");
  check(fused.ok, "the fused run (" + fused.error + ")");
  if (materialised.ok && fused.ok) {
    double max_diff = 0;
    for (std::int64_t k = 0; k < out_size; ++k) {
      max_diff =
          std::max(max_diff, static_cast<double>(std::fabs(out_materialised[k] - out_fused[k])));
    }
    const double io = 4.0 * static_cast<double>(out_size) * sizeof(float);
    out_ << "\n  variant        median time   peak memory growth\n";
    out_ << "  materialised   " << fixed(materialised.median_ms(), 1) << " ms"
         << std::string(static_cast<std::size_t>(std::max(
                            1, 10 - static_cast<int>(fixed(materialised.median_ms(), 1).size()))),
                        ' ')
         << mib(materialised.peak_growth) << "\n";
    out_ << "  fused          " << fixed(fused.median_ms(), 1) << " ms"
         << std::string(static_cast<std::size_t>(std::max(
                            1, 10 - static_cast<int>(fixed(fused.median_ms(), 1).size()))),
                        ' ')
         << mib(fused.peak_growth) << "\n\n";
    say("  The fused call is " + fixed(materialised.median_ms() / fused.median_ms(), 2) +
        "x as fast and needs " +
        fixed(materialised.peak_growth / std::max(1.0, fused.peak_growth), 1) +
        "x less memory on top of its inputs (q, k, v and out are " + mib(io) + ").");
    say("  The two outputs agree: largest difference " +
        format_float_roundtrip(static_cast<float>(max_diff)) + " over " +
        std::to_string(out_size) + " values.");
    say("  The materialised bias grows as h * n^2: at n = 32768 it would be " +
        mib(4.0 * static_cast<double>(h) * 32768.0 * 32768.0) + "; the fused");
    say("  kernel's extra memory grows with n only (per-thread packing of K and V).");
    check(max_diff <= 1e-4, "fused == materialised to 1e-4");
    check(materialised.peak_growth >= 4.0 * static_cast<double>(h * n * n) * 0.9,
          "the materialised run holds the whole bias");
    check(materialised.peak_growth - fused.peak_growth >=
              0.5 * 4.0 * static_cast<double>(h * n * n),
          "the materialised run needs the bias's size more than the fused one");
  }
  munmap(shared, bytes);
  say("");
}

}  // namespace posbias::cli::demo
