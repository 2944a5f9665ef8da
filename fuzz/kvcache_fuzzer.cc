// Fuzzes attention_kvcache_forward() (the fused paged / slab path) against
// attention_kvcache_reference() (the plain path): random sequence lengths,
// block sizes (1 to 64, or slabs), block tables (shuffled, shared blocks,
// garbage in the entries a sequence does not use), grouped-query heads, d,
// query rows, dtypes, causal, windows, softcap and bias kinds (none, ALiBi
// [h] or [b, h], a centred distance table, sometimes too short). Every
// buffer is a heap block of exactly its size (std::vector seen through
// Tensor::from_blob), so under AddressSanitizer a read outside the cache, the
// block table or the lengths is reported; the cache rows no sequence uses
// hold NaN, so a read of a wrong row shows as a NaN output. Both calls must
// throw std::invalid_argument for the same inputs (an invalid block index
// among the used entries, a length past the cache) or both return outputs
// that agree within the tolerance, and attention_kvcache_forward_lse() the
// same output with an lse that is finite or -inf (a row that sees no key,
// output zeros). Anything else aborts.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/attention.h"

namespace {

using posbias::DType;
using posbias::Tensor;

// The fuzzer's choices, drawn from the input bytes (0 past the end).
struct Draw {
  const std::uint8_t* p;
  std::size_t n, at = 0;
  int byte() { return at < n ? p[at++] : 0; }
  // An integer in [lo, hi].
  std::int64_t in(std::int64_t lo, std::int64_t hi) { return lo + byte() % (hi - lo + 1); }
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "kvcache fuzzer: %s\n", what.c_str());
  std::abort();
}

// A tensor over a heap block of exactly its bytes, kept alive by the tensor.
Tensor exact(const Tensor& src) {
  const Tensor c = src.contiguous_copy();
  const std::size_t bytes = static_cast<std::size_t>(c.numel()) * posbias::dtype_size(c.dtype());
  auto block = std::make_shared<std::vector<std::uint8_t>>(bytes);
  if (bytes > 0) std::memcpy(block->data(), c.raw_data(), bytes);
  std::vector<std::int64_t> strides(c.shape().size(), 1);
  for (std::size_t x = strides.size(); x-- > 1;) strides[x - 1] = strides[x] * c.shape()[x];
  return Tensor::from_blob(bytes > 0 ? block->data() : nullptr, c.shape(), strides, c.dtype(),
                           block);
}

Tensor int32s(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& v) {
  return exact(Tensor::from_vector(shape, std::vector<float>(v.begin(), v.end())).to(DType::kInt32));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Draw in{data, size};
  const std::int64_t b = in.in(1, 4);
  const std::int64_t hk = in.in(1, 3);
  const std::int64_t h = hk * in.in(1, 4);
  const std::int64_t i = in.in(1, 5);
  const std::int64_t d = in.in(1, 40);
  const bool paged = in.byte() % 4 != 0;
  const std::int64_t bs = paged ? in.in(1, 64) : 0;
  const int dt = static_cast<int>(in.in(0, 4));  // f32, bf16, f16, f32 q + bf16 / f16 cache
  const DType qt = dt == 1 ? DType::kBFloat16 : dt == 2 ? DType::kFloat16 : DType::kFloat32;
  const DType kt = dt == 1 || dt == 3 ? DType::kBFloat16 : dt == 2 || dt == 4 ? DType::kFloat16
                                                                              : DType::kFloat32;
  std::vector<std::int64_t> lens;
  for (std::int64_t s = 0; s < b; ++s) lens.push_back(in.in(0, 100));
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  const int corrupt = in.byte();  // rarely: a bad length or block index
  std::mt19937 gen(static_cast<std::uint32_t>(in.byte() * 65537 + in.byte()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  // The cache: NaN everywhere, then each sequence's keys at their rows.
  std::vector<std::int64_t> shape, table;
  std::int64_t max_blocks = 0, num_blocks = 0, max_len = 0;
  if (paged) {
    max_blocks = (longest + bs - 1) / bs + in.in(0, 2);
    num_blocks = std::max<std::int64_t>(1, in.in(1, 2 * b * ((longest + bs - 1) / bs) + 1));
    if (num_blocks * bs > 40000) return 0;
    table.resize(static_cast<std::size_t>(b * max_blocks));
    for (std::int64_t s = 0; s < b; ++s) {
      for (std::int64_t m = 0; m < max_blocks; ++m) {
        const bool used = m * bs < lens[s];
        // Used entries: any block (sequences may share one); others: garbage.
        table[static_cast<std::size_t>(s * max_blocks + m)] =
            used ? static_cast<std::int64_t>(gen() % num_blocks)
                 : static_cast<std::int64_t>(gen() % 2000) - 1000;
      }
    }
    shape = {num_blocks, bs, hk, d};
  } else {
    max_len = longest + in.in(0, 3);
    shape = {b, max_len, hk, d};
  }
  std::int64_t cells = 1;
  for (std::int64_t e : shape) cells *= e;
  std::vector<float> kc(static_cast<std::size_t>(cells), nan), vc = kc;
  for (std::int64_t s = 0; s < b; ++s) {
    for (std::int64_t c = 0; c < lens[s]; ++c) {
      const std::int64_t row = paged ? table[static_cast<std::size_t>(s * max_blocks + c / bs)] * bs + c % bs
                                     : s * max_len + c;
      for (std::int64_t x = 0; x < hk * d; ++x) {
        kc[static_cast<std::size_t>(row * hk * d + x)] = u(gen);
        vc[static_cast<std::size_t>(row * hk * d + x)] = u(gen);
      }
    }
  }
  bool expect_error = false;
  if (corrupt == 0xFF) {
    lens[0] = paged ? max_blocks * bs + 1 : max_len + 1;  // past the cache
    expect_error = true;
  } else if (corrupt == 0xFE && paged && lens[0] > 0) {
    table[0] = num_blocks + static_cast<std::int64_t>(gen() % 3);  // used entry out of range
    expect_error = true;
  } else if (corrupt == 0xFD) {
    lens[0] = -1;
    expect_error = true;
  }
  const Tensor k_cache = exact(Tensor::from_vector(shape, kc).to(kt));
  const Tensor v_cache = exact(Tensor::from_vector(shape, vc).to(kt));
  const Tensor seqlens = int32s({b}, lens);
  const Tensor block_table = paged ? int32s({b, max_blocks}, table) : Tensor();
  std::vector<float> qv(static_cast<std::size_t>(b * i * h * d));
  for (float& x : qv) x = 2.0f * u(gen);
  const Tensor q = exact(Tensor::from_vector({b, i, h, d}, qv).to(qt));

  posbias::AttentionOptions opt;
  opt.causal = in.byte() % 2 == 0;
  opt.window = {in.in(-1, 12), in.in(-1, 12)};
  if (in.byte() % 3 == 0) opt.softcap = static_cast<float>(in.in(1, 30)) / 4.0f;
  posbias::AttentionBias bias;
  const int kind = static_cast<int>(in.in(0, 3));
  if (kind == 1 || kind == 2) {
    std::vector<float> slopes(static_cast<std::size_t>(kind == 1 ? h : b * h));
    for (float& x : slopes) x = 0.5f * (u(gen) + 1.0f);
    bias = posbias::AttentionBias::alibi(slopes);
  } else if (kind == 3) {
    // Centred; sometimes shorter than the longest visible distance (error).
    const std::int64_t centre = in.in(0, 1) ? longest + i : in.in(0, 20);
    std::vector<float> t(static_cast<std::size_t>(h * (2 * centre + 1)));
    for (float& x : t) x = u(gen);
    bias = posbias::AttentionBias::distance_table(
        exact(Tensor::from_vector({h, 2 * centre + 1}, t)));
  }

  std::string fused_error, ref_error;
  Tensor fused, ref;
  try {
    fused = posbias::attention_kvcache_forward(q, k_cache, v_cache, seqlens, block_table, bias, opt);
  } catch (const std::invalid_argument& e) {
    fused_error = e.what();
  }
  try {
    ref = posbias::attention_kvcache_reference(q, k_cache, v_cache, seqlens, block_table, bias, opt);
  } catch (const std::invalid_argument& e) {
    ref_error = e.what();
  }
  if (fused_error.empty() != ref_error.empty()) {
    fail("one call threw and the other did not: fused '" + fused_error + "', reference '" +
         ref_error + "'");
  }
  if (expect_error && fused_error.empty()) fail("a corrupted length or block index was accepted");
  if (!fused_error.empty()) return 0;
  const std::vector<float> got = fused.to_float_vector(), want = ref.to_float_vector();
  if (got.size() != want.size()) fail("output sizes differ");
  const double atol = qt == DType::kFloat32 ? 1e-5 : 1e-2, rtol = qt == DType::kFloat32 ? 1e-4 : 1e-2;
  for (std::size_t x = 0; x < got.size(); ++x) {
    if (!std::isfinite(want[x])) fail("the reference read a row outside a sequence's keys");
    if (!(std::fabs(double(got[x]) - want[x]) <= atol + rtol * std::fabs(double(want[x])))) {
      fail("element " + std::to_string(x) + " is " + std::to_string(got[x]) + ", reference " +
           std::to_string(want[x]) + " (b " + std::to_string(b) + ", h " + std::to_string(h) +
           ", hk " + std::to_string(hk) + ", i " + std::to_string(i) + ", d " + std::to_string(d) +
           ", block_size " + std::to_string(bs) + ")");
    }
  }
  // With the lse [b, h, i] (a heap block of its size: a write past it is
  // reported): the same out bits; each lse finite, or -inf for a row that
  // sees no key, whose out is then zeros.
  const posbias::AttentionForwardResult fl =
      posbias::attention_kvcache_forward_lse(q, k_cache, v_cache, seqlens, block_table, bias, opt);
  if (fl.out.to_float_vector() != got) fail("out of kvcache_forward_lse differs from forward's");
  if (fl.lse.shape() != std::vector<std::int64_t>{b, h, i}) fail("lse has the wrong shape");
  const std::vector<float> lse = fl.lse.to_float_vector();
  for (std::int64_t s = 0; s < b; ++s) {
    for (std::int64_t x = 0; x < h; ++x) {
      for (std::int64_t r = 0; r < i; ++r) {
        const float l = lse[static_cast<std::size_t>((s * h + x) * i + r)];
        if (std::isfinite(l)) continue;
        if (!(std::isinf(l) && l < 0)) fail("an lse is " + std::to_string(l));
        for (std::int64_t e = 0; e < d; ++e) {
          if (got[static_cast<std::size_t>(((s * i + r) * h + x) * d + e)] != 0.0f) {
            fail("a row with lse -inf has a nonzero output");
          }
        }
      }
    }
  }
  return 0;
}
