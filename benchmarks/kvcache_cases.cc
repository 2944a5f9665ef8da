// The paged KV-cache cases of the attention suite (issue 17,
// attention_cases.h): decode, chunked append and a chunk of a chunked
// prefill against a paged cache (block_table), each interleaved call by call with the same
// sequences as dense calls on contiguous caches, and the decode with a read of the cache's bytes.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "posbias/attention.h"
#include "posbias/slopes.h"
#include "suite_common.h"

namespace posbias::bench {
namespace {

constexpr std::int64_t kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;

// A paged cache holding sequences of the given lengths (multiples of
// kBlock): k_cache, v_cache [num_blocks, kBlock, kKvHeads, kDim] float32,
// the blocks dealt to the sequences in a shuffled order (as an engine's
// free list leaves them), block_table [b, max_blocks] and cache_seqlens
// [b] int32.
struct PagedCache {
  std::vector<std::int64_t> lengths;
  Tensor k_cache, v_cache, block_table, cache_seqlens;
  std::int64_t max_blocks = 0;
};

PagedCache paged_cache(const std::vector<std::int64_t>& lengths) {
  PagedCache c;
  c.lengths = lengths;
  const auto b = static_cast<std::int64_t>(lengths.size());
  std::int64_t num_blocks = 0;
  for (std::int64_t len : lengths) {
    num_blocks += len / kBlock;
    c.max_blocks = std::max(c.max_blocks, len / kBlock);
  }
  c.k_cache = random_tensor({num_blocks, kBlock, kKvHeads, kDim}, 31);
  c.v_cache = random_tensor({num_blocks, kBlock, kKvHeads, kDim}, 32);
  std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  c.block_table = Tensor::empty({b, c.max_blocks}, DType::kInt32);
  c.cache_seqlens = Tensor::empty({b}, DType::kInt32);
  std::int32_t* table = c.block_table.mutable_data<std::int32_t>();
  std::fill(table, table + b * c.max_blocks, 0);  // unused entries: never read
  std::size_t next = 0;
  for (std::int64_t s = 0; s < b; ++s) {
    const std::int64_t len = lengths[static_cast<std::size_t>(s)];
    c.cache_seqlens.mutable_data<std::int32_t>()[s] = static_cast<std::int32_t>(len);
    for (std::int64_t m = 0; m < len / kBlock; ++m) table[s * c.max_blocks + m] = order[next++];
  }
  return c;
}

// The cache row (block * kBlock + row in it) of sequence s's position pos.
std::int64_t cache_row(const PagedCache& c, std::int64_t s, std::int64_t pos) {
  const std::int32_t* table = c.block_table.data<std::int32_t>() + s * c.max_blocks;
  return table[pos / kBlock] * kBlock + pos % kBlock;
}

// Sequence s's keys (or values) gathered from the paged cache into a
// contiguous dense [1, kKvHeads, len, kDim] tensor: the same bytes as a
// dense call's cache.
Tensor contiguous_copy_of(const PagedCache& c, const Tensor& cache, std::int64_t s) {
  const std::int64_t len = c.lengths[static_cast<std::size_t>(s)];
  Tensor dense = Tensor::empty({1, kKvHeads, len, kDim}, DType::kFloat32);
  const float* src = cache.data<float>();
  float* dst = dense.mutable_data<float>();
  for (std::int64_t pos = 0; pos < len; ++pos) {
    const std::int64_t row = cache_row(c, s, pos);
    for (std::int64_t hh = 0; hh < kKvHeads; ++hh) {
      std::memcpy(dst + (hh * len + pos) * kDim, src + (row * kKvHeads + hh) * kDim,
                  kDim * sizeof(float));
    }
  }
  return dense;
}

// The cache's sequences as slabs [b, max_len, kKvHeads, kDim]
// (flash_attn_with_kvcache without a block table): sequence s's keys (or
// values) at the start of slab s, rows in a page's layout (every kv head
// of a position side by side). Rows past a sequence's length are never
// written nor read.
Tensor slab_copy_of(const PagedCache& c, const Tensor& cache) {
  const auto b = static_cast<std::int64_t>(c.lengths.size());
  const std::int64_t max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
  Tensor slab = Tensor::empty({b, max_len, kKvHeads, kDim}, DType::kFloat32);
  const float* src = cache.data<float>();
  float* dst = slab.mutable_data<float>();
  const std::int64_t row = kKvHeads * kDim;
  for (std::int64_t s = 0; s < b; ++s) {
    for (std::int64_t pos = 0; pos < c.lengths[static_cast<std::size_t>(s)]; ++pos) {
      std::memcpy(dst + (s * max_len + pos) * row, src + cache_row(c, s, pos) * row,
                  static_cast<std::size_t>(row) * sizeof(float));
    }
  }
  return slab;
}

// Sequence s of q [b, i, kHeads, kDim] as the dense [1, kHeads, i, kDim]
// view of the same memory.
Tensor query_view(const Tensor& q, std::int64_t s) {
  const std::int64_t i = q.size(1);
  auto* base = const_cast<float*>(q.data<float>()) + s * i * kHeads * kDim;
  return Tensor::from_blob(base, {1, kHeads, i, kDim}, {i * kHeads * kDim, kDim, kHeads * kDim, 1},
                           DType::kFloat32);
}

// The paged call and the dense calls on contiguous copies, for b sequences
// with i queries each (their last i positions).
struct KvCacheRun {
  PagedCache cache;
  Tensor q;
  std::vector<Tensor> k_dense, v_dense;
  Tensor k_slab, v_slab;
  AttentionBias alibi = AttentionBias::alibi(alibi_slopes(kHeads));

  // dense: make the contiguous copies too (the bench's baseline; a run of
  // the paged call alone needs none).
  KvCacheRun(const std::vector<std::int64_t>& lengths, std::int64_t i, bool dense = true)
      : cache(paged_cache(lengths)),
        q(random_tensor({static_cast<std::int64_t>(lengths.size()), i, kHeads, kDim}, 33)) {
    if (dense) copy_dense();
  }
  // The dense calls' caches (contiguous copies of the paged one) and the
  // slab cache.
  void copy_dense() {
    k_dense.clear();
    v_dense.clear();
    for (std::size_t s = 0; s < cache.lengths.size(); ++s) {
      k_dense.push_back(contiguous_copy_of(cache, cache.k_cache, static_cast<std::int64_t>(s)));
      v_dense.push_back(contiguous_copy_of(cache, cache.v_cache, static_cast<std::int64_t>(s)));
    }
    k_slab = slab_copy_of(cache, cache.k_cache);
    v_slab = slab_copy_of(cache, cache.v_cache);
  }
  void paged() const {
    Tensor out = attention_kvcache_forward(q, cache.k_cache, cache.v_cache, cache.cache_seqlens,
                                           cache.block_table, alibi, causal_options());
  }
  // The same call on the slab cache: the paged call's row layout without
  // its pages.
  void slab() const {
    Tensor out = attention_kvcache_forward(q, k_slab, v_slab, cache.cache_seqlens,
                                           Tensor(),  // no block table
                                           alibi, causal_options());
  }
  void contiguous() const {
    for (std::size_t s = 0; s < k_dense.size(); ++s) {
      AttentionOptions opt = causal_options();
      opt.q_offset = cache.lengths[s] - q.size(1);
      Tensor out = attention_forward(query_view(q, static_cast<std::int64_t>(s)), k_dense[s],
                                     v_dense[s], alibi, opt);
    }
  }
  double flops() const {
    double pairs = 0;
    for (std::int64_t len : cache.lengths) {
      pairs += visible_pairs(q.size(1), len, len - q.size(1), -1, 0);
    }
    return 4.0 * kHeads * kDim * pairs;
  }
};

// The paged decode case's sequence lengths.
std::vector<std::int64_t> paged_decode_lengths() {
  return {32768, 16384, 8192, 4096, 2048, 1024, 512, 512};
}

// The paged append case's shape: keys cached per sequence and queries each
// appends (the full case; --quick takes 1024 and 16).
constexpr std::int64_t kAppendCached = 8192, kAppendNew = 128;

// paged_decode_alibi_b8_h32_hk8_d128_block16.
void paged_decode_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::string name = "paged_decode_alibi_b8_h32_hk8_d128_block16";
  if (!o.wants(name)) return;
  std::vector<std::int64_t> lengths = paged_decode_lengths();
  if (o.quick) {
    for (std::int64_t& len : lengths) len /= 8;
  }
  const KvCacheRun run(lengths, 1);
  const std::size_t bytes = 2 * static_cast<std::size_t>(run.cache.k_cache.numel()) * sizeof(float);
  volatile float sink = 0;
  const auto t = time_interleaved({[&] { run.paged(); }, [&] { run.contiguous(); },
                                   [&] {
                                     sink = sink +
                                            stream_read(run.cache.k_cache.raw_data(), bytes / 2) +
                                            stream_read(run.cache.v_cache.raw_data(), bytes / 2);
                                   },
                                   fma.run(), [&] { run.slab(); }},
                                  o.warmup, o.repetitions);
  fma.record(name, t[3]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["contiguous"] = median(t[1]);
  r.baselines["read_gbps"] = gbps(bytes, median(t[2]));
  r.extra["gbps"] = gbps(bytes, r.median_ms);
  r.extra["fraction_of_read"] = r.extra["gbps"] / r.baselines["read_gbps"];
  set_read_best(r, t[0], t[2]);
  r.extra["fraction_of_contiguous"] = r.baselines["contiguous"] / r.median_ms;
  r.baselines["slab"] = median(t[4]);
  r.extra["fraction_of_slab"] = r.baselines["slab"] / r.median_ms;
  set_gflops(r, run.flops());
  r.note = "i = 1, cache lengths " + std::to_string(lengths[0]) + ", " +
           std::to_string(lengths[1]) +
           ", ... in shuffled blocks of 16; contiguous = one dense decode per sequence on a "
           "contiguous copy of its keys and values ([1, hk, j, d]: a kv head's rows one after "
           "another); slab = the same paged call's sequences as a slab cache [b, max_len, hk, d] "
           "(no block table: the pages' row layout, a kv head's rows hk * d apart); read_gbps = "
           "reading every block (all are "
           "touched); fraction_of_read_best = the fastest round over the read's fastest (the "
           "target is judged on the medians)";
  set_target(r, "at least 0.9 of contiguous and at least 0.8 of read",
             r.extra["fraction_of_contiguous"] >= 0.9 && r.extra["fraction_of_read"] >= 0.8);
  out.push_back(r);
}

// A chunk case's inputs (paged append, paged prefill): 4 sequences of `cached` keys to which
// kvcache_append (append()) writes i new keys and values each, the dense
// copies made after it.
struct AppendRun {
  KvCacheRun run;
  Tensor k_new, v_new, before;
  AppendRun(std::int64_t cached, std::int64_t i)
      : run(std::vector<std::int64_t>(4, cached + i), i, false),  // copies after the append
        k_new(random_tensor({4, i, kKvHeads, kDim}, 34)),
        v_new(random_tensor({4, i, kKvHeads, kDim}, 35)),
        before(Tensor::empty({4}, DType::kInt32)) {
    std::fill(before.mutable_data<std::int32_t>(), before.mutable_data<std::int32_t>() + 4,
              static_cast<std::int32_t>(cached));
    append();
    run.copy_dense();  // the dense calls see the appended keys too
  }
  void append() {
    kvcache_append(run.cache.k_cache, run.cache.v_cache, before, run.cache.block_table, k_new,
                   v_new);
  }
};

// A chunk appended to a paged cache: 4 sequences of `cached` keys, each
// appending i (their keys and values written by kvcache_append, timed on
// its own as append_ms) and attending with them, against the same calls on
// contiguous copies and on a slab. `what`: the case's first words in its
// note.
void paged_chunk_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out,
                      const std::string& name, std::int64_t cached, std::int64_t i,
                      const std::string& what) {
  if (!o.wants(name)) return;
  AppendRun ar(cached, i);
  const KvCacheRun& run = ar.run;
  const auto t = time_interleaved({[&] { run.paged(); }, [&] { run.contiguous(); },
                                   [&] { ar.append(); }, fma.run(), [&] { run.slab(); }},
                                  o.warmup, o.repetitions);
  fma.record(name, t[3]);
  CaseResult r;
  r.name = name;
  r.median_ms = median(t[0]);
  r.baselines["contiguous"] = median(t[1]);
  r.extra["fraction_of_contiguous"] = r.baselines["contiguous"] / r.median_ms;
  r.extra["append_ms"] = median(t[2]);
  r.baselines["slab"] = median(t[4]);
  r.extra["fraction_of_slab"] = r.baselines["slab"] / r.median_ms;
  set_gflops(r, run.flops());
  r.note = what + ": 4 sequences of " + std::to_string(cached) + " cached keys, " +
           std::to_string(i) +
           " new queries each (their last positions), causal; contiguous = one dense call per "
           "sequence with q_offset " +
           std::to_string(cached) +
           " on a contiguous copy of its cache ([1, hk, j, d]); slab = the same call on the "
           "sequences as a slab cache [b, max_len, hk, d] (the pages' row layout without the "
           "pages); append_ms = kvcache_append of the new keys and "
           "values, not part of median_ms";
  set_target(r, "at least 0.9 of contiguous", r.extra["fraction_of_contiguous"] >= 0.9);
  out.push_back(r);
}

// paged_append_alibi_b4_i128_h32_hk8_d128_block16 (issue 17): 4 sequences
// of 8192 cached keys, each appending 128 queries (a speculative
// verification or a short chunk: every query sees every cached key).
void paged_append_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::int64_t cached = o.quick ? 1024 : kAppendCached, i = o.quick ? 16 : kAppendNew;
  paged_chunk_case(o, fma, out,
                   "paged_append_alibi_b4_i" + std::to_string(i) + "_h32_hk8_d128_block16", cached,
                   i, "chunked append");
}

// paged_prefill_alibi_b4_c512_i512_h32_hk8_d128_block16: the second chunk
// of a chunked prefill (vLLM's, 512 tokens a chunk), whose queries span
// their own keys: the causal diagonal runs through the new keys' pages.
// Its target is the paged append's.
void paged_prefill_case(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  const std::int64_t chunk = o.quick ? 64 : 512;
  const std::string c = std::to_string(chunk);
  paged_chunk_case(o, fma, out, "paged_prefill_alibi_b4_c" + c + "_i" + c + "_h32_hk8_d128_block16",
                   chunk, chunk, "the second chunk of a chunked prefill");
}

}  // namespace

void kvcache_cases(const BenchOptions& o, FmaPeak& fma, std::vector<CaseResult>& out) {
  paged_decode_case(o, fma, out);
  paged_append_case(o, fma, out);
  paged_prefill_case(o, fma, out);
}

std::function<void()> paged_decode_call(std::size_t& kv_bytes, std::string& what) {
  const std::vector<std::int64_t> lengths = paged_decode_lengths();
  auto run = std::make_shared<const KvCacheRun>(lengths, 1, false);
  kv_bytes = 2 * static_cast<std::size_t>(run->cache.k_cache.numel()) * sizeof(float);
  what = "q float32, paged k and v float32, block " + std::to_string(kBlock) + ", h " +
         std::to_string(kHeads) + ", hk " + std::to_string(kKvHeads) + ", d " +
         std::to_string(kDim) + ", cache lengths";
  for (const std::int64_t len : lengths) what += " " + std::to_string(len);
  return [run] { run->paged(); };
}

std::function<void()> paged_append_call(const std::string& layout, std::string& what) {
  auto ar = std::make_shared<AppendRun>(kAppendCached, kAppendNew);
  what = (layout == "contiguous" ? std::string("dense calls with q_offset on contiguous copies")
          : layout == "slab"     ? std::string("slab k and v float32 [b, max_len, hk, d]")
                                 : "paged k and v float32, block " + std::to_string(kBlock)) +
         ", 4 sequences of " + std::to_string(kAppendCached) + " cached keys appending " +
         std::to_string(kAppendNew) + " queries, h " + std::to_string(kHeads) + ", hk " +
         std::to_string(kKvHeads) + ", d " + std::to_string(kDim);
  if (layout == "contiguous") return [ar] { ar->run.contiguous(); };
  if (layout == "slab") return [ar] { ar->run.slab(); };
  return [ar] { ar->run.paged(); };
}

}  // namespace posbias::bench
