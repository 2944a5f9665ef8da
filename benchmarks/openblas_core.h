// Which kernels OpenBLAS runs in the benchmarks, and how posbias-bench gives
// it this CPU's when its own table does not know the CPU.
//
// A DYNAMIC_ARCH OpenBLAS picks its kernels once, when it loads, from the
// CPU's vendor, family and model; a model its table does not list gets a
// generic core. Debian's OpenBLAS 0.3.21 on a KVM Xeon that reports family 6
// model 207 (Emerald Rapids, AVX-512) chose "Prescott" (SSE3): its sgemm ran
// at 57-61 GFLOP/s on two cores where its SkylakeX kernels, chosen by
// OPENBLAS_CORETYPE, ran at 314, and PyTorch 1.13's float32 matmul (through the same OpenBLAS) at
// 48 against 206 (2026-12-06). Every sgemm roofline and PyTorch peer of the
// bench measured on such a machine was a fifth of what the machine does.
#ifndef POSBIAS_BENCHMARKS_OPENBLAS_CORE_H_
#define POSBIAS_BENCHMARKS_OPENBLAS_CORE_H_

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

namespace posbias::bench {

// The OPENBLAS_CORETYPE to run with, given the core OpenBLAS chose (its
// openblas_get_corename(), any case) and what the CPU has: "" to keep
// OpenBLAS's choice (it is a core with AVX2 and FMA or wider, or the CPU has
// neither), else "SkylakeX" where the CPU has AVX-512 F, VL, BW and DQ (the
// kernels those need) and "Haswell" where it has AVX2 and FMA. Only a
// generic choice is overridden: where OpenBLAS knows the CPU (a Zen 4 taken
// for "Zen", AVX2 kernels) its choice stands, as it stood when the figures
// of earlier runs were taken.
inline std::string openblas_core_for(std::string_view chosen, bool avx512, bool avx2_fma) {
  std::string lower(chosen);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // OpenBLAS's x86-64 cores with AVX2 and FMA kernels (its names, lower case).
  constexpr std::array<std::string_view, 7> kWide = {
      "haswell", "skylakex", "cooperlake", "sapphirerapids", "zen", "excavator", "skylake"};
  if (std::find(kWide.begin(), kWide.end(), lower) != kWide.end()) return "";
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

// The core OpenBLAS runs in this process (openblas_get_corename()).
std::string openblas_core();

// For a baseline's note: "<core> kernels", with ", chosen by
// OPENBLAS_CORETYPE" where that is set (by the caller, or by
// run_with_this_cpus_openblas).
std::string openblas_kernels();

// At the start of posbias-bench's main: where OPENBLAS_CORETYPE is not set
// and openblas_core_for() names a core for this CPU, sets it and runs the
// program again (execv of /proc/self/exe with argv), so that OpenBLAS loads
// with it, in this process and in the PyTorch peers it starts. Returns (and
// the run goes on with OpenBLAS's own choice) where nothing is to change or
// the exec fails.
void run_with_this_cpus_openblas(char** argv);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_OPENBLAS_CORE_H_
