#include "openblas_core.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

extern "C" char* openblas_get_corename(void);

namespace posbias::bench {

std::string openblas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

std::string openblas_kernels() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return openblas_core() + " kernels" +
         (set != nullptr && *set != '\0' ? ", chosen by OPENBLAS_CORETYPE" : "");
}

void run_with_this_cpus_openblas(char** argv) {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set != nullptr && *set != '\0') return;  // the caller's choice (or our own re-run)
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool avx512 = false, avx2_fma = false;
#endif
  const std::string chosen = openblas_core();
  const std::string want = openblas_core_for(chosen, avx512, avx2_fma);
  if (want.empty()) return;
  if (setenv("OPENBLAS_CORETYPE", want.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed: go on with OpenBLAS's own kernels (the sgemm notes name them)
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace posbias::bench
