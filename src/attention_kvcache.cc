// Front functions of the packed (varlen) and KV-cache attention calls and of
// kvcache_append: argument checks, the description of the call
// (detail::AttentionParams with cu_q / cu_k, or seqlen_k and a block table),
// dispatch to the fused kernel, the backward and the reference. The checks
// shared with the dense calls are in attention.cc (attention_front.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_front.h"
#include "attention_reference.h"
#include "checks.h"
#include "dtype_dispatch.h"
#include "kernels/attention_fused.h"
#include "kernels/attention_params.h"
#include "kernels/float_to.h"
#include "posbias/attention.h"

namespace posbias {
namespace {

using detail::AttentionCall;
using detail::AttentionParams;
using detail::shape_string;

std::string num(std::int64_t x) { return std::to_string(x); }

// An index tensor's element e (int32, any stride).
std::int32_t index_at(const Tensor& t, std::int64_t e) {
  return t.data<std::int32_t>()[e * t.strides()[0]];
}

// Checks one cu_seqlens tensor ([b + 1] int32, 0 first, non-decreasing, total
// last) and returns b.
std::int64_t check_cu_seqlens(const AttentionCall& call, const char* name, const Tensor& cu,
                              std::int64_t total) {
  if (cu.dtype() != DType::kInt32 || cu.dim() != 1 || cu.size(0) < 1) {
    call.fail(std::string(name) + " must be int32 [b + 1] with b + 1 >= 1, got " +
              dtype_name(cu.dtype()) + " " + shape_string(cu.shape()));
  }
  const std::int64_t n = cu.size(0);
  if (index_at(cu, 0) != 0) {
    call.fail(std::string(name) + " must start at 0, got " + num(index_at(cu, 0)));
  }
  for (std::int64_t e = 1; e < n; ++e) {
    if (index_at(cu, e) < index_at(cu, e - 1)) {
      call.fail(std::string(name) + " must not decrease: entry " + num(e) + " is " +
                num(index_at(cu, e)) + " after " + num(index_at(cu, e - 1)));
    }
  }
  if (index_at(cu, n - 1) != total) {
    call.fail(std::string(name) + " must end at the token count " + num(total) + ", got " +
              num(index_at(cu, n - 1)));
  }
  return n - 1;
}

std::vector<std::int32_t> copy_index(const Tensor& t) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.size(0)));
  for (std::int64_t e = 0; e < t.size(0); ++e) out[static_cast<std::size_t>(e)] = index_at(t, e);
  return out;
}

// [sequence, head, row, element] strides of a [tokens, heads, d] tensor.
void token_strides(const Tensor& t, std::int64_t* s) {
  s[0] = 0;
  s[1] = t.strides()[1];
  s[2] = t.strides()[0];
  s[3] = t.strides()[2];
}

void describe_varlen(AttentionCall& call, const Tensor& cu_q, const Tensor& cu_k,
                     const AttentionBias& bias, const AttentionOptions& options) {
  const Tensor &q = *call.q, &k = *call.k, &v = *call.v;
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3) {
    call.fail("q must be [total_q, h, d] and k, v [total_k, hk, d] (3-d)");
  }
  detail::check_attention_dtypes(call);
  if (k.shape() != v.shape()) call.fail("k and v must have the same shape");
  if (k.size(2) != q.size(2)) call.fail("q and k must have the same head dimension d");
  const std::int64_t b = check_cu_seqlens(call, "cu_seqlens_q", cu_q, q.size(0));
  if (check_cu_seqlens(call, "cu_seqlens_k", cu_k, k.size(0)) != b) {
    call.fail("cu_seqlens_q and cu_seqlens_k must have the same length b + 1, got " +
              num(cu_q.size(0)) + " and " + num(cu_k.size(0)));
  }
  AttentionParams& p = call.p;
  p.b = b;
  p.h = q.size(1);
  p.hk = k.size(1);
  p.d = q.size(2);
  for (std::int64_t s = 0; s < b; ++s) {
    p.i = std::max<std::int64_t>(p.i, index_at(cu_q, s + 1) - index_at(cu_q, s));
    p.j = std::max<std::int64_t>(p.j, index_at(cu_k, s + 1) - index_at(cu_k, s));
  }
  detail::check_attention_options(call, options, /*ragged=*/true);
  detail::check_attention_bias(call, bias, /*ragged=*/true);
  call.cu_q = copy_index(cu_q);
  call.cu_k = copy_index(cu_k);
  p.cu_q = call.cu_q.data();
  p.cu_k = call.cu_k.data();
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  token_strides(q, p.q_stride);
  token_strides(k, p.k_stride);
  token_strides(v, p.v_stride);
  p.out_stride[0] = 0;
  p.out_stride[1] = p.d;
  p.out_stride[2] = p.h * p.d;
  p.out_stride[3] = 1;
  p.lse_stride[0] = 0;
  p.lse_stride[1] = q.size(0);
  p.lse_stride[2] = 1;
  detail::finish_attention_table(call, bias);
}

AttentionForwardResult varlen_forward(const char* who, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                                      const AttentionBias& bias, const AttentionOptions& options,
                                      bool want_lse, bool reference) {
  AttentionCall call(who, q, k, v);
  describe_varlen(call, cu_q, cu_k, bias, options);
  AttentionForwardResult res;
  res.out = Tensor::empty({q.size(0), call.p.h, call.p.d}, q.dtype());
  if (want_lse) res.lse = Tensor::empty({call.p.h, q.size(0)}, detail::lse_dtype(call.p));
  if (res.out.numel() == 0) return res;
  call.p.out = res.out.raw_mutable_data();
  if (want_lse) detail::set_forward_lse(call, res.lse);
  detail::run_attention_forward(call, reference);
  return res;
}

// A block table given (paged) or not (slabs): the rule of key_mask.
bool has_block_table(const Tensor& block_table) {
  return !(block_table.numel() == 0 && block_table.dim() != 2);
}

// The block of sequence s holding key c (paged; checked).
std::int32_t block_of(const Tensor& block_table, std::int64_t s, std::int64_t c,
                      std::int64_t block_size) {
  return block_table.data<std::int32_t>()[s * block_table.strides()[0] +
                                          c / block_size * block_table.strides()[1]];
}

// Checks the cache, the lengths and the block table of a KV-cache call whose
// sequences hold keys [0, len_s + extra) (extra: an append's new rows).
// Returns the capacity of a sequence (max_blocks * block_size, or max_len).
std::int64_t check_cache(const AttentionCall& call, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& cache_seqlens, const Tensor& block_table, std::int64_t b,
                         std::int64_t extra) {
  if (k_cache.dim() != 4 || k_cache.shape() != v_cache.shape() ||
      k_cache.dtype() != v_cache.dtype()) {
    call.fail("k_cache and v_cache must be 4-d of one shape and dtype, got " +
              dtype_name(k_cache.dtype()) + " " + shape_string(k_cache.shape()) + " and " +
              dtype_name(v_cache.dtype()) + " " + shape_string(v_cache.shape()));
  }
  if (cache_seqlens.dtype() != DType::kInt32 || cache_seqlens.dim() != 1 ||
      cache_seqlens.size(0) != b) {
    call.fail("cache_seqlens must be int32 [b] = [" + num(b) + "], got " +
              dtype_name(cache_seqlens.dtype()) + " " + shape_string(cache_seqlens.shape()));
  }
  const bool paged = has_block_table(block_table);
  std::int64_t capacity = k_cache.size(1);
  if (paged) {
    if (block_table.dtype() != DType::kInt32 || block_table.dim() != 2 ||
        block_table.size(0) != b) {
      call.fail("block_table must be int32 [b, max_blocks] with b = " + num(b) + ", got " +
                dtype_name(block_table.dtype()) + " " + shape_string(block_table.shape()));
    }
    if (k_cache.size(1) < 1) call.fail("block_size must be >= 1, got " + num(k_cache.size(1)));
    capacity = block_table.size(1) * k_cache.size(1);
  } else if (k_cache.size(0) != b) {
    call.fail("without a block table k_cache and v_cache are [b, max_len, hk, d] with b = " +
              num(b) + ", got " + shape_string(k_cache.shape()));
  }
  for (std::int64_t s = 0; s < b; ++s) {
    const std::int64_t len = index_at(cache_seqlens, s);
    if (len < 0 || len + extra > capacity) {
      call.fail("cache_seqlens[" + num(s) + "] = " + num(len) +
                (extra > 0 ? " plus the " + num(extra) + " appended rows" : std::string()) +
                " must lie in [0, " + num(capacity) + "] (" +
                (paged ? "max_blocks * block_size" : "max_len") + ")");
    }
    if (!paged) continue;
    const std::int64_t bs = k_cache.size(1);
    for (std::int64_t c = 0; c < len + extra; c += bs) {
      const std::int32_t blk = block_of(block_table, s, c, bs);
      if (blk < 0 || blk >= k_cache.size(0)) {
        call.fail("block_table[" + num(s) + "][" + num(c / bs) + "] = " + num(blk) +
                  " is outside [0, num_blocks = " + num(k_cache.size(0)) + ")");
      }
    }
  }
  return capacity;
}

void describe_kvcache(AttentionCall& call, const Tensor& cache_seqlens, const Tensor& block_table,
                      const AttentionBias& bias, const AttentionOptions& options) {
  const Tensor &q = *call.q, &k = *call.k;
  if (q.dim() != 4) call.fail("q must be [b, i, h, d] (4-d)");
  detail::check_attention_dtypes(call);
  AttentionParams& p = call.p;
  p.b = q.size(0);
  p.i = q.size(1);
  p.h = q.size(2);
  p.d = q.size(3);
  check_cache(call, k, *call.v, cache_seqlens, block_table, p.b, 0);
  p.hk = k.size(2);
  if (k.size(3) != p.d) call.fail("q and the cache must have the same head dimension d");
  for (std::int64_t s = 0; s < p.b; ++s)
    p.j = std::max<std::int64_t>(p.j, index_at(cache_seqlens, s));
  detail::check_attention_options(call, options, /*ragged=*/true);
  detail::check_attention_bias(call, bias, /*ragged=*/true);
  call.seqlen_k = copy_index(cache_seqlens);
  p.seqlen_k = call.seqlen_k.data();
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = call.v->raw_data();
  const auto& qs = q.strides();
  p.q_stride[0] = qs[0], p.q_stride[1] = qs[2], p.q_stride[2] = qs[1], p.q_stride[3] = qs[3];
  // [sequence or block, kv head, key or row in block, element].
  for (int x = 0; x < 2; ++x) {
    const auto& cs = (x == 0 ? k : *call.v).strides();
    std::int64_t* dst = x == 0 ? p.k_stride : p.v_stride;
    dst[0] = cs[0], dst[1] = cs[2], dst[2] = cs[1], dst[3] = cs[3];
  }
  if (has_block_table(block_table)) {
    p.key_layout = detail::KeyLayout::kPaged;
    p.block_size = k.size(1);
    const std::int64_t mb = block_table.size(1);
    detail::checked_numel({p.b, mb}, DType::kInt32);
    call.blocks.resize(static_cast<std::size_t>(p.b * mb));
    for (std::int64_t s = 0; s < p.b; ++s) {
      for (std::int64_t e = 0; e < mb; ++e) {
        call.blocks[static_cast<std::size_t>(s * mb + e)] =
            block_table
                .data<std::int32_t>()[s * block_table.strides()[0] + e * block_table.strides()[1]];
      }
    }
    p.block_table = call.blocks.data();
    p.block_table_stride[0] = mb;
    p.block_table_stride[1] = 1;
  }
  p.out_stride[0] = p.i * p.h * p.d;
  p.out_stride[1] = p.d;
  p.out_stride[2] = p.h * p.d;
  p.out_stride[3] = 1;
  p.lse_stride[0] = p.h * p.i;
  p.lse_stride[1] = p.i;
  p.lse_stride[2] = 1;
  detail::finish_attention_table(call, bias);
}

// out [b, i, h, d] and, when want_lse, lse [b, h, i] (describe_kvcache's
// lse strides).
AttentionForwardResult kvcache_forward(const char* who, const Tensor& q, const Tensor& k_cache,
                                       const Tensor& v_cache, const Tensor& cache_seqlens,
                                       const Tensor& block_table, const AttentionBias& bias,
                                       const AttentionOptions& options, bool want_lse,
                                       bool reference) {
  AttentionCall call(who, q, k_cache, v_cache);
  describe_kvcache(call, cache_seqlens, block_table, bias, options);
  AttentionForwardResult res;
  res.out = Tensor::empty(q.shape(), q.dtype());
  if (want_lse) res.lse = Tensor::empty({call.p.b, call.p.h, call.p.i}, detail::lse_dtype(call.p));
  if (res.out.numel() == 0) return res;
  call.p.out = res.out.raw_mutable_data();
  if (want_lse) detail::set_forward_lse(call, res.lse);
  detail::run_attention_forward(call, reference);
  return res;
}

// One row, element type S to D (dtype branches outside the loop).
template <typename S, typename D>
void convert_row_typed(const void* src, std::int64_t s_off, std::int64_t s_step, void* dst,
                       std::int64_t d_off, std::int64_t d_step, std::int64_t d) {
  const S* from = static_cast<const S*>(src) + s_off;
  D* to = static_cast<D*>(dst) + d_off;
  for (std::int64_t x = 0; x < d; ++x) {
    if constexpr (std::is_same_v<S, double> || std::is_same_v<D, double>) {
      to[x * d_step] = from[x * s_step];  // both float64 (kvcache_append checks)
    } else if constexpr (std::is_same_v<S, float>) {
      to[x * d_step] = detail::float_to<D>(from[x * s_step]);
    } else {
      to[x * d_step] = detail::float_to<D>(to_float(from[x * s_step]));  // exact widening
    }
  }
}

// dst[0 .. d) (cache dtype) = src[0, stride, ..) (float dtype), rounded
// once; a row of the cache's own dtype with contiguous elements is copied.
void convert_row(const void* src, DType st, std::int64_t s_off, std::int64_t s_step, void* dst,
                 DType dt, std::int64_t d_off, std::int64_t d_step, std::int64_t d) {
  if (st == dt && s_step == 1 && d_step == 1) {
    const std::size_t size = dtype_size(st);
    std::memcpy(static_cast<char*>(dst) + static_cast<std::size_t>(d_off) * size,
                static_cast<const char*>(src) + static_cast<std::size_t>(s_off) * size,
                static_cast<std::size_t>(d) * size);
    return;
  }
  if (st == DType::kFloat64) {  // then the cache is float64 too (kvcache_append checks)
    convert_row_typed<double, double>(src, s_off, s_step, dst, d_off, d_step, d);
    return;
  }
  detail::with_float_type(st, "kvcache_append", [&](auto from) {
    detail::with_float_type(dt, "kvcache_append", [&](auto to) {
      convert_row_typed<decltype(from), decltype(to)>(src, s_off, s_step, dst, d_off, d_step, d);
    });
  });
}

bool is_float(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16;
}

}  // namespace

Tensor attention_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                const AttentionBias& bias, const AttentionOptions& options) {
  return varlen_forward("attention_varlen_forward", q, k, v, cu_seqlens_q, cu_seqlens_k, bias,
                        options, false, false)
      .out;
}

AttentionForwardResult attention_varlen_forward_lse(const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const Tensor& cu_seqlens_q,
                                                    const Tensor& cu_seqlens_k,
                                                    const AttentionBias& bias,
                                                    const AttentionOptions& options) {
  return varlen_forward("attention_varlen_forward_lse", q, k, v, cu_seqlens_q, cu_seqlens_k, bias,
                        options, true, false);
}

Tensor attention_varlen_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                  const AttentionBias& bias, const AttentionOptions& options) {
  return varlen_forward("attention_varlen_reference", q, k, v, cu_seqlens_q, cu_seqlens_k, bias,
                        options, false, true)
      .out;
}

AttentionGradients attention_varlen_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                             const AttentionBias& bias,
                                             const AttentionOptions& options, const Tensor& out,
                                             const Tensor& lse, const Tensor& grad_out) {
  AttentionCall call("attention_varlen_backward", q, k, v);
  describe_varlen(call, cu_seqlens_q, cu_seqlens_k, bias, options);
  AttentionParams& p = call.p;
  const std::int64_t total_q = q.size(0);
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"out", &out}, {"grad_out", &grad_out}}) {
    if (t->shape() != std::vector<std::int64_t>{total_q, p.h, p.d} || t->dtype() != q.dtype()) {
      call.fail(std::string(name) + " must be " + dtype_name(q.dtype()) + " " +
                shape_string({total_q, p.h, p.d}) + ", got " + dtype_name(t->dtype()) + " " +
                shape_string(t->shape()));
    }
  }
  const DType lse_dt = detail::lse_dtype(p);
  if (lse.shape() != std::vector<std::int64_t>{p.h, total_q} || lse.dtype() != lse_dt) {
    call.fail("lse must be " + dtype_name(lse_dt) + " " + shape_string({p.h, total_q}) + ", got " +
              dtype_name(lse.dtype()) + " " + shape_string(lse.shape()));
  }
  AttentionGradients g;
  g.grad_q = Tensor::empty(q.shape(), q.dtype());
  g.grad_k = Tensor::empty(k.shape(), k.dtype());
  g.grad_v = Tensor::empty(v.shape(), v.dtype());
  p.saved_out = out.raw_data();
  token_strides(out, p.saved_out_stride);
  p.dout = grad_out.raw_data();
  token_strides(grad_out, p.dout_stride);
  detail::set_saved_lse(call, lse);
  p.saved_lse_stride[0] = 0;
  p.saved_lse_stride[1] = lse.strides()[0];
  p.saved_lse_stride[2] = lse.strides()[1];
  detail::run_attention_backward(call, bias, g);
  return g;
}

Tensor attention_kvcache_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const Tensor& cache_seqlens, const Tensor& block_table,
                                 const AttentionBias& bias, const AttentionOptions& options) {
  return kvcache_forward("attention_kvcache_forward", q, k_cache, v_cache, cache_seqlens,
                         block_table, bias, options, false, false)
      .out;
}

AttentionForwardResult attention_kvcache_forward_lse(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cache_seqlens,
    const Tensor& block_table, const AttentionBias& bias, const AttentionOptions& options) {
  return kvcache_forward("attention_kvcache_forward_lse", q, k_cache, v_cache, cache_seqlens,
                         block_table, bias, options, true, false);
}

Tensor attention_kvcache_reference(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const Tensor& cache_seqlens, const Tensor& block_table,
                                   const AttentionBias& bias, const AttentionOptions& options) {
  return kvcache_forward("attention_kvcache_reference", q, k_cache, v_cache, cache_seqlens,
                         block_table, bias, options, false, true)
      .out;
}

void kvcache_append(Tensor& k_cache, Tensor& v_cache, const Tensor& cache_seqlens,
                    const Tensor& block_table, const Tensor& k_new, const Tensor& v_new) {
  AttentionCall call("kvcache_append", k_new, k_cache, v_cache);
  call.names[0] = "k_new";
  call.names[1] = "k_cache";
  call.names[2] = "v_cache";
  // float64 goes into a float64 cache only (exact copies, for gradcheck and
  // double references), never mixed with the three others.
  const auto f64 = [](const Tensor& t) { return t.dtype() == DType::kFloat64; };
  const bool all64 = f64(k_new) && f64(v_new) && f64(k_cache) && f64(v_cache);
  if (!all64 && (f64(k_new) || f64(v_new) || f64(k_cache) || f64(v_cache))) {
    call.fail("float64 is appended only with k_new, v_new, k_cache and v_cache all float64, got " +
              std::string(dtype_name(k_new.dtype())) + ", " + dtype_name(v_new.dtype()) + ", " +
              dtype_name(k_cache.dtype()) + ", " + dtype_name(v_cache.dtype()));
  }
  const auto is_value = [&](DType t) { return all64 || is_float(t); };
  if (k_new.dim() != 4 || k_new.shape() != v_new.shape() || !is_value(k_new.dtype()) ||
      !is_value(v_new.dtype())) {
    call.fail(
        "k_new and v_new must be float32, bfloat16, float16 or float64 [b, n, hk, d] of one "
        "shape, got " +
        dtype_name(k_new.dtype()) + " " + shape_string(k_new.shape()) + " and " +
        dtype_name(v_new.dtype()) + " " + shape_string(v_new.shape()));
  }
  const std::int64_t b = k_new.size(0), n = k_new.size(1), hk = k_new.size(2), d = k_new.size(3);
  check_cache(call, k_cache, v_cache, cache_seqlens, block_table, b, n);
  if (!is_value(k_cache.dtype()) || k_cache.size(2) != hk || k_cache.size(3) != d) {
    call.fail(
        "the cache must be float32, bfloat16, float16 or float64 [.., .., hk, d] = [.., .., " +
        num(hk) + ", " + num(d) + "], got " + dtype_name(k_cache.dtype()) + " " +
        shape_string(k_cache.shape()));
  }
  const bool paged = has_block_table(block_table);
  const std::int64_t bs = k_cache.size(1);
  for (int which = 0; which < 2; ++which) {
    const Tensor& src = which == 0 ? k_new : v_new;
    Tensor& dst = which == 0 ? k_cache : v_cache;
    const auto& ss = src.strides();
    const auto& ds = dst.strides();
    void* base = dst.raw_mutable_data();
    for (std::int64_t s = 0; s < b; ++s) {
      const std::int64_t len = index_at(cache_seqlens, s);
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t c = len + t;
        const std::int64_t slab = paged ? block_of(block_table, s, c, bs) : s;
        const std::int64_t row = paged ? c % bs : c;
        for (std::int64_t x = 0; x < hk; ++x) {
          convert_row(src.raw_data(), src.dtype(), s * ss[0] + t * ss[1] + x * ss[2], ss[3], base,
                      dst.dtype(), slab * ds[0] + row * ds[1] + x * ds[2], ds[3], d);
        }
      }
    }
  }
}

}  // namespace posbias
