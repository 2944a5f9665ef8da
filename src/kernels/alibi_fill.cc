// The ALiBi fill kernel, compiled once per instruction set by Highway and
// chosen at run time (HWY_DYNAMIC_DISPATCH). See alibi_fill.h for the
// contract.
//
// Why it looks like this: materialising a bias is pure store traffic, so the
// kernel does O(1) vector work per output vector (an integer iota, a
// subtraction, an absolute value, a conversion and a multiply) and spends its
// time in the stores. For outputs larger than the caches it uses streaming
// (non-temporal) stores, which write whole lines without first reading them.
// Distances are formed in int32 and converted once, so every value equals the
// reference float32(slope * float32(distance)) bit for bit; 16-bit outputs are
// rounded to nearest even with integer arithmetic (Highway's own bfloat16
// demotion truncates, and its float16 emulation below AVX2 does too).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/alibi_fill.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "checks.h"
#include "kernels/alibi_fill.h"
#include "kernels/float_store.h"

HWY_BEFORE_NAMESPACE();
namespace posbias::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Scalar value with exactly the vector kernel's arithmetic (used for row
// heads and tails, and for positions too large for int32).
HWY_INLINE float ScalarValue(float scale, std::int64_t q, std::int64_t c, DistanceKind kind,
                             bool canonical_zero) {
  return alibi_value(scale, q, c, kind, canonical_zero);
}

template <typename Out>
HWY_INLINE void StoreScalar(float v, Out* p) {
  *p = float_to<Out>(v);
}

#if HWY_TARGET != HWY_SCALAR

// float32 lanes -> bfloat16 bits in the low 16 bits of each u32 lane, round
// to nearest even (inputs are never NaN here: slopes are checked finite).
template <class DU32>
HWY_INLINE hn::Vec<DU32> RoundToBF16Bits(DU32 du32, hn::Vec<DU32> u) {
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  return hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du32, 0x7FFFu), lsb)));
}

// float32 lanes -> float16 bits in the low 16 bits of each u32 lane, round to
// nearest even, overflow to infinity, subnormals exact (see to_float16).
template <class DF, class DU32>
HWY_INLINE hn::Vec<DU32> RoundToF16Bits(DF df, DU32 du32, hn::Vec<DU32> u) {
  const hn::RebindToSigned<DU32> di32;
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 0x8000u));
  const auto a = hn::And(u, hn::Set(du32, 0x7FFFFFFFu));
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du32, 1u));
  const auto normal = hn::ShiftRight<13>(hn::Add(a, hn::Add(hn::Set(du32, 0xC8000FFFu), odd)));
  const auto sub = hn::Sub(hn::BitCast(du32, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
                           hn::Set(du32, 0x3F000000u));
  const auto ai = hn::BitCast(di32, a);
  const auto is_sub = hn::RebindMask(du32, ai < hn::Set(di32, 0x38800000));
  const auto is_inf = hn::RebindMask(du32, hn::Set(di32, 0x477FEFFF) < ai);
  const auto h =
      hn::IfThenElse(is_inf, hn::Set(du32, 0x7C00u), hn::IfThenElse(is_sub, sub, normal));
  return hn::Or(h, sign);
}

// Row values of columns [c, c + N) as float32, given vc = c + iota.
template <class DF, class DI>
HWY_INLINE hn::Vec<DF> RowValues(DF df, DI di, hn::Vec<DI> vc, hn::Vec<DI> vq, hn::Vec<DF> vscale,
                                 DistanceKind kind, bool canonical_zero) {
  const auto diff = hn::Sub(vc, vq);
  const auto dist =
      kind == DistanceKind::kAbs ? hn::Abs(diff) : hn::Max(hn::Neg(diff), hn::Zero(di));
  auto v = hn::Mul(vscale, hn::ConvertTo(df, dist));
  if (canonical_zero) v = hn::Add(v, hn::Zero(df));
  return v;
}

// Converts float32 values to the u16 lanes of Out (bf16 or f16 bits).
template <typename Out, class DF>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, DF>> To16(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const hn::Rebind<std::uint16_t, DF> du16;
  const auto u = hn::BitCast(du32, v);
  hn::Vec<decltype(du32)> bits;
  if constexpr (std::is_same_v<Out, bfloat16>) {
    bits = RoundToBF16Bits(du32, u);
  } else {
    bits = RoundToF16Bits(df, du32, u);
  }
  return hn::DemoteTo(du16, hn::BitCast(di32, bits));
}

// One row, float32 output.
HWY_INLINE void FillRowF32(float* HWY_RESTRICT row, std::int64_t cols, std::int64_t q, float scale,
                           DistanceKind kind, bool canonical_zero, bool stream) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t c = 0;
  if (stream) {
    // Scalar head up to the vector alignment that Stream requires.
    const std::uintptr_t align = n * sizeof(float);
    while (c < cols && (reinterpret_cast<std::uintptr_t>(row + c) % align) != 0) {
      row[c] = ScalarValue(scale, q, c, kind, canonical_zero);
      ++c;
    }
  }
  const auto vscale = hn::Set(df, scale);
  const auto vq = hn::Set(di, static_cast<std::int32_t>(q));
  const auto step = hn::Set(di, static_cast<std::int32_t>(n));
  auto vc = hn::Iota(di, static_cast<std::int32_t>(c));
  if (stream) {
    for (; c + n <= cols; c += n) {
      hn::Stream(RowValues(df, di, vc, vq, vscale, kind, canonical_zero), df, row + c);
      vc = hn::Add(vc, step);
    }
  } else {
    for (; c + n <= cols; c += n) {
      hn::StoreU(RowValues(df, di, vc, vq, vscale, kind, canonical_zero), df, row + c);
      vc = hn::Add(vc, step);
    }
  }
  for (; c < cols; ++c) row[c] = ScalarValue(scale, q, c, kind, canonical_zero);
}

// One row, 16-bit output (Out = bfloat16 or float16).
template <typename Out>
HWY_INLINE void FillRow16(Out* HWY_RESTRICT row, std::int64_t cols, std::int64_t q, float scale,
                          DistanceKind kind, bool canonical_zero, bool stream) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Repartition<std::uint16_t, decltype(df)> du16;  // 2N lanes
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  auto* row16 = reinterpret_cast<std::uint16_t*>(row);
  std::int64_t c = 0;
  if (stream) {
    const std::uintptr_t align = 2 * n * sizeof(std::uint16_t);
    while (c < cols && (reinterpret_cast<std::uintptr_t>(row + c) % align) != 0) {
      StoreScalar(ScalarValue(scale, q, c, kind, canonical_zero), row + c);
      ++c;
    }
  }
  const auto vscale = hn::Set(df, scale);
  const auto vq = hn::Set(di, static_cast<std::int32_t>(q));
  const auto step = hn::Set(di, static_cast<std::int32_t>(n));
  auto vc = hn::Iota(di, static_cast<std::int32_t>(c));
  for (; c + 2 * n <= cols; c += 2 * n) {
    const auto lo = To16<Out>(df, RowValues(df, di, vc, vq, vscale, kind, canonical_zero));
    vc = hn::Add(vc, step);
    const auto hi = To16<Out>(df, RowValues(df, di, vc, vq, vscale, kind, canonical_zero));
    vc = hn::Add(vc, step);
    const auto both = hn::Combine(du16, hi, lo);
    if (stream) {
      hn::Stream(both, du16, row16 + c);
    } else {
      hn::StoreU(both, du16, row16 + c);
    }
  }
  for (; c < cols; ++c) StoreScalar(ScalarValue(scale, q, c, kind, canonical_zero), row + c);
}

#endif  // HWY_TARGET != HWY_SCALAR

template <typename Out>
void FillRowsT(const AlibiFillParams& p, std::int64_t row_begin, std::int64_t row_end,
               bool stream) {
  Out* out = static_cast<Out*>(p.out);
  // int32 lanes hold every column and query position, and their difference,
  // when |positions| stay below 2^30; otherwise take the exact scalar path.
  constexpr std::int64_t kLimit = std::int64_t{1} << 30;
  const bool fits_int32 = p.cols < kLimit && p.q0 > -kLimit && p.q0 + p.rows < kLimit;
  for (std::int64_t flat = row_begin; flat < row_end; ++flat) {
    const std::int64_t h = flat / p.rows;
    const std::int64_t r = flat - h * p.rows;
    const std::int64_t q = p.q0 + r;
    const float scale = p.scale[h];
    Out* row = out + flat * p.cols;
#if HWY_TARGET != HWY_SCALAR
    if (fits_int32) {
      if constexpr (std::is_same_v<Out, float>) {
        FillRowF32(row, p.cols, q, scale, p.kind, p.canonical_zero, stream);
      } else {
        FillRow16<Out>(row, p.cols, q, scale, p.kind, p.canonical_zero, stream);
      }
      continue;
    }
#endif
    (void)fits_int32;
    for (std::int64_t c = 0; c < p.cols; ++c) {
      StoreScalar(ScalarValue(scale, q, c, p.kind, p.canonical_zero), row + c);
    }
  }
  if (stream) hwy::FlushStream();
}

void FillRows(const AlibiFillParams& p, std::int64_t row_begin, std::int64_t row_end, bool stream) {
  switch (p.dtype) {
    case DType::kFloat32:
      FillRowsT<float>(p, row_begin, row_end, stream);
      break;
    case DType::kBFloat16:
      FillRowsT<bfloat16>(p, row_begin, row_end, stream);
      break;
    case DType::kFloat16:
      FillRowsT<float16>(p, row_begin, row_end, stream);
      break;
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kBool:
      detail::unsupported_dtype("alibi fill", p.dtype);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posbias::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/toeplitz.h"

namespace posbias::detail {

HWY_EXPORT(FillRows);

void alibi_fill_rows(const AlibiFillParams& p, std::int64_t row_begin, std::int64_t row_end,
                     bool stream) {
  HWY_DYNAMIC_DISPATCH(FillRows)(p, row_begin, row_end, stream);
}

namespace {

template <typename Out>
std::vector<Out> alibi_table(const AlibiFillParams& p, std::int64_t len, std::int64_t anchor) {
  std::vector<Out> table(static_cast<std::size_t>(p.heads * len));
  // Float values a block at a time (a loop the compiler vectorises), then
  // rounded to the output dtype in one pass, as convert_floats does.
  constexpr std::int64_t kBlock = 512;
  float block[kBlock];
  for (std::int64_t h = 0; h < p.heads; ++h) {
    for (std::int64_t k0 = 0; k0 < len; k0 += kBlock) {
      const std::int64_t n = std::min(kBlock, len - k0);
      for (std::int64_t k = 0; k < n; ++k) {
        block[k] = alibi_value(p.scale[h], anchor, k0 + k, p.kind, p.canonical_zero);
      }
      convert_floats(block, static_cast<std::size_t>(n), p.dtype,
                     table.data() + static_cast<std::size_t>(h * len + k0));
    }
  }
  return table;
}

template <typename Out>
void fill_by_table(const AlibiFillParams& p, bool stream) {
  // Entry k of head h's table is the value at c - q = k - anchor; row r's
  // window starts at rows - 1 - r, so element c of row r reads entry
  // rows - 1 - r + c, where c - (q0 + r) = that entry minus anchor. The table
  // is built in the output dtype (each value rounded once, as everywhere):
  // no float32 copy beside the 16-bit one.
  const std::int64_t len = p.rows + p.cols - 1;
  const std::vector<Out> table = alibi_table<Out>(p, len, p.q0 + p.rows - 1);
  ToeplitzParams t;
  t.table = table.data();
  t.table_stride = len;
  t.row_offset0 = p.rows - 1;
  t.heads = p.heads;
  t.rows = p.rows;
  t.cols = p.cols;
  t.element_size = sizeof(Out);
  t.out = p.out;
  toeplitz_expand(t, stream);
}

}  // namespace

bool alibi_fill_uses_table(std::int64_t rows, std::int64_t cols) {
  // Scratch (rows + cols - 1 per head) <= output (rows * cols per head) / 8;
  // rows * cols cannot overflow: the caller's output holds that many.
  return rows >= kTableMinRows && cols >= 1 && 8 * (rows + cols - 1) <= rows * cols;
}

void alibi_fill_by_table(const AlibiFillParams& p, bool stream) {
  if (p.heads == 0 || p.rows == 0 || p.cols == 0) return;
  switch (p.dtype) {
    case DType::kFloat32:
      fill_by_table<float>(p, stream);
      break;
    case DType::kBFloat16:
      fill_by_table<bfloat16>(p, stream);
      break;
    case DType::kFloat16:
      fill_by_table<float16>(p, stream);
      break;
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kBool:
      detail::unsupported_dtype("alibi fill", p.dtype);
  }
}

void alibi_fill(const AlibiFillParams& p, bool stream) {
  const std::int64_t total_rows = p.heads * p.rows;
  if (total_rows == 0 || p.cols == 0) return;
  if (alibi_fill_uses_table(p.rows, p.cols)) {
    alibi_fill_by_table(p, stream);
    return;
  }
  const std::size_t bytes =
      static_cast<std::size_t>(total_rows) * static_cast<std::size_t>(p.cols) * dtype_size(p.dtype);
  // Below ~256 KiB a parallel region costs more than it saves.
  const bool parallel = bytes >= (std::size_t{256} << 10) && omp_get_max_threads() > 1;
  if (!parallel) {
    alibi_fill_rows(p, 0, total_rows, stream);
    return;
  }
#pragma omp parallel
  {
    // Contiguous, equal row ranges: each thread streams one region.
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t begin = total_rows * t / nt;
    const std::int64_t end = total_rows * (t + 1) / nt;
    alibi_fill_rows(p, begin, end, stream);
  }
}

}  // namespace posbias::detail
#endif  // HWY_ONCE
