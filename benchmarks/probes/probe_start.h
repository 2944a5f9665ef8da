// The start shared by the stand-alone memory probes (read_with_work.cc,
// decode_walk.cc): their one optional argument, a size in MiB, and the
// check that the CPU has the AVX2 and FMA their loops are written in.
#ifndef POSBIAS_BENCHMARKS_PROBES_PROBE_START_H_
#define POSBIAS_BENCHMARKS_PROBES_PROBE_START_H_

#include <unistd.h>

#include <cstdio>

namespace posbias::probes {

// Reads argv's optional MiB into *mib. Without one, *mib keeps its default
// or, where the last-level cache is larger (sysconf), takes its size (up to
// max_mib), so that each buffer of that size passes it: the 128 MiB
// buffers of decode_walk stayed partly in the 300 MiB L3 of an Emerald
// Rapids Xeon between rounds. Returns 0 to go on, or 2 after a message on
// stderr: a second argument, an argument that is not a number in [64,
// max_mib], or a CPU without AVX2 and FMA.
inline int ProbeStart(int argc, char** argv, long max_mib, long* mib) {
  if (argc > 2 ||
      (argc == 2 && (std::sscanf(argv[1], "%ld", mib) != 1 || *mib < 64 || *mib > max_mib))) {
    std::fprintf(stderr, "usage: %s [MiB], 64 <= MiB <= %ld (got %s)\n", argv[0], max_mib,
                 argc > 1 ? argv[1] : "");
    return 2;
  }
  if (argc == 1) {
    const long llc_mib = sysconf(_SC_LEVEL3_CACHE_SIZE) >> 20;
    if (llc_mib > *mib) *mib = llc_mib < max_mib ? llc_mib : max_mib;
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "%s: this CPU has no AVX2 and FMA\n", argv[0]);
    return 2;
  }
  return 0;
}

}  // namespace posbias::probes

#endif  // POSBIAS_BENCHMARKS_PROBES_PROBE_START_H_
