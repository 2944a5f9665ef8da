// Internal: how the decode passes (attention_decode*-inl.h) prefetch the
// K and V rows they will read, per CPU. Not installed.
//
// A decode pass reads each row once, from memory, and prefetches in
// software the row it will read about `ahead_bytes` later in its own walk
// (the hardware's stream prefetchers start again at every 4 KiB page). How
// far, and into which cache, is a property of the core, measured on each
// (docs/performance-notes.md, twenty-seventh round):
//
//   - AMD (Zen 1, Zen 3, Zen 5): PREFETCHT0 (into L1) 4 KiB ahead.
//     Shorter and longer distances, and PREFETCHT1 at 4 and 8 KiB,
//     measured the same or slower there.
//   - AMD Zen 4 (family 25 with AVX-512): PREFETCHT1 8 KiB ahead. At
//     PREFETCHT0 4 KiB its grouped-query and paged decodes took 1.5x and
//     1.4x the time (8 alternated rounds; PREFETCHT1 at 6 to 16 KiB
//     measured within 5% of 8 KiB), the float32 and 16-bit ones about the
//     same. There the one-row float32 value pass also prefetches
//     (f32_value_prefetch; twenty-ninth round).
//   - Intel (a Sapphire Rapids class Xeon): PREFETCHT1 (into L2) 3 KiB
//     ahead. At PREFETCHT0 4 KiB its grouped-query decode read 0.74-0.76
//     of a plain read of the same bytes; at PREFETCHT1 3 KiB, 0.92-0.96
//     (and at PREFETCHT1 4 KiB 0.77: a page ahead is what hurts there).
//
// The grouped-query value tile (four query rows of one kv head) walks its
// keys in groups, the group's rows prefetched in one burst: 8 keys on AMD
// (4 measured 1.02-1.18x the time on a Zen 5), 4 on Intel (0.90-0.93x the
// time of 8 there).
//
// POSBIAS_DECODE_PREFETCH=t0:BYTES or t1:BYTES (64 <= BYTES <= 32768),
// optionally :4 or :8 after it (the value group), overrides the choice for
// the process, to measure a new CPU without a rebuild (scripts/alternate.py
// runs two settings in turn).
#ifndef POSBIAS_SRC_KERNELS_DECODE_PREFETCH_H_
#define POSBIAS_SRC_KERNELS_DECODE_PREFETCH_H_

#include <cstdint>

namespace posbias::detail {

struct DecodePrefetch {
  bool to_l2 = false;               // PREFETCHT1 rather than PREFETCHT0
  std::int64_t ahead_bytes = 4096;  // how far ahead in the pass's walk
  // Keys per group of the four-row value tile on AVX-512 (its prefetches
  // go in one burst per group): 8, or 4 on Intel.
  std::int64_t value_group = 8;
  // Whether the one-row value pass of float32 rows on AVX-512 prefetches
  // the row ahead before each key (DecPVDenseRow): on Zen 4 only, where
  // it took 0.90-0.93x the time of the walk without; on a Zen 5 the
  // prefetching tile had taken 1.05-1.2x (twenty-fifth round).
  bool f32_value_prefetch = false;
};

// The CPUs whose settings differ (cpu_kind()).
enum class DecodeCpu { kOther, kIntel, kZen4 };

// The setting for a CPU kind and an override text (null or empty: none;
// the override sets the cache, the distance and the value group, and
// leaves f32_value_prefetch as the CPU has it). Throws
// std::invalid_argument, with the text, for an override not of the form
// t0:BYTES or t1:BYTES with 64 <= BYTES <= 32768, optionally followed by
// :4 or :8.
DecodePrefetch parse_decode_prefetch(const char* override_text, DecodeCpu cpu);

// This CPU's kind: kIntel for the vendor GenuineIntel, kZen4 for
// AuthenticAMD family 25 (0x19) with AVX-512F (Zen 3 is family 25 without
// it), else kOther (and off x86).
DecodeCpu cpu_kind();

// This process's setting: parse_decode_prefetch of POSBIAS_DECODE_PREFETCH
// and this CPU, found on the first call (which throws what the parse
// throws, and so does every call while the variable is bad). Callers take
// it before their parallel region (an exception must not leave one).
const DecodePrefetch& decode_prefetch();

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_DECODE_PREFETCH_H_
