// Highway-dispatched memory and FMA probes (see baselines.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "baselines.cc"
// foreach_target.h before any other Highway header; the clang-format guard
// keeps include sorting from moving it.
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// clang-format on

#include "baselines.h"

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace posbias::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void FillRange(float* HWY_RESTRICT dst, std::size_t count, bool stream) {
  const hn::ScalableTag<float> df;
  const std::size_t n = hn::Lanes(df);
  const auto v = hn::Set(df, -1.0f);
  std::size_t k = 0;
  if (stream) {
    for (; k + n <= count; k += n) hn::Stream(v, df, dst + k);
    hwy::FlushStream();
  } else {
    for (; k + n <= count; k += n) hn::StoreU(v, df, dst + k);
  }
  for (; k < count; ++k) dst[k] = -1.0f;
}

float SumRange(const float* HWY_RESTRICT src, std::size_t count) {
  const hn::ScalableTag<float> df;
  const std::size_t n = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  std::size_t k = 0;
  for (; k + 4 * n <= count; k += 4 * n) {
    a0 = hn::Add(a0, hn::LoadU(df, src + k));
    a1 = hn::Add(a1, hn::LoadU(df, src + k + n));
    a2 = hn::Add(a2, hn::LoadU(df, src + k + 2 * n));
    a3 = hn::Add(a3, hn::LoadU(df, src + k + 3 * n));
  }
  float total = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; k < count; ++k) total += src[k];
  return total;
}

// FmaPeakBaseline's loop: 12 independent recurrences a = a * m + c, which
// the compiler must keep as written (no reassociation without -ffast-math),
// each converging to c / (1 - m) = 1, so the values stay normal. Written out
// rather than as an array so that all twelve stay in registers (checked
// with objdump: vfmadd on ymm / zmm registers only, no memory operand).
float FmaChains(std::int64_t iterations) {
  const hn::ScalableTag<float> df;
  const auto m = hn::Set(df, 0.999f);
  const auto c = hn::Set(df, 0.001f);
  auto a0 = hn::Set(df, 0.00f), a1 = hn::Set(df, 0.01f), a2 = hn::Set(df, 0.02f);
  auto a3 = hn::Set(df, 0.03f), a4 = hn::Set(df, 0.04f), a5 = hn::Set(df, 0.05f);
  auto a6 = hn::Set(df, 0.06f), a7 = hn::Set(df, 0.07f), a8 = hn::Set(df, 0.08f);
  auto a9 = hn::Set(df, 0.09f), a10 = hn::Set(df, 0.10f), a11 = hn::Set(df, 0.11f);
  for (std::int64_t k = 0; k < iterations; ++k) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  const auto sum = hn::Add(
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
      hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Bits of the dispatched target's float vectors, and its name.
int FmaVectorBits() { return static_cast<int>(hn::Lanes(hn::ScalableTag<float>()) * 32); }
const char* FmaTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace posbias::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace posbias::bench {

HWY_EXPORT(FillRange);
HWY_EXPORT(SumRange);
HWY_EXPORT(FmaChains);
HWY_EXPORT(FmaVectorBits);
HWY_EXPORT(FmaTargetName);

namespace {
void fill(void* dst, std::size_t bytes, bool stream) {
  auto* f = static_cast<float*>(dst);
  const std::size_t count = bytes / sizeof(float);
#pragma omp parallel
  {
    // Contiguous halves, each starting on a 64-byte boundary, like the
    // kernel's row ranges.
    const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t begin = count * t / nt / 16 * 16;
    const std::size_t end = t + 1 == nt ? count : count * (t + 1) / nt / 16 * 16;
    HWY_DYNAMIC_DISPATCH(FillRange)(f + begin, end - begin, stream);
  }
}
}  // namespace

void stream_fill(void* dst, std::size_t bytes) { fill(dst, bytes, true); }

float stream_read(const void* src, std::size_t bytes) {
  const auto* f = static_cast<const float*>(src);
  const std::size_t count = bytes / sizeof(float);
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t begin = count * t / nt / 16 * 16;
    const std::size_t end = t + 1 == nt ? count : count * (t + 1) / nt / 16 * 16;
    total += HWY_DYNAMIC_DISPATCH(SumRange)(f + begin, end - begin);
  }
  return total;
}
void store_fill(void* dst, std::size_t bytes) { fill(dst, bytes, false); }

SgemmBaseline::SgemmBaseline(int n) : n_(n) {
  const auto count = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  a_.resize(count);
  b_.resize(count);
  c_.resize(count);
  for (std::size_t k = 0; k < count; ++k) {
    a_[k] = static_cast<float>(k % 17) * 0.01f;
    b_[k] = static_cast<float>(k % 13) * 0.02f;
  }
}

void SgemmBaseline::operator()() {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_, n_, n_, 1.0f, a_.data(), n_, b_.data(),
              n_, 0.0f, c_.data(), n_);
}

static_assert(FmaPeakBaseline::kFmaChains == 12, "FmaChains writes out 12 chains");

FmaPeakBaseline::FmaPeakBaseline(long long iterations) : iterations_(iterations) {}

void FmaPeakBaseline::operator()() {
  double flops = 0;
  float total = 0;
#pragma omp parallel reduction(+ : flops, total)
  {
    total += HWY_DYNAMIC_DISPATCH(FmaChains)(iterations_);
    flops += 2.0 * kFmaChains * static_cast<double>(iterations_) * (vector_bits() / 32);
  }
  flops_ = flops;
  sink_ += total;
}

int FmaPeakBaseline::vector_bits() const { return HWY_DYNAMIC_DISPATCH(FmaVectorBits)(); }

std::string FmaPeakBaseline::target() const { return HWY_DYNAMIC_DISPATCH(FmaTargetName)(); }

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<std::vector<double>> time_interleaved(const std::vector<std::function<void()>>& fns,
                                                  int warmup, int repetitions) {
  for (int w = 0; w < warmup; ++w) {
    for (const auto& fn : fns) fn();
  }
  std::vector<std::vector<double>> times(fns.size());
  for (int r = 0; r < repetitions; ++r) {
    for (std::size_t k = 0; k < fns.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[k]();
      const auto t1 = std::chrono::steady_clock::now();
      times[k].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  return times;
}

}  // namespace posbias::bench
#endif  // HWY_ONCE
