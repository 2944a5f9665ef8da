// The recomputing backward of the fused attention, compiled once per
// instruction set by Highway and chosen at run time. See
// attention_backward.h.
//
// A task owns one (sequence, query head). It packs the sequence's q and dO
// of that head (rows of dp floats), its kv head's K (rows) and K^T, V^T (d
// rows over the keys) into float32 once, then walks key blocks (outer) and
// the query blocks that can see them (inner), FlashAttention-2's order: the
// key block's dK and dV rows stay in cache while the query blocks stream
// past, dQ accumulates in a per-thread [i, dp] buffer. Per (query block, key
// block):
//
//   S  = (scale Q) K^T, dP = dO V^T (the forward's register-tiled score
//        tile); per row over its visible keys: raw = S, with a softcap
//        t = tanh(raw / cap) and s = cap t, plus the bias, P = exp(s - lse)
//        (0 for keys it cannot see); dS = P (dP - D), D = rowsum(dO * out);
//   the bias gradients from dS: table, a reversed per-head diagonal
//   accumulator (row r's keys are a forward window of it); slopes, the sum
//   of dS * -|c - q_r|; dense, dS written out;
//   then dS times d s / d raw = 1 - t^2 (softcap), and
//   dV += P^T dO;  dK += dS^T (scale Q);  dQ += dS K  (times scale at the end).
//
// The visible keys of a row are visible_keys() (causal, window) and the key
// mask; key blocks no row of the task sees (outside the causal/window band,
// or all masked) are skipped, and the query blocks of a key block are those
// whose rows' visible ranges (monotone in the position) meet it. Masked keys
// are packed as zeros (their K and V rows are never read) and their dK, dV
// rows are written as zeros. Only the table entries of visible keys are
// read (a window may leave the table short of the block's far keys).
//
// The products share one micro-kernel, C[R rows][V vectors] (+)= sum_t
// A(row, t) B[t][columns], with A read through two strides (so P^T and dS^T
// need no transposition) and B row-major (attention_blocks-inl.h).
//
// dK and dV: without grouped-query heads a task owns its kv head's rows and
// stores them itself; with groups each query head's task accumulates its
// own partial in float32 and adds it into its kv head's sum in head order
// as the heads end (GroupSlots: whichever thread ends a head, the same
// additions; the last head's stores the rows). The table
// and slope gradients likewise per (sequence, head), summed over the
// sequences in order: the result does not depend on the thread count.
// Tasks are scheduled longest first (a packed batch's long sequences do not
// end up last on one thread).
//
// Flushed blocks: P = exp(s - lse) is exactly 0 where s - lse < -40
// (ExpFlushed), and a (query block, key block) whose every P is 0 adds
// nothing but zeros of either sign: dS = P (dP - D) = +-0 where dP and D
// are finite, so dV += P^T dO, dK += dS^T Q, dQ += dS K and the slope
// gradient add +-0, which leaves every sum as it was (none is -0: each
// starts at +0). With ALiBi (or no bias), as the forward's flushed tiles,
// such a block is skipped when the bound of attention_flush_bound-inl.h
// proves it before any product, from the packed rows' norms (q scaled, K)
// and the rows' lse, and when every value it would have read is finite:
// the block's V rows, and the rows' dO and D (a NaN there would reach
// dQ, dK and dV through 0 * NaN). The same bits either way
// (POSBIAS_FLUSHED_TILES=0 turns it off; the tests compare).

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
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention_blocks-inl.h"
#include "kernels/attention_exp-inl.h"
#include "kernels/attention_flush_bound-inl.h"
#include "kernels/attention_fused.h"  // flushed_skips_enabled
#include "kernels/float_store.h"
#include "kernels/group_slots.h"
#include "kernels/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sizes shared by every task of a call.
struct AttentionBwdShared {
  std::int64_t bq = 0, bk = 0, bkp = 0, dp = 0;
  std::int64_t imax = 0, jmax = 0;  // longest sequence's queries and keys
  std::int64_t jp = 0;              // packed key columns (whole blocks plus a vector)
  std::int64_t group = 1;           // query heads per kv head
  std::int64_t tlen = 0, tpad = 0;  // table length 2 centre + 1; accumulator padding
  GroupSlots* slots = nullptr;      // group > 1: per query head dK, dV ([2, jmax, dp] a slot)
  float* dtab = nullptr;            // [b h, tlen + 2 tpad] reversed diagonal sums, or null
  float* dslope = nullptr;          // [b h], or null
  bool skip = false;                // flushed blocks may be skipped (see the top of this file)
};

// Per-thread buffers (64-byte aligned). Names in this file are unique
// across src/kernels (shared HWY_NAMESPACE).
struct AttentionBwdWork {
  hwy::AlignedFreeUniquePtr<float[]> q, dout, k, kt, vt, dq, dk, dv, delta, lse, s, ds, tg, keep,
      row, vrows, tmp;
  // With sh.skip: per query row |q| (scaled) and whether its dO and D are
  // finite (1 / 0); per key |k| and whether its V row is finite.
  hwy::AlignedFreeUniquePtr<float[]> qnorm, row_ok, knorm, v_ok;
  AttentionBwdWork(const AttentionBwdShared& sh, std::int64_t d)
      : q(Alloc(sh.imax * sh.dp)),
        dout(Alloc(sh.imax * sh.dp)),
        k(Alloc(sh.jp * sh.dp)),
        kt(Alloc(d * sh.jp)),
        vt(Alloc(d * sh.jp)),
        dq(Alloc(sh.imax * sh.dp)),
        dk(Alloc(sh.group == 1 ? sh.jp * sh.dp : 0)),
        dv(Alloc(sh.group == 1 ? sh.jp * sh.dp : 0)),
        delta(Alloc(sh.imax)),
        lse(Alloc(sh.imax)),
        s(Alloc(sh.bq * sh.bkp)),
        ds(Alloc(sh.bq * sh.bkp)),
        tg(Alloc(sh.bq * sh.bkp)),
        keep(Alloc(sh.jp)),
        row(Alloc(sh.dp)),
        vrows(Alloc(static_cast<std::int64_t>(hn::MaxLanes(DF())) * sh.dp)),
        tmp(Alloc(64)),
        qnorm(Alloc(sh.skip ? sh.imax : 0)),
        row_ok(Alloc(sh.skip ? sh.imax : 0)),
        knorm(Alloc(sh.skip ? sh.jp : 0)),
        v_ok(Alloc(sh.skip ? sh.jp : 0)) {}
  static hwy::AlignedFreeUniquePtr<float[]> Alloc(std::int64_t count) {
    return allocate_scratch<float>(count, "the attention backward's per-thread buffers");
  }
};

// One (sequence, query head) of the backward: its indices and accumulators.
struct AttentionBwdHead {
  std::int64_t s = 0, hh = 0, kvh = 0;
  Sequence seq;
  std::int64_t tok0 = 0;        // first key token of the sequence
  float neg_slope = 0.0f;       // kAlibi
  const float* rtab = nullptr;  // kTable: this head's reversed table
  const float* keep = nullptr;  // key mask as 1 / 0 per key, or null
  float* dk = nullptr;          // [j, dp], times scale already (q is scaled)
  float* dv = nullptr;          // [j, dp]
  float* rgrad = nullptr;       // reversed table gradient at entry 0, or null
  float slope_grad = 0.0f;
};

// Element offsets of the gradient outputs (attention_backward.h).
std::int64_t BwdDqOffset(const AttentionParams& p, const AttentionBwdHead& hd, std::int64_t r) {
  if (p.cu_q != nullptr) return ((hd.seq.q_row0 + r) * p.h + hd.hh) * p.d;
  return ((hd.s * p.h + hd.hh) * p.i + r) * p.d;
}

// Key token t (dense: sequence t / j, key t % j) of kv head kvh.
std::int64_t BwdDkOffset(const AttentionParams& p, std::int64_t t, std::int64_t kvh) {
  if (p.cu_k != nullptr) return (t * p.hk + kvh) * p.d;
  return (((t / p.j) * p.hk + kvh) * p.j + t % p.j) * p.d;
}

// The task's q (times scale) and dO as rows of dp floats, D = rowsum(dO *
// out), the forward's lse; its kv head's K rows, K^T and V^T (zero for
// masked keys and past the sequence's keys up to its last block and a
// vector); the key mask as floats.
void PackBwdTask(const AttentionParams& p, const AttentionBwdShared& sh, AttentionBwdHead& hd,
                 AttentionBwdWork& w) {
  const std::int64_t d = p.d, dp = sh.dp, jp = sh.jp, s = hd.s, hh = hd.hh;
  const Sequence& sq = hd.seq;
  float* kt = w.kt.get();
  float* vt = w.vt.get();
  float* keep = w.keep.get();
  for (std::int64_t r = 0; r < sq.i; ++r) {
    const std::int64_t row = sq.q_row0 + r;
    float* qr = w.q.get() + r * dp;
    float* gr = w.dout.get() + r * dp;
    PackRow(p.q, p.dtype, s * p.q_stride[0] + hh * p.q_stride[1] + row * p.q_stride[2],
            p.q_stride[3], d, p.scale, qr);
    PackRow(p.dout, p.dtype, s * p.dout_stride[0] + hh * p.dout_stride[1] + row * p.dout_stride[2],
            p.dout_stride[3], d, 1.0f, gr);
    const std::int64_t* os = p.saved_out_stride;
    PackRow(p.saved_out, p.dtype, s * os[0] + hh * os[1] + row * os[2], os[3], d, 1.0f,
            w.row.get());
    float delta = 0.0f;
    for (std::int64_t x = 0; x < d; ++x) delta += gr[x] * w.row[static_cast<std::size_t>(x)];
    for (std::int64_t x = d; x < dp; ++x) qr[x] = gr[x] = 0.0f;
    w.delta[static_cast<std::size_t>(r)] = delta;
    if (sh.skip) {
      w.qnorm[r] = RowNorm(DF(), qr, dp);
      w.row_ok[r] = std::isfinite(delta) && PackedValuesFinite(DF(), gr, 1, dp) ? 1.0f : 0.0f;
    }
    const std::int64_t* ls = p.saved_lse_stride;
    w.lse[static_cast<std::size_t>(r)] = p.saved_lse[s * ls[0] + hh * ls[1] + row * ls[2]];
  }
  const std::int64_t k_base = s * p.k_stride[0] + hd.kvh * p.k_stride[1];
  const std::int64_t v_base = s * p.v_stride[0] + hd.kvh * p.v_stride[1];
  const std::int64_t nkb = (sq.j + sh.bk - 1) / sh.bk;
  const std::int64_t jend = std::min(jp, nkb * sh.bk + static_cast<std::int64_t>(hn::Lanes(DF())));
  hd.keep = nullptr;
  if (p.key_mask != nullptr) {
    for (std::int64_t c = 0; c < sq.j; ++c) {
      const std::uint8_t m = p.key_mask[s * p.key_mask_stride[0] + c * p.key_mask_stride[1]];
      keep[c] = m != 0 ? 1.0f : 0.0f;
    }
    std::fill(keep + sq.j, keep + jend, 0.0f);
    hd.keep = keep;
  }
  // Key c's K row into kr and its V row into vr (dp floats each, zero past
  // d; zero rows for a masked key), with its norm and V's finiteness.
  const auto pack_key = [&](std::int64_t c, float* kr, float* vr) {
    if (hd.keep != nullptr && hd.keep[c] == 0.0f) {
      std::fill(kr, kr + dp, 0.0f);
      std::fill(vr, vr + dp, 0.0f);
      if (sh.skip) {
        w.knorm[c] = 0.0f;
        w.v_ok[c] = 1.0f;
      }
      return;
    }
    const std::int64_t tok = sq.k_row0 + c;
    PackRow(p.k, p.kv_dtype, k_base + tok * p.k_stride[2], p.k_stride[3], d, 1.0f, kr);
    PackRow(p.v, p.kv_dtype, v_base + tok * p.v_stride[2], p.v_stride[3], d, 1.0f, vr);
    std::fill(kr + d, kr + dp, 0.0f);
    std::fill(vr + d, vr + dp, 0.0f);
    if (sh.skip) {
      w.knorm[c] = RowNorm(DF(), kr, dp);
      w.v_ok[c] = PackedValuesFinite(DF(), vr, 1, dp) ? 1.0f : 0.0f;
    }
  };
  // K^T and V^T: a group of a vector's lanes of keys at a time by register
  // transposes where the target has them, the rest key by key.
  constexpr std::size_t kN = hn::MaxLanes(DF());
  constexpr auto n = static_cast<std::int64_t>(kN);
  std::int64_t c = 0;
  if constexpr (kTransposeSquare) {
    const float* krows[kN];
    const float* vrows[kN];
    for (; c + n <= sq.j; c += n) {
      for (std::int64_t u = 0; u < n; ++u) {
        float* kr = w.k.get() + (c + u) * dp;
        float* vr = w.vrows.get() + u * dp;
        pack_key(c + u, kr, vr);
        krows[u] = kr;
        vrows[u] = vr;
      }
      TransposeRowGroup(DF(), krows, d, kt + c, jp);
      TransposeRowGroup(DF(), vrows, d, vt + c, jp);
    }
  }
  for (; c < sq.j; ++c) {
    float* kr = w.k.get() + c * dp;
    pack_key(c, kr, w.row.get());
    for (std::int64_t x = 0; x < d; ++x) {
      kt[x * jp + c] = kr[x];
      vt[x * jp + c] = w.row[static_cast<std::size_t>(x)];
    }
  }
  std::fill(w.k.get() + sq.j * dp, w.k.get() + jend * dp, 0.0f);
  for (std::int64_t x = 0; x < d; ++x) {
    std::fill(kt + x * jp + sq.j, kt + x * jp + jend, 0.0f);
    std::fill(vt + x * jp + sq.j, vt + x * jp + jend, 0.0f);
  }
  std::fill(w.dq.get(), w.dq.get() + sq.i * dp, 0.0f);
  std::fill(hd.dk, hd.dk + sq.j * dp, 0.0f);  // the task's own rows (group > 1: its slot's)
  std::fill(hd.dv, hd.dv + sq.j * dp, 0.0f);
}

// One row against the block's keys [c0, c0 + bcp): columns [b0, e0) are in
// the row's visible range. s (raw scores) becomes P and dp (dP) becomes dS
// with respect to the raw score (zero outside the visible keys); tg holds
// 1 - t^2 with a softcap. The bias gradients are taken from dS on the way.
void BwdRow(DF df, const AttentionParams& p, AttentionBwdHead& hd, std::int64_t qr,
            std::int64_t qpos, std::int64_t c0, std::int64_t b0, std::int64_t e0, std::int64_t bcp,
            float lse, float delta, float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
            float* HWY_RESTRICT tg, float* HWY_RESTRICT tmp) {
  const std::int64_t n = AttnLanes(df);
  const std::int64_t a0 = b0 - b0 % n;
  const std::int64_t span = AttnRoundUp(df, e0);
  std::fill(s, s + a0, 0.0f);
  std::fill(dp, dp + a0, 0.0f);
  const bool capped = p.softcap > 0.0f;
  const VF cap = hn::Set(df, p.softcap), inv_cap = hn::Set(df, capped ? 1.0f / p.softcap : 0.0f);
  const VF vlse = hn::Set(df, lse), vdelta = hn::Set(df, delta), one = hn::Set(df, 1.0f);
  const VF neg_slope = hn::Set(df, hd.neg_slope);
  const VF rel0 = hn::Add(hn::Set(df, static_cast<float>(c0 - qpos)), hn::Iota(df, 0.0f));
  // kTable: entry wbase + x of the head's reversed table is key c0 + x.
  const float* rtab = hd.rtab;
  const std::int64_t wbase = table_index(p, c0 - qpos);
  assert(rtab == nullptr ||
         (wbase + b0 >= 0 && wbase + e0 - 1 < 2 * p.table_centre + 1));  // the checks' promise
  const float* dense = nullptr;
  if (p.bias == FusedBias::kDense) {
    dense = p.dense + hd.s * p.dense_stride[0] + hd.hh * p.dense_stride[1] +
            qr * p.dense_stride[2] + c0 * p.dense_stride[3];
  }
  VF slope_grad = hn::Zero(df);
  for (std::int64_t x = a0; x < span; x += n) {
    auto keep =
        hn::AndNot(hn::FirstN(df, static_cast<std::size_t>(std::max<std::int64_t>(0, b0 - x))),
                   hn::FirstN(df, static_cast<std::size_t>(e0 - x)));
    if (hd.keep != nullptr)
      keep = hn::And(keep, hn::Ne(hn::LoadU(df, hd.keep + c0 + x), hn::Zero(df)));
    VF v = hn::Load(df, s + x);
    if (capped) {
      const VF t = SoftcapTanh(df, hn::Mul(v, inv_cap));
      hn::Store(hn::NegMulAdd(t, t, one), df, tg + x);
      v = hn::Mul(cap, t);
    }
    const VF dist = hn::Abs(hn::Add(rel0, hn::Set(df, static_cast<float>(x))));
    if (p.bias == FusedBias::kAlibi) {
      v = hn::MulAdd(neg_slope, dist, v);
    } else if (rtab != nullptr || dense != nullptr) {
      // Only visible entries are read (the table may end inside the block).
      const bool whole = x >= b0 && x + n <= e0;
      if (rtab != nullptr && whole) {
        v = hn::Add(v, hn::LoadU(df, rtab + wbase + x));
      } else {
        for (std::int64_t u = 0; u < n; ++u) {
          const std::int64_t c = x + u;
          tmp[u] = c < b0 || c >= e0 ? 0.0f
                   : rtab != nullptr ? rtab[wbase + c]
                                     : dense[c * p.dense_stride[3]];
        }
        v = hn::Add(v, hn::Load(df, tmp));
      }
    }
    const VF pv = hn::IfThenElseZero(keep, ExpFlushed(df, hn::Sub(v, vlse)));
    const VF dsv = hn::IfThenElseZero(keep, hn::Mul(pv, hn::Sub(hn::Load(df, dp + x), vdelta)));
    hn::Store(pv, df, s + x);
    hn::Store(dsv, df, dp + x);
    slope_grad = hn::NegMulAdd(dsv, dist, slope_grad);
  }
  std::fill(s + span, s + bcp, 0.0f);
  std::fill(dp + span, dp + bcp, 0.0f);
  if (p.bias == FusedBias::kAlibi) hd.slope_grad += hn::GetLane(hn::SumOfLanes(df, slope_grad));
  if (hd.rgrad != nullptr) {
    // dS is zero outside [b0, e0); the accumulator is padded by a vector on
    // both sides for the lanes around them.
    float* g = hd.rgrad + table_index(p, c0 - qpos);
    for (std::int64_t x = a0; x < span; x += n) {
      hn::StoreU(hn::Add(hn::LoadU(df, g + x), hn::Load(df, dp + x)), df, g + x);
    }
  }
  if (p.ddense != nullptr) {
    float* dst = p.ddense + ((hd.s * p.h + hd.hh) * p.i + qr) * p.j + c0;
    std::copy(dp + b0, dp + e0, dst + b0);
  }
  if (capped) {
    for (std::int64_t x = a0; x < span; x += n) {
      hn::Store(hn::Mul(hn::Load(df, dp + x), hn::Load(df, tg + x)), df, dp + x);
    }
  }
}

// Query rows [r0, r0 + br) against keys [c0, c0 + bc): P and dS of every
// row, then dV += P^T dO, dK += dS^T Q, dQ += dS K.
void BwdBlock(DF df, const AttentionParams& p, const AttentionBwdShared& sh, AttentionBwdHead& hd,
              std::int64_t r0, std::int64_t br, std::int64_t c0, std::int64_t bc,
              AttentionBwdWork& w) {
  const std::int64_t dp = sh.dp, ld = sh.bkp;
  const std::int64_t bcp = AttnRoundUp(df, bc);
  float* s = w.s.get();
  float* ds = w.ds.get();
  QKAllRows(df, br, w.q.get() + r0 * dp, dp, p.d, w.kt.get() + c0, sh.jp, bcp, s, ld);
  QKAllRows(df, br, w.dout.get() + r0 * dp, dp, p.d, w.vt.get() + c0, sh.jp, bcp, ds, ld);
  for (std::int64_t r = 0; r < br; ++r) {
    const std::int64_t qr = r0 + r;
    const std::int64_t qpos = hd.seq.q_offset + qr;
    const float lse = w.lse[static_cast<std::size_t>(qr)];
    const KeyRange vr = visible_keys(p, hd.seq.j, qpos);
    const std::int64_t b0 = std::clamp<std::int64_t>(vr.begin - c0, 0, bc);
    const std::int64_t e0 = std::clamp<std::int64_t>(vr.end - c0, 0, bc);
    float* srow = s + r * ld;
    float* dsrow = ds + r * ld;
    // A row that saw no finite score, or no key of this block, has no
    // gradient here.
    if (lse == kAttnNegInf || e0 <= b0) {
      std::fill(srow, srow + bcp, 0.0f);
      std::fill(dsrow, dsrow + bcp, 0.0f);
      continue;
    }
    BwdRow(df, p, hd, qr, qpos, c0, b0, e0, bcp, lse, w.delta[static_cast<std::size_t>(qr)], srow,
           dsrow, w.tg.get() + r * ld, w.tmp.get());
  }
  MulAddRows(df, bc, dp, br, s, 1, ld, w.dout.get() + r0 * dp, dp, hd.dv + c0 * dp, dp);
  MulAddRows(df, bc, dp, br, ds, 1, ld, w.q.get() + r0 * dp, dp, hd.dk + c0 * dp, dp);
  MulAddRows(df, br, dp, bc, ds, ld, 1, w.k.get() + c0 * dp, dp, w.dq.get() + r0 * dp, dp);
}

// Whether query rows [r0, r0 + br) get P = 0 from every key of [c0, c0 +
// bc) that they see (the bound at the top of this file), with kmax the
// block's largest key norm (NaN if any is NaN) and its V rows finite; rows
// that see none of the block, or no key at all (lse = -inf), add nothing
// either way. `seen`: whether any row sees a key of the block.
bool BwdBlockFlushed(const AttentionParams& p, const AttentionBwdHead& hd,
                     const AttentionBwdWork& w, std::int64_t r0, std::int64_t br, std::int64_t c0,
                     std::int64_t bc, float kmax, bool& seen) {
  seen = false;
  for (std::int64_t qr = r0; qr < r0 + br; ++qr) {
    const std::int64_t qpos = hd.seq.q_offset + qr;
    const float lse = w.lse[qr];
    const KeyRange vr = visible_keys(p, hd.seq.j, qpos);
    const std::int64_t b0 = std::clamp<std::int64_t>(vr.begin - c0, 0, bc);
    const std::int64_t e0 = std::clamp<std::int64_t>(vr.end - c0, 0, bc);
    if (lse == kAttnNegInf || e0 <= b0) continue;  // as BwdBlock: nothing from this block
    seen = true;
    if (w.row_ok[qr] == 0.0f) return false;
    const double bias =
        p.bias == FusedBias::kAlibi
            ? AlibiBiasMax(hd.neg_slope, static_cast<double>(c0 + b0),
                           static_cast<double>(c0 + e0 - 1), static_cast<double>(qpos))
            : 0.0;
    if (!DotWithinHeadroom(w.qnorm[qr], kmax, p.softcap, FlushHeadroom(lse, bias))) return false;
  }
  return true;
}

// The first row in [0, i) whose position satisfies pred (pred is monotone:
// false, then true); i when none does.
template <typename Pred>
std::int64_t FirstRowWhere(std::int64_t i, Pred pred) {
  std::int64_t lo = 0, hi = i;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// acc += x over a row of dp floats; first: acc = (0 + acc) + x, the
// grouped-query sum's first two additions (0 + head 0, then head 1), so
// that every sum starts at +0 as a sum over the heads would.
void BwdAddRow(DF df, float* HWY_RESTRICT acc, const float* HWY_RESTRICT x, std::int64_t dp,
               bool first) {
  const std::int64_t n = AttnLanes(df);
  const VF zero = hn::Zero(df);
  for (std::int64_t e = 0; e < dp; e += n) {
    VF a = hn::Load(df, acc + e);
    if (first) a = hn::Add(zero, a);
    hn::Store(hn::Add(a, hn::Load(df, x + e)), df, acc + e);
  }
}

// One (sequence, query head): key blocks outer, the query blocks whose rows
// can see them inner; then dQ, and dK, dV without groups, are stored.
void BwdTask(const AttentionParams& p, const AttentionBwdShared& sh, std::int64_t s,
             std::int64_t hh, AttentionBwdWork& w) {
  const DF df;
  AttentionBwdHead hd;
  hd.s = s;
  hd.hh = hh;
  hd.kvh = hh / sh.group;
  hd.seq = sequence(p, s);
  const Sequence& sq = hd.seq;
  hd.tok0 = p.cu_k != nullptr ? sq.k_row0 : s * p.j;
  if (p.bias == FusedBias::kAlibi) hd.neg_slope = -slope_of(p, s, hh);
  if (p.bias == FusedBias::kTable) hd.rtab = p.rtable + hh * p.rtable_stride;
  if (sh.group == 1) {
    hd.dk = w.dk.get();
    hd.dv = w.dv.get();
  } else {
    hd.dk = sh.slots->Acquire();
    hd.dv = hd.dk + sh.jmax * sh.dp;
  }
  if (sh.dtab != nullptr) hd.rgrad = sh.dtab + (s * p.h + hh) * (sh.tlen + 2 * sh.tpad) + sh.tpad;
  PackBwdTask(p, sh, hd, w);
  std::int64_t skipped = 0;  // (query block, key block) pairs skipped, flushed
  auto range = [&](std::int64_t r) { return visible_keys(p, sq.j, sq.q_offset + r); };
  for (std::int64_t c0 = 0; c0 < sq.j && sq.i > 0; c0 += sh.bk) {
    const std::int64_t bc = std::min(sh.bk, sq.j - c0);
    if (hd.keep != nullptr &&
        std::all_of(hd.keep + c0, hd.keep + c0 + bc, [](float m) { return m == 0.0f; })) {
      continue;  // every key of the block is masked
    }
    // Rows meeting [c0, c0 + bc): their visible ranges end after c0 and
    // begin before c0 + bc (both bounds grow with the position).
    const std::int64_t r_lo =
        FirstRowWhere(sq.i, [&](std::int64_t r) { return range(r).end > c0; });
    const std::int64_t r_hi =
        FirstRowWhere(sq.i, [&](std::int64_t r) { return range(r).begin >= c0 + bc; });
    // The block's largest key norm and whether its values are finite.
    float kmax = 0.0f;  // NaN once a norm is
    bool values_finite = sh.skip;
    for (std::int64_t c = c0; sh.skip && c < c0 + bc; ++c) {
      const float kn = w.knorm[c];
      if (kn > kmax || std::isnan(kn)) kmax = kn;
      values_finite = values_finite && w.v_ok[c] != 0.0f;
    }
    for (std::int64_t r0 = (r_lo / sh.bq) * sh.bq; r0 < r_hi; r0 += sh.bq) {
      const std::int64_t br = std::min(sh.bq, sq.i - r0);
      bool seen = false;
      if (values_finite && BwdBlockFlushed(p, hd, w, r0, br, c0, bc, kmax, seen)) {
        skipped += seen ? 1 : 0;
        continue;
      }
      BwdBlock(df, p, sh, hd, r0, br, c0, bc, w);
    }
  }
  if (skipped > 0) count_backward_flushed_blocks(skipped);
  for (std::int64_t r = 0; r < sq.i; ++r) {
    store_floats_at(w.dq.get() + r * sh.dp, static_cast<std::size_t>(p.d), p.scale, p.dtype, p.dq,
                    static_cast<std::size_t>(BwdDqOffset(p, hd, r)));
  }
  if (hd.keep != nullptr) {  // masked keys: zero, whatever NaN met them
    for (std::int64_t c = 0; c < sq.j; ++c) {
      if (hd.keep[c] != 0.0f) continue;
      std::fill(hd.dk + c * sh.dp, hd.dk + (c + 1) * sh.dp, 0.0f);
      std::fill(hd.dv + c * sh.dp, hd.dv + (c + 1) * sh.dp, 0.0f);
    }
  }
  if (sh.dslope != nullptr) sh.dslope[s * p.h + hh] = hd.slope_grad;
  if (sh.group == 1) {
    for (std::int64_t c = 0; c < sq.j; ++c) {
      const std::size_t dst = static_cast<std::size_t>(BwdDkOffset(p, hd.tok0 + c, hd.kvh));
      store_floats_at(hd.dk + c * sh.dp, static_cast<std::size_t>(p.d), 1.0f, p.kv_dtype, p.dk,
                      dst);
      store_floats_at(hd.dv + c * sh.dp, static_cast<std::size_t>(p.d), 1.0f, p.kv_dtype, p.dv,
                      dst);
    }
    return;
  }
  // Grouped-query: this head's partial into its kv head's sum in head order
  // (GroupSlots), row by row, the last head's addition storing each row;
  // any head's `add` serves (it reads only the group's sequence, kv head).
  const auto add = [&](float* acc_k, const float* x_k, std::int64_t k) {
    float* acc_v = acc_k + sh.jmax * sh.dp;
    const float* x_v = x_k + sh.jmax * sh.dp;
    for (std::int64_t c = 0; c < sq.j; ++c) {
      const std::int64_t e = c * sh.dp;
      BwdAddRow(df, acc_k + e, x_k + e, sh.dp, k == 1);
      BwdAddRow(df, acc_v + e, x_v + e, sh.dp, k == 1);
      if (k == sh.group - 1) {
        const std::size_t dst = static_cast<std::size_t>(BwdDkOffset(p, hd.tok0 + c, hd.kvh));
        const std::size_t d = static_cast<std::size_t>(p.d);
        store_floats_at(acc_k + e, d, 1.0f, p.kv_dtype, p.dk, dst);
        store_floats_at(acc_v + e, d, 1.0f, p.kv_dtype, p.dv, dst);
      }
    }
  };
  sh.slots->Finish(s * p.hk + hd.kvh, hh % sh.group, hd.dk, add);
}

// The table and slope gradients: per (sequence, head) sums added over the
// sequences in order (the result does not depend on the thread count).
void ReduceBiasGrads(const AttentionParams& p, const AttentionBwdShared& sh) {
  if (p.dtable != nullptr) {
    const std::int64_t len = sh.tlen, stride = sh.tlen + 2 * sh.tpad;
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      for (std::int64_t e = 0; e < len; ++e) {
        float sum = 0.0f;
        for (std::int64_t s = 0; s < p.b; ++s) {
          sum += sh.dtab[(s * p.h + hh) * stride + sh.tpad + (len - 1 - e)];
        }
        p.dtable[hh * len + e] = sum;
      }
    }
  }
  if (p.dslopes != nullptr) {
    const std::int64_t count = p.slopes_seq_stride == 0 ? p.h : p.b * p.h;
    std::fill(p.dslopes, p.dslopes + count, 0.0f);
    for (std::int64_t s = 0; s < p.b; ++s) {
      for (std::int64_t hh = 0; hh < p.h; ++hh) {
        p.dslopes[s * p.slopes_seq_stride + hh] += sh.dslope[s * p.h + hh];
      }
    }
  }
}

// The call's sizes, and its tasks (sequence, head) longest first.
AttentionBwdShared BwdSizes(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k,
                            std::vector<std::int64_t>& tasks) {
  const DF df;
  const std::int64_t n = AttnLanes(df);
  AttentionBwdShared sh;
  std::vector<std::int64_t> cost(static_cast<std::size_t>(p.b));
  for (std::int64_t s = 0; s < p.b; ++s) {
    const Sequence sq = sequence(p, s);
    sh.imax = std::max(sh.imax, sq.i);
    sh.jmax = std::max(sh.jmax, sq.j);
    cost[static_cast<std::size_t>(s)] = sq.i * std::max<std::int64_t>(sq.j, 1);
  }
  sh.dp = AttnRoundUp(df, p.d);
  sh.bq = std::max<std::int64_t>(1, std::min(block_q, sh.imax));
  sh.bk = std::max<std::int64_t>(1, std::min(block_k, sh.jmax));
  sh.bkp = AttnRoundUp(df, sh.bk);
  sh.jp = (sh.jmax + sh.bk - 1) / sh.bk * sh.bk + n;
  sh.group = p.hk > 0 ? p.h / p.hk : 1;
  sh.tlen = 2 * p.table_centre + 1;
  sh.tpad = n;
  // Sequences ordered by cost (stable: equal ones in batch order), then
  // their heads.
  std::vector<std::int64_t> order(static_cast<std::size_t>(p.b));
  for (std::int64_t s = 0; s < p.b; ++s) order[static_cast<std::size_t>(s)] = s;
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return cost[static_cast<std::size_t>(a)] > cost[static_cast<std::size_t>(b)];
  });
  tasks.clear();
  for (std::int64_t s : order) {
    for (std::int64_t hh = 0; hh < p.h; ++hh) tasks.push_back(s * p.h + hh);
  }
  return sh;
}

void BwdRun(const AttentionParams& p, std::int64_t block_q, std::int64_t block_k) {
  assert(p.key_layout == KeyLayout::kDense);
  std::vector<std::int64_t> tasks;
  AttentionBwdShared sh = BwdSizes(p, block_q, block_k, tasks);
  const std::int64_t bh = p.b * p.h;
  const char* what = "the attention backward's per-head gradients";
  std::vector<float> dtab, dslope;
  // Grouped-query dK, dV: per query head in slots that each task zeroes
  // as it starts (PackBwdTask) and the group's sum reuses (GroupSlots).
  std::unique_ptr<GroupSlots> slots;
  if (sh.group > 1) {
    slots = std::make_unique<GroupSlots>(p.b * p.hk, sh.group, 2 * sh.jmax * sh.dp);
    sh.slots = slots.get();
  }
  if (p.dtable != nullptr) {
    resize_scratch(dtab, bh * (sh.tlen + 2 * sh.tpad), what, 0.0f);
    sh.dtab = dtab.data();
  }
  if (p.dslopes != nullptr) {
    resize_scratch(dslope, bh, what, 0.0f);
    sh.dslope = dslope.data();
  }
  if (p.ddense != nullptr && p.j > 0) std::fill(p.ddense, p.ddense + bh * p.i * p.j, 0.0f);
  // Flushed blocks (the top of this file): where the bias's largest value
  // over a block is at hand (ALiBi, or none) and nothing but dQ, dK, dV
  // and the slopes' gradients is wanted.
  sh.skip = (p.bias == FusedBias::kAlibi || p.bias == FusedBias::kNone) && p.ddense == nullptr &&
            p.dtable == nullptr && flushed_skips_enabled();
  const int threads = omp_get_max_threads();
  double flops = 0.0;
  for (std::int64_t s = 0; s < p.b; ++s) {
    const Sequence sq = sequence(p, s);
    flops += static_cast<double>(sq.i) * static_cast<double>(std::max<std::int64_t>(sq.j, 1));
  }
  flops *= static_cast<double>(p.h) * static_cast<double>(p.d);
  const bool parallel = bh > 1 && threads > 1 && flops >= 65536.0;
  const std::int64_t count = static_cast<std::int64_t>(tasks.size());
  if (count > 0) {
    // A failed allocation on a thread is rethrown after the region; every
    // thread still meets the loop.
    ThreadErrors errors;
#pragma omp parallel if (parallel)
    {
      std::unique_ptr<AttentionBwdWork> work;
      errors.run([&] { work = std::make_unique<AttentionBwdWork>(sh, p.d); });
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < count; ++t) {
        const std::int64_t task = tasks[static_cast<std::size_t>(t)];
        if (!errors.failed()) errors.run([&] { BwdTask(p, sh, task / p.h, task % p.h, *work); });
      }
    }
    errors.rethrow();
  }
  ReduceBiasGrads(p, sh);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posbias::detail {

namespace {
std::atomic<std::int64_t> backward_flushed{0};
}  // namespace

std::int64_t backward_flushed_blocks() { return backward_flushed.load(std::memory_order_relaxed); }

void count_backward_flushed_blocks(std::int64_t blocks) {
  backward_flushed.fetch_add(blocks, std::memory_order_relaxed);
}

HWY_EXPORT(BwdRun);

void attention_backward_blocked(const AttentionParams& p, std::int64_t block_q,
                                std::int64_t block_k) {
  HWY_DYNAMIC_DISPATCH(BwdRun)(p, block_q, block_k);
}

void attention_backward_kernel(const AttentionParams& p) { attention_backward_blocked(p, 64, 64); }

}  // namespace posbias::detail
#endif  // HWY_ONCE
