// `posbias attention` on serving and training batches: a packed batch
// (--seqlens, attention_varlen_forward) and a KV cache (--cache-seqlens,
// attention_kvcache_forward, one slab per sequence or with --paged a block
// table). Inputs are N(0, 1) from --seed (NormalGenerator, as the dense form):
// q, then k (or k_cache), then v (or v_cache), each row-major.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "attention_run.h"
#include "commands.h"
#include "posbias/attention.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

// Options of the dense form that a batch form has no use for.
void refuse_dense_options(const AttentionArgs& a, const char* form) {
  const auto refuse = [&](bool given, const char* name, const char* why) {
    if (given)
      throw std::invalid_argument(std::string(name) + " is not an option of " + form + why);
  };
  refuse(a.i.has_value() && std::string(form) == "--seqlens", "-i",
         " (the query counts are --seqlens)");
  refuse(a.j.has_value(), "-j", " (the key counts are in the list)");
  refuse(a.batch.has_value(), "--batch", " (b is the list's length)");
  refuse(!a.inputs.empty(), "--inputs", " (random inputs only)");
  refuse(a.q_offset.has_value(), "--q-offset", " (each sequence's queries are its last positions)");
  refuse(!a.key_mask.empty() || a.left_pad, "--key-mask", " (a batch form has no padding to mask)");
  refuse(a.bias == "dense", "--bias dense", " (a dense bias has no packed or paged layout)");
}

// The list `name` as int32 counts: each >= 0, their sum (when `sum_limit`)
// within int32 as the library's int32 offsets need.
void check_counts(const char* name, const std::vector<std::int64_t>& values) {
  std::int64_t total = 0;
  for (std::int64_t n : values) {
    if (n < 0)
      throw std::invalid_argument(std::string(name) + ": " + std::to_string(n) + " is negative");
    if (n > std::numeric_limits<std::int32_t>::max() ||
        (total += n) > std::numeric_limits<std::int32_t>::max()) {
      throw std::invalid_argument(std::string(name) + ": " + std::to_string(n) +
                                  " takes the total past int32's largest value 2147483647");
    }
  }
}

Tensor int32_tensor(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  auto* data = t.mutable_data<std::int32_t>();
  for (std::size_t x = 0; x < v.size(); ++x) data[x] = static_cast<std::int32_t>(v[x]);
  return t;
}

// Prefix sums [0, n0, n0 + n1, ...] as int32 [b + 1].
Tensor cumulative(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> cu(1, 0);
  for (std::int64_t n : counts) cu.push_back(cu.back() + n);
  return int32_tensor({static_cast<std::int64_t>(cu.size())}, cu);
}

Tensor random_float32(const std::vector<std::int64_t>& shape, NormalGenerator& gen) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  gen.fill(t);
  return t;
}

Tensor as_dtype(const Tensor& t, DType dtype) { return dtype == DType::kFloat32 ? t : t.to(dtype); }

struct Heads {
  std::int64_t h = 0, hk = 0, d = 0;
};

Heads get_heads(const AttentionArgs& a) {
  const auto need = [](const std::optional<std::int64_t>& value, const char* name) {
    if (!value) throw std::invalid_argument(std::string(name) + " is required");
    return *value;
  };
  Heads x;
  x.h = need(a.heads, "--heads");
  x.d = need(a.d, "-d");
  x.hk = a.kv_heads.value_or(x.h);
  require_nonnegative("--heads", x.h);
  require_nonnegative("--kv-heads", x.hk);
  require_nonnegative("-d", x.d);
  return x;
}

// Bytes of q and k, v (float32 draws, their dtype copies, the output; with
// --check the reference's float32 copies and output), refused past memory.
void check_batch_memory(const std::string& what, std::uint64_t qn, std::uint64_t kn,
                        std::uint64_t table_n, bool check) {
  std::uint64_t bytes = times(4, plus(plus(times(2, qn), times(4, kn)), table_n));
  if (check) bytes = plus(bytes, times(4, plus(times(2, qn), times(2, kn))));
  check_memory(what, bytes);
}

template <typename Call>
std::pair<Tensor, double> timed(const Call& call) {
  const auto start = std::chrono::steady_clock::now();
  Tensor result = call();
  const auto stop = std::chrono::steady_clock::now();
  return {result, std::chrono::duration<double, std::milli>(stop - start).count()};
}

}  // namespace

int run_attention_varlen(const AttentionArgs& a, std::ostream& out) {
  refuse_dense_options(a, "--seqlens");
  if (!a.cache_seqlens.empty() || a.paged || a.block_size) {
    throw std::invalid_argument(
        "--seqlens (a packed batch) and --cache-seqlens/--paged/--block-size (a KV cache) exclude "
        "each other");
  }
  const Heads x = get_heads(a);
  const std::vector<std::int64_t>& seqlens_k = a.seqlens_k.empty() ? a.seqlens : a.seqlens_k;
  if (seqlens_k.size() != a.seqlens.size()) {
    throw std::invalid_argument("--seqlens-k needs one key count per sequence (" +
                                std::to_string(a.seqlens.size()) + "), got " +
                                std::to_string(seqlens_k.size()) + ": " + int_list(seqlens_k));
  }
  check_counts("--seqlens", a.seqlens);
  check_counts("--seqlens-k", seqlens_k);
  const DType dtype = parse_dtype(a.dtype);
  const DType kv_dtype = kv_dtype_of(a, dtype);
  const std::uint64_t seed = parse_seed(a.seed);
  const auto b = static_cast<std::int64_t>(a.seqlens.size());
  std::int64_t total_q = 0, total_k = 0, length = 0;
  for (std::int64_t s = 0; s < b; ++s) {
    total_q += a.seqlens[static_cast<std::size_t>(s)];
    total_k += seqlens_k[static_cast<std::size_t>(s)];
    length = std::max(
        {length, a.seqlens[static_cast<std::size_t>(s)], seqlens_k[static_cast<std::size_t>(s)]});
  }
  const std::uint64_t table_n = a.bias == "table" ? product({x.h, 2 * length}) : 0;
  check_batch_memory("attention over --seqlens " + int_list(a.seqlens) + " with h " +
                         std::to_string(x.h) + ", hk " + std::to_string(x.hk) + ", d " +
                         std::to_string(x.d),
                     product({total_q, x.h, x.d}), product({total_k, x.hk, x.d}), table_n, a.check);
  const AttentionOptions options = make_options(a);
  const AttentionBias bias = make_bias(a, x.h, b, length, seed);
  const Tensor cu_q = cumulative(a.seqlens);
  const Tensor cu_k = cumulative(seqlens_k);
  NormalGenerator gen(seed);
  const Tensor q = as_dtype(random_float32({total_q, x.h, x.d}, gen), dtype);
  const Tensor k = as_dtype(random_float32({total_k, x.hk, x.d}, gen), kv_dtype);
  const Tensor v = as_dtype(random_float32({total_k, x.hk, x.d}, gen), kv_dtype);
  const auto [result, ms] =
      timed([&] { return attention_varlen_forward(q, k, v, cu_q, cu_k, bias, options); });
  std::optional<Tensor> reference;
  if (a.check) reference = attention_varlen_reference(q, k, v, cu_q, cu_k, bias, options);
  const std::string line =
      std::to_string(b) + " sequences, query counts " + int_list(a.seqlens) + ", key counts " +
      int_list(seqlens_k) + ", h " + std::to_string(x.h) + ", hk " + std::to_string(x.hk) + ", d " +
      std::to_string(x.d) + "; " + options_text(a, x.d) +
      (a.kv_dtype_option->count() > 0 ? "; k, v " + dtype_name(kv_dtype) : "") + "; seed " + a.seed;
  return report_attention(a, "attention_varlen_forward", result, ms, reference, line, out);
}

int run_attention_kvcache(const AttentionArgs& a, std::ostream& out) {
  refuse_dense_options(a, "--cache-seqlens");
  if (!a.seqlens_k.empty()) throw std::invalid_argument("--seqlens-k needs --seqlens");
  if (a.paged != a.block_size.has_value()) {
    throw std::invalid_argument(a.paged ? "--paged needs --block-size"
                                        : "--block-size needs --paged");
  }
  const Heads x = get_heads(a);
  const std::int64_t i = a.i.value_or(1);
  require_nonnegative("-i", i);
  check_counts("--cache-seqlens", a.cache_seqlens);
  const std::int64_t block = a.block_size.value_or(1);
  if (block < 1)
    throw std::invalid_argument("--block-size must be >= 1, got " + std::to_string(block));
  const DType dtype = parse_dtype(a.dtype);
  const DType kv_dtype = kv_dtype_of(a, dtype);
  const std::uint64_t seed = parse_seed(a.seed);
  const auto b = static_cast<std::int64_t>(a.cache_seqlens.size());
  std::int64_t longest = 0, num_blocks = 0, max_blocks = 0;
  for (std::int64_t n : a.cache_seqlens) {
    longest = std::max(longest, n);
    const std::int64_t blocks = (n + block - 1) / block;
    num_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  // Paged: [num_blocks, block_size, hk, d]; slabs: [b, longest, hk, d].
  const std::vector<std::int64_t> cache_shape =
      a.paged ? std::vector<std::int64_t>{num_blocks, block, x.hk, x.d}
              : std::vector<std::int64_t>{b, longest, x.hk, x.d};
  const std::int64_t length = std::max(i, longest);
  const std::uint64_t table_n = a.bias == "table" ? product({x.h, 2 * length}) : 0;
  check_batch_memory("attention with -i " + std::to_string(i) + " against --cache-seqlens " +
                         int_list(a.cache_seqlens) + ", cache " + shape_list(cache_shape),
                     product({b, i, x.h, x.d}),
                     product({cache_shape[0], cache_shape[1], x.hk, x.d}), table_n, a.check);
  const AttentionOptions options = make_options(a);
  const AttentionBias bias = make_bias(a, x.h, b, length, seed);
  const Tensor seqlens = int32_tensor({b}, a.cache_seqlens);
  Tensor block_table = Tensor::empty({0}, DType::kInt32);
  if (a.paged) {
    // Blocks handed out in a seeded random order (Fisher-Yates on
    // std::mt19937_64, whose sequence the standard fixes), so that the
    // table is not the identity; unused entries hold 0.
    std::vector<std::int64_t> order(static_cast<std::size_t>(num_blocks));
    for (std::int64_t n = 0; n < num_blocks; ++n) order[static_cast<std::size_t>(n)] = n;
    std::mt19937_64 engine(seed ^ 0x9e3779b97f4a7c15ULL);
    for (std::size_t n = order.size(); n > 1; --n) std::swap(order[n - 1], order[engine() % n]);
    std::vector<std::int64_t> table(static_cast<std::size_t>(b * max_blocks), 0);
    std::size_t next = 0;
    for (std::int64_t s = 0; s < b; ++s) {
      const std::int64_t blocks =
          (a.cache_seqlens[static_cast<std::size_t>(s)] + block - 1) / block;
      for (std::int64_t m = 0; m < blocks; ++m) {
        table[static_cast<std::size_t>(s * max_blocks + m)] = order[next++];
      }
    }
    block_table = int32_tensor({b, max_blocks}, table);
  }
  NormalGenerator gen(seed);
  const Tensor q = as_dtype(random_float32({b, i, x.h, x.d}, gen), dtype);
  const Tensor k = as_dtype(random_float32(cache_shape, gen), kv_dtype);
  const Tensor v = as_dtype(random_float32(cache_shape, gen), kv_dtype);
  const auto [result, ms] = timed(
      [&] { return attention_kvcache_forward(q, k, v, seqlens, block_table, bias, options); });
  std::optional<Tensor> reference;
  if (a.check) {
    reference = attention_kvcache_reference(q, k, v, seqlens, block_table, bias, options);
  }
  const std::string line =
      std::to_string(b) + " sequences, -i " + std::to_string(i) +
      " new queries each, cache lengths " + int_list(a.cache_seqlens) + ", " +
      (a.paged ? "paged cache " + shape_list(cache_shape) + " (block table [" + std::to_string(b) +
                     ", " + std::to_string(max_blocks) + "])"
               : "slab cache " + shape_list(cache_shape)) +
      " " + dtype_name(kv_dtype) + ", h " + std::to_string(x.h) + "; " + options_text(a, x.d) +
      "; seed " + a.seed;
  return report_attention(a, "attention_kvcache_forward", result, ms, reference, line, out);
}

}  // namespace posbias::cli
