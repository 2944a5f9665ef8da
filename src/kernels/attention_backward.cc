// The recomputing backward of the fused attention, compiled once per
// instruction set by Highway and chosen at run time. See
// attention_backward.h.
//
// A task owns one (batch, query head). It packs the head's q and dO (rows of
// dp floats), K (rows) and K^T, V^T (d rows over the keys) into float32
// once, then walks key blocks (outer) and the query blocks that can see them
// (inner), FlashAttention-2's order: the key block's dK and dV rows stay in
// cache while the query blocks stream past, dQ accumulates in a per-thread
// [i, dp] buffer. Per (query block, key block):
//
//   S  = Q K^T (register-tiled product), then per row s = scale S + bias,
//        P = exp(s - lse) over the visible keys (0 elsewhere);
//   dP = dO V^T;  dS = P (dP - D), D = rowsum(dO * out);
//   dV += P^T dO;  dK += dS^T Q;  dQ += dS K   (dK, dQ times scale at the end);
//   table: dS added into a reversed per-head diagonal accumulator (row r's
//   keys are a forward window of it), slopes: sum of dS * -|c - q_r|,
//   dense: dS written out.
//
// q is packed times scale, as in the forward, so that the scores, the bias
// and mask step (BiasMaskMax) and the visible keys are the forward's own
// (attention_blocks-inl.h, attention_params.h); dK = dS^T (scale Q) then
// needs no final scaling. S and dP use the forward's score tile; the other
// three products one micro-kernel, C[R rows][V vectors] (+)= sum_t
// A(row, t) B[t][columns], with A read through two strides (so P^T and dS^T
// need no transposition) and B row-major.
//
// dK and dV are accumulated per query head in float32 and summed over the
// heads of a kv group (GQA) in a fixed order at the end; the table and slope
// gradients likewise per (batch, head), summed over the batch: the result
// does not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_backward.cc"
// foreach_target.h before any other Highway header (math-inl.h includes
// highway.h): otherwise clang compiles the static target twice. The
// clang-format guard keeps include sorting from moving it.
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// clang-format on
#include "kernels/attention_backward.h"

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/float_store.h"
#include "kernels/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Per-thread buffers (64-byte aligned). Names in this file are unique
// across src/kernels (shared HWY_NAMESPACE).
struct AttentionBwdWork {
  hwy::AlignedFreeUniquePtr<float[]> q, dout, k, kt, vt, dq, delta, lse, s, ds, row;
  AttentionBwdWork(std::int64_t i, std::int64_t jp, std::int64_t d, std::int64_t dp,
                   std::int64_t bq, std::int64_t bkp)
      : q(Alloc(i * dp)),
        dout(Alloc(i * dp)),
        k(Alloc(jp * dp)),
        kt(Alloc(d * jp)),
        vt(Alloc(d * jp)),
        dq(Alloc(i * dp)),
        delta(Alloc(i)),
        lse(Alloc(i)),
        s(Alloc(bq * bkp)),
        ds(Alloc(bq * bkp)),
        row(Alloc(dp)) {}
  static hwy::AlignedFreeUniquePtr<float[]> Alloc(std::int64_t count) {
    return allocate_scratch<float>(count, "the attention backward's per-thread buffers");
  }
};

struct AttentionBwdShared {
  std::int64_t bq, bk, bkp, nkb, jp, dp, rlen;
  float* dkf;     // [b, h, j, dp] float32 per query head
  float* dvf;     // [b, h, j, dp]
  float* dtab;    // [b, h, rlen] reversed diagonal sums, or null
  float* dslope;  // [b, h], or null
};

// One (batch, query head) of the backward: its indices and accumulators.
struct AttentionBwdHead {
  std::int64_t bb = 0, hh = 0, bh = 0;
  float* dk = nullptr;     // [j, dp], times scale already (q is scaled)
  float* dv = nullptr;     // [j, dp]
  float* rgrad = nullptr;  // reversed table gradient, or null
  float slope_grad = 0.0f;
};

// The head's q (times scale) and dO as rows of dp floats, D = rowsum(dO *
// out), the forward's lse; its kv head's K rows, K^T and V^T (zero past j).
void PackBwdHead(const AttentionParams& p, const AttentionBwdShared& sh, const AttentionBwdHead& hd,
                 AttentionBwdWork& w) {
  const std::int64_t d = p.d, dp = sh.dp, jp = sh.jp, bb = hd.bb, hh = hd.hh;
  for (std::int64_t r = 0; r < p.i; ++r) {
    float* qr = w.q.get() + r * dp;
    float* gr = w.dout.get() + r * dp;
    PackRow(p.q, p.dtype, bb * p.q_stride[0] + hh * p.q_stride[1] + r * p.q_stride[2],
            p.q_stride[3], d, p.scale, qr);
    PackRow(p.dout, p.dtype, bb * p.dout_stride[0] + hh * p.dout_stride[1] + r * p.dout_stride[2],
            p.dout_stride[3], d, 1.0f, gr);
    const std::int64_t* os = p.saved_out_stride;
    PackRow(p.saved_out, p.dtype, bb * os[0] + hh * os[1] + r * os[2], os[3], d, 1.0f, w.row.get());
    float delta = 0.0f;
    for (std::int64_t x = 0; x < d; ++x) delta += gr[x] * w.row[static_cast<std::size_t>(x)];
    for (std::int64_t x = d; x < dp; ++x) qr[x] = gr[x] = 0.0f;
    w.delta[static_cast<std::size_t>(r)] = delta;
    const std::int64_t* ls = p.saved_lse_stride;
    w.lse[static_cast<std::size_t>(r)] = p.saved_lse[bb * ls[0] + hh * ls[1] + r * ls[2]];
  }
  const std::int64_t kvh = hh / (p.h / p.hk);
  const std::int64_t k_base = bb * p.k_stride[0] + kvh * p.k_stride[1];
  const std::int64_t v_base = bb * p.v_stride[0] + kvh * p.v_stride[1];
  std::fill(w.k.get(), w.k.get() + jp * dp, 0.0f);
  std::fill(w.kt.get(), w.kt.get() + d * jp, 0.0f);
  std::fill(w.vt.get(), w.vt.get() + d * jp, 0.0f);
  for (std::int64_t c = 0; c < p.j; ++c) {
    float* kr = w.k.get() + c * dp;
    PackRow(p.k, p.dtype, k_base + c * p.k_stride[2], p.k_stride[3], d, 1.0f, kr);
    for (std::int64_t x = 0; x < d; ++x) w.kt[static_cast<std::size_t>(x * jp + c)] = kr[x];
    PackRow(p.v, p.dtype, v_base + c * p.v_stride[2], p.v_stride[3], d, 1.0f, w.row.get());
    for (std::int64_t x = 0; x < d; ++x) {
      w.vt[static_cast<std::size_t>(x * jp + c)] = w.row[static_cast<std::size_t>(x)];
    }
  }
  std::fill(w.dq.get(), w.dq.get() + p.i * dp, 0.0f);
}

// Query rows [r0, r0 + br) against keys [c0, c0 + bc): P and dS of every
// row (the bias gradients from dS), then dV += P^T dO, dK += dS^T Q,
// dQ += dS K.
void BwdBlock(DF df, const AttentionParams& p, const AttentionBwdShared& sh, AttentionBwdHead& hd,
              std::int64_t r0, std::int64_t br, std::int64_t c0, std::int64_t bc,
              AttentionBwdWork& w) {
  const std::int64_t dp = sh.dp, ld = sh.bkp;
  const std::int64_t bcp = AttnRoundUp(df, bc);
  float* s = w.s.get();
  float* ds = w.ds.get();
  // S = (scale Q) K^T and dP = dO V^T over the block's keys.
  QKAllRows(df, br, w.q.get() + r0 * dp, dp, p.d, w.kt.get() + c0, sh.jp, bcp, s, ld);
  QKAllRows(df, br, w.dout.get() + r0 * dp, dp, p.d, w.vt.get() + c0, sh.jp, bcp, ds, ld);
  for (std::int64_t r = 0; r < br; ++r) {
    const std::int64_t qr = r0 + r;
    const std::int64_t qpos = query_position(p, qr);
    const float lse = w.lse[static_cast<std::size_t>(qr)];
    // A row that saw no finite score has no gradient.
    const std::int64_t lim = lse == kAttnNegInf ? 0 : visible_in_block(p, qpos, c0, bc);
    float* srow = s + r * ld;
    float* dsrow = ds + r * ld;
    const RowBias rb = RowBiasOf(p, hd.bb, hd.hh, qr, qpos, c0, lim,
                                 /*alibi_from_first_key=*/false, /*alibi_added=*/false);
    BiasMaskMax(df, rb, bcp, lim, srow);
    hd.slope_grad += ProbabilityGradRow(df, rb, bcp, lim, lse,
                                        w.delta[static_cast<std::size_t>(qr)], srow, dsrow);
    if (hd.rgrad && lim > 0) {
      // Reversed diagonal accumulator: entry (c - qpos) + (j - 1).
      float* g = hd.rgrad + table_index(p, c0 - qpos);
      for (std::int64_t x = 0; x < lim; x += AttnLanes(df)) {
        hn::StoreU(hn::Add(hn::LoadU(df, g + x), hn::Load(df, dsrow + x)), df, g + x);
      }
    }
    if (p.ddense) std::copy(dsrow, dsrow + bc, p.ddense + (hd.bh * p.i + qr) * p.j + c0);
  }
  MulAddRows(df, bc, dp, br, s, 1, ld, w.dout.get() + r0 * dp, dp, TileInit::kAdd, hd.dv + c0 * dp,
             dp);
  MulAddRows(df, bc, dp, br, ds, 1, ld, w.q.get() + r0 * dp, dp, TileInit::kAdd, hd.dk + c0 * dp,
             dp);
  MulAddRows(df, br, dp, bc, ds, ld, 1, w.k.get() + c0 * dp, dp, TileInit::kAdd,
             w.dq.get() + r0 * dp, dp);
}

// One (batch, query head): key blocks outer, the query blocks that meet
// them inner.
void BwdTask(const AttentionParams& p, const AttentionBwdShared& sh, std::int64_t bb,
             std::int64_t hh, AttentionBwdWork& w) {
  const DF df;
  AttentionBwdHead hd;
  hd.bb = bb;
  hd.hh = hh;
  hd.bh = bb * p.h + hh;
  hd.dk = sh.dkf + hd.bh * p.j * sh.dp;
  hd.dv = sh.dvf + hd.bh * p.j * sh.dp;
  hd.rgrad = sh.dtab ? sh.dtab + hd.bh * sh.rlen : nullptr;
  PackBwdHead(p, sh, hd, w);
  for (std::int64_t kb = 0; kb < sh.nkb; ++kb) {
    const std::int64_t c0 = kb * sh.bk;
    const std::int64_t r_begin = first_row_meeting_keys(p, c0);
    if (r_begin >= p.i) break;  // later key blocks are met by no row either
    for (std::int64_t r0 = (r_begin / sh.bq) * sh.bq; r0 < p.i; r0 += sh.bq) {
      BwdBlock(df, p, sh, hd, r0, std::min(sh.bq, p.i - r0), c0, std::min(sh.bk, p.j - c0), w);
    }
  }
  for (std::int64_t r = 0; r < p.i; ++r) {
    store_floats_at(w.dq.get() + r * sh.dp, static_cast<std::size_t>(p.d), p.scale, p.dtype, p.dq,
                    static_cast<std::size_t>((hd.bh * p.i + r) * p.d));
  }
  if (sh.dslope) sh.dslope[hd.bh] = hd.slope_grad;
}

// dK, dV: sum the query heads of each kv head (fixed order), round once.
void ReduceKeyValueGrads(const AttentionParams& p, const AttentionBwdShared& sh, bool parallel) {
  const std::int64_t group = p.hk > 0 ? p.h / p.hk : 1;
  const std::int64_t kv_rows = p.b * p.hk * p.j;
  const std::int64_t d = p.d;
#pragma omp parallel if (parallel)
  {
    std::vector<float> acc_k(static_cast<std::size_t>(d)), acc_v(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < kv_rows; ++row) {
      const std::int64_t c = row % p.j;
      const std::int64_t kvh = (row / p.j) % p.hk;
      const std::int64_t bb = row / (p.j * p.hk);
      std::fill(acc_k.begin(), acc_k.end(), 0.0f);
      std::fill(acc_v.begin(), acc_v.end(), 0.0f);
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t at = ((bb * p.h + kvh * group + g) * p.j + c) * sh.dp;
        for (std::int64_t x = 0; x < d; ++x) {
          acc_k[static_cast<std::size_t>(x)] += sh.dkf[at + x];
          acc_v[static_cast<std::size_t>(x)] += sh.dvf[at + x];
        }
      }
      const std::size_t dst = static_cast<std::size_t>(row * d);
      store_floats_at(acc_k.data(), static_cast<std::size_t>(d), 1.0f, p.dtype, p.dk, dst);
      store_floats_at(acc_v.data(), static_cast<std::size_t>(d), 1.0f, p.dtype, p.dv, dst);
    }
  }
}

// The table and slope gradients: per (batch, head) sums added over the
// batch in order (the result does not depend on the thread count).
void ReduceBiasGrads(const AttentionParams& p, const AttentionBwdShared& sh) {
  if (p.dtable) {
    const std::int64_t len = std::max<std::int64_t>(0, 2 * p.j - 1);
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      for (std::int64_t e = 0; e < len; ++e) {
        float sum = 0.0f;
        for (std::int64_t bb = 0; bb < p.b; ++bb) {
          sum += sh.dtab[(bb * p.h + hh) * sh.rlen + (len - 1 - e)];
        }
        p.dtable[hh * len + e] = sum;
      }
    }
  }
  if (p.dslopes) {
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      float sum = 0.0f;
      for (std::int64_t bb = 0; bb < p.b; ++bb) sum += sh.dslope[bb * p.h + hh];
      p.dslopes[hh] = sum;
    }
  }
}

void BwdRun(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k) {
  const DF df;
  const std::int64_t n = AttnLanes(df);
  const std::int64_t bh = p.b * p.h;
  AttentionBwdShared sh;
  sh.dp = AttnRoundUp(df, p.d);
  sh.bq = std::max<std::int64_t>(1, std::min(block_q, p.i));
  sh.bk = std::max<std::int64_t>(1, std::min(block_k, p.j));
  sh.bkp = AttnRoundUp(df, sh.bk);
  sh.nkb = (p.j + sh.bk - 1) / sh.bk;
  sh.jp = sh.nkb * sh.bk + n;
  sh.rlen = 2 * p.j - 1 + sh.bkp + n;  // window reads run at most one padded block past
  const char* what = "the attention backward's per-head gradients";
  std::vector<float> dkf, dvf, dtab, dslope;
  resize_scratch(dkf, bh * p.j * sh.dp, what, 0.0f);
  resize_scratch(dvf, bh * p.j * sh.dp, what, 0.0f);
  if (p.dtable) resize_scratch(dtab, bh * sh.rlen, what, 0.0f);
  if (p.dslopes) resize_scratch(dslope, bh, what, 0.0f);
  sh.dkf = dkf.data();
  sh.dvf = dvf.data();
  sh.dtab = p.dtable ? dtab.data() : nullptr;
  sh.dslope = p.dslopes ? dslope.data() : nullptr;
  if (p.ddense && p.j > 0) std::fill(p.ddense, p.ddense + bh * p.i * p.j, 0.0f);
  const int threads = omp_get_max_threads();
  const double flops = static_cast<double>(bh) * static_cast<double>(p.i) *
                       static_cast<double>(std::max<std::int64_t>(p.j, 1)) *
                       static_cast<double>(p.d);
  const bool parallel = bh > 1 && threads > 1 && flops >= 65536.0;
  if (p.i > 0 && bh > 0) {
    // A failed allocation on a thread is rethrown after the region; every
    // thread still meets the loop.
    ThreadErrors errors;
#pragma omp parallel if (parallel)
    {
      std::unique_ptr<AttentionBwdWork> work;
      errors.run([&] {
        work = std::make_unique<AttentionBwdWork>(p.i, sh.jp, p.d, sh.dp, sh.bq, sh.bkp);
      });
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < bh; ++t) {
        if (!errors.failed()) BwdTask(p, sh, t / p.h, t % p.h, *work);
      }
    }
    errors.rethrow();
  }
  ReduceKeyValueGrads(p, sh, parallel);
  ReduceBiasGrads(p, sh);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posbias::detail {

HWY_EXPORT(BwdRun);

void attention_backward_blocked(const AttentionParams& p, std::int64_t block_q,
                                std::int64_t block_k) {
  HWY_DYNAMIC_DISPATCH(BwdRun)(p, block_q, block_k);
}

void attention_backward_kernel(const AttentionParams& p) { attention_backward_blocked(p, 64, 64); }

}  // namespace posbias::detail
#endif  // HWY_ONCE
