// Internal, per instruction set: the softmax's exp, as the attention
// kernels (attention_softmax-inl.h, the backward) use it:
// ExpInRange (the arithmetic), ExpFlushed (clamped, tiny terms and NaN
// flushed to 0), ExpUnclamped (for x <= 88 only: no clamp), SafeExp
// (flushed, but NaN stays NaN); and the soft-cap's tanh (SoftcapTanh).
// Per-target include guard (Highway's toggle idiom).
#if defined(POSBIAS_SRC_KERNELS_ATTENTION_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSBIAS_SRC_KERNELS_ATTENTION_EXP_INL_H_
#undef POSBIAS_SRC_KERNELS_ATTENTION_EXP_INL_H_
#else
#define POSBIAS_SRC_KERNELS_ATTENTION_EXP_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for x = score - row max (or - lse) <= 0, flushed to 0 below -40
// (and for -inf and NaN). Every row has one term exp(0) = 1, so terms below
// e^-40 = 4e-18 change neither the sum nor the output in float32; flushing
// them keeps subnormal numbers (which x86 handles in microcode at ~100
// cycles each) out of the P V products, where far-away ALiBi keys (x around
// -1000) would otherwise produce them all the time.
//
// Its own exp, not hn::Exp: on [-40, 88] the result needs no range checks
// and 2^n one exponent shift, so it is about 15 operations where hn::Exp
// with the flush took about 30 (the softmax pass is one exp per score).
//
// With 8 or 16 lanes (AVX2, AVX-512), x = (n + j / K) ln2 + r with K the
// lanes, n K + j = round(x K / ln2) (the rounding by adding 1.5 2^23, whose
// low bits are then n K + j), |r| <= ln2 / 2K in two FMA steps (ln2 / K
// split so that the product is exact); 2^(j / K) comes from a table held in
// one register (a lane permute on x86 indexed by kn's bits as they are: it
// reads their low bits, j), its exponent raised by n with an integer add
// (the table's entries less j's shifted bits, so that no mask clears them),
// and e^r = 1 + r + r^2/2 + ... to r^3 (K = 16) or r^4 (K = 8),
// truncation below 1e-8 relative, the 1 added by the last FMA
// (2^(j/K) + 2^(j/K) (e^r - 1)). Seven FMA-pipe operations where the
// polynomial to r^7 without a table took eleven (a sixth of the prefill's
// softmax tile), and 11 vector operations in all (13 with the two masks
// before the permute and the add). Within 2 ulp of exp.
//
// Narrower vectors keep the table-free form: n = round(x / ln2) (the
// rounding by adding 1.5 2^23 + 127, whose low bits are then n + 127:
// shifted into the exponent field they are 2^n), |r| <= ln2 / 2, and e^r by
// its Taylor series to r^7 (truncation below 6e-9 relative).
//
// Lane i of the result: table lane (bits_i mod lanes), for 8 or 16 lanes.
// x86's vpermd reads the index's low 3 or 4 bits only, so kn's bits go in
// as they are (Highway's TableLookupLanes wants indices below the lane
// count: one mask more). GCC 12 takes the intrinsics' undefined
// pass-through operand for an uninitialised read once inlined
// (-Wmaybe-uninitialized, an error with POSBIAS_WERROR): off here, as
// Highway turns it off around its own ops.
HWY_DIAGNOSTICS(push)
HWY_DIAGNOSTICS_OFF(disable : 4701, ignored "-Wmaybe-uninitialized")
template <class DI, class VI = hn::Vec<DI>>
HWY_INLINE VI ExpTableEntry(DI di, VI table, VI bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  (void)di;
  if constexpr (hn::MaxLanes(DI()) == 16) {
#if HWY_TARGET <= HWY_AVX3
    return VI{_mm512_permutexvar_epi32(bits.raw, table.raw)};
#endif
  } else {
    return VI{_mm256_permutevar8x32_epi32(table.raw, bits.raw)};
  }
#else
  return hn::TableLookupLanes(
      table, hn::IndicesFromVec(di, hn::And(bits, hn::Set(di, hn::MaxLanes(DI()) - 1))));
#endif
}
HWY_DIAGNOSTICS(pop)

// The last step of ExpInRange, scale + scale em1: with kZeroBelow, 0 in the
// lanes where `below` is set, in the same operation on AVX-512 (a
// zero-masked FMA: the prefill's softmax spends 15 operations a vector on
// its exp, and on a Sapphire Rapids class core each one takes an FMA's
// slot), else by a select after it. The same bits either way.
template <bool kZeroBelow, class D, class V = hn::Vec<D>, class M = hn::Mask<D>>
HWY_INLINE V ExpLastStep(D df, V scale, V em1, M below) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (kZeroBelow && hn::MaxLanes(D()) == 16) {
    (void)df;
    return V{
        _mm512_maskz_fmadd_ps(static_cast<__mmask16>(~below.raw), scale.raw, em1.raw, scale.raw)};
  }
#endif
  const V e = hn::MulAdd(scale, em1, scale);
  if constexpr (kZeroBelow) {
    return hn::IfThenZeroElse(below, e);
  } else {
    (void)df;
    (void)below;
    return e;
  }
}

// e^x for x in [-40, 88] or NaN (NaN gives NaN), by the steps above; with
// kZeroBelow, 0 where `below` is set (whatever x is there).
template <bool kZeroBelow = false, class D, class V = hn::Vec<D>>
HWY_INLINE V ExpInRange(D df, V x, hn::Mask<D> below = hn::Mask<D>()) {
  const hn::RebindToSigned<D> di;
  constexpr std::size_t kLanes = hn::MaxLanes(D());
  if constexpr (kLanes == 8 || kLanes == 16) {
    constexpr float kK = static_cast<float>(kLanes);
    const V magic = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
    const V kn = hn::MulAdd(x, hn::Set(df, kK * 1.44269504088896341f), magic);
    const V nf = hn::Sub(kn, magic);
    V r = hn::NegMulAdd(nf, hn::Set(df, 0.693359375f / kK), x);  // ln2_hi / K: 9 bits
    r = hn::NegMulAdd(nf, hn::Set(df, -2.12194440054690583e-4f / kK), r);
    // The low bits of kn are n K + j (1.5 2^23 is a multiple of K): j picks
    // the table entry; shifted so that n lands in the exponent field (the
    // magic's bits leave the word), they raise it to 2^n 2^(j / K).
    const auto bits = hn::BitCast(di, kn);
    constexpr int kShift = kLanes == 16 ? 19 : 20;  // 23 - log2(K)
    // bits << kShift is n << 23 plus j << kShift: the table holds the
    // bits of 2^(j / K) (rounded to float) less j << kShift, so one
    // integer add leaves 2^(j / K) 2^n (no mask of j's bits).
    alignas(64) static constexpr std::int32_t kTableLessJ16[16] = {
        0x3F800000 - (0 << 19),  0x3F85AAC3 - (1 << 19),  0x3F8B95C2 - (2 << 19),
        0x3F91C3D3 - (3 << 19),  0x3F9837F0 - (4 << 19),  0x3F9EF532 - (5 << 19),
        0x3FA5FED7 - (6 << 19),  0x3FAD583F - (7 << 19),  0x3FB504F3 - (8 << 19),
        0x3FBD08A4 - (9 << 19),  0x3FC5672A - (10 << 19), 0x3FCE248C - (11 << 19),
        0x3FD744FD - (12 << 19), 0x3FE0CCDF - (13 << 19), 0x3FEAC0C7 - (14 << 19),
        0x3FF5257D - (15 << 19)};
    alignas(32) static constexpr std::int32_t kTableLessJ8[8] = {
        0x3F800000 - (0 << 20), 0x3F8B95C2 - (1 << 20), 0x3F9837F0 - (2 << 20),
        0x3FA5FED7 - (3 << 20), 0x3FB504F3 - (4 << 20), 0x3FC5672A - (5 << 20),
        0x3FD744FD - (6 << 20), 0x3FEAC0C7 - (7 << 20)};
    const auto table = hn::Load(di, kLanes == 16 ? kTableLessJ16 : kTableLessJ8);
    const auto entry = ExpTableEntry(di, table, bits);
    const V scale = hn::BitCast(df, hn::Add(entry, hn::ShiftLeft<kShift>(bits)));
    // e^r - 1 = r (1 + r / 2 + r^2 / 6 [+ r^3 / 24]).
    V e = hn::Set(df, 1.0f / 6.0f);
    if constexpr (kLanes == 8) e = hn::MulAdd(hn::Set(df, 1.0f / 24.0f), r, e);
    e = hn::MulAdd(e, r, hn::Set(df, 0.5f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f));
    return ExpLastStep<kZeroBelow>(df, scale, hn::Mul(e, r), below);
  } else {
    const V magic = hn::Set(df, 12583039.0f);  // 1.5 * 2^23 + 127
    const V kn = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), magic);
    const V nf = hn::Sub(kn, magic);
    V r = hn::NegMulAdd(nf, hn::Set(df, 0.693359375f), x);  // ln2_hi: 9 bits
    r = hn::NegMulAdd(nf, hn::Set(df, -2.12194440054690583e-4f), r);
    V e = hn::Set(df, 1.0f / 5040.0f);
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f / 720.0f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f / 120.0f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f / 24.0f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f / 6.0f));
    e = hn::MulAdd(e, r, hn::Set(df, 0.5f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f));
    e = hn::MulAdd(e, r, hn::Set(df, 1.0f));
    const V pow2n = hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(di, kn)));
    if constexpr (kZeroBelow) {
      return hn::IfThenZeroElse(below, hn::Mul(e, pow2n));
    } else {
      (void)below;
      return hn::Mul(e, pow2n);
    }
  }
}

// The flushed exp described above: x clamped to [-40, 88], then 0 where x
// was below -40 or NaN.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpFlushed(D df, V x) {
  const V lo = hn::Set(df, -40.0f);
  const auto keep = hn::Ge(x, lo);  // false for NaN
  return ExpInRange<true>(df, hn::Min(hn::Max(x, lo), hn::Set(df, 88.0f)), hn::Not(keep));
}

// SafeExp for x <= 88 or NaN only (x = a score minus a maximum it cannot
// exceed, or on the register tile exceed by more than ln 256, see
// kAttnStaleMax): no clamp is needed, so no Max, Min or NaN test. A NaN x
// carries through the arithmetic to a NaN result; x below -40 (-inf
// included) gives 0, whatever the arithmetic made of it.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpUnclamped(D df, V x) {
  const auto flush = hn::Lt(x, hn::Set(df, -40.0f));  // false for NaN
  return ExpInRange<true>(df, x, flush);
}

// ExpFlushed, but NaN stays NaN: the forward must not silently drop a NaN
// score (a NaN key, bias entry or +inf - +inf) when the row max is finite.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SafeExp(D df, V x) {
  return hn::IfThenElse(hn::IsNaN(x), x, ExpFlushed(df, x));
}

// tanh(x) for the soft-cap, cap tanh(s / cap): sign(x) (1 - e) / (1 + e)
// with e = exp(-2 |x|) (SafeExp: 0 past |x| = 20, where tanh(x) is 1 in
// float32; NaN stays NaN, +-inf gives +-1). One exp and one division, where
// hn::Tanh's expm1 form took about twice the instructions (the soft-capped
// prefill cost 1.35-1.55x the plain one on a Zen 3, AVX2). The error is
// absolute, at most a few 1e-8 (1 - e cancels near 0, where hn::Tanh is
// relatively exact): cap times that in the score, which is what the
// softmax sees (exp(s - m) moves by that relative amount).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SoftcapTanh(D df, V x) {
  const V one = hn::Set(df, 1.0f);
  const V e = SafeExp(df, hn::Mul(hn::Abs(x), hn::Set(df, -2.0f)));
  return hn::CopySignToAbs(hn::Div(hn::Sub(one, e), hn::Add(one, e)), x);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#endif  // POSBIAS_SRC_KERNELS_ATTENTION_EXP_INL_H_ toggle
