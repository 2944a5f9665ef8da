// Internal: the small MLP of Dynamic Position Bias, forward and backward,
// over a batch of scalar inputs. Not installed.
//
// The network (x-transformers' form; zeta's is depth = 2 without norm):
//
//     a_0 = x                                  (one scalar per input row)
//     z_l = a_l W_l^T + b_l                    l = 0 .. depth-1
//     u_l = LayerNorm(z_l) (with norm) else z_l
//     a_{l+1} = SiLU(u_l)
//     y   = a_depth W_depth^T + b_depth        [n, heads]
//
// Weights are in PyTorch's layout ([out, in], row-major). Everything is
// float32: each output is a fixed sequence of fused multiply-adds over the
// inputs of its layer, so the value of one input row never depends on n, on
// the other rows, on blocking or on threads (forward() of a sub-range of
// distances equals the full table bit for bit, on a given instruction set).
// LayerNorm statistics are float vector sums, like PyTorch's. Subnormal
// values are flushed to zero while the kernels run (see dpb_mlp.cc).
//
// The kernels are compiled per instruction set by Highway and dispatched at
// run time; the front functions below thread over blocks of rows (OpenMP).
#ifndef POSBIAS_SRC_KERNELS_DPB_MLP_H_
#define POSBIAS_SRC_KERNELS_DPB_MLP_H_

#include <cstdint>
#include <vector>

#include "kernels/scratch.h"

namespace posbias::detail {

struct DpbMlp {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  std::int64_t depth = 0;
  bool norm = false;
  float eps = 1e-5f;
  // depth + 1 Linear layers: weight l is [out_l, in_l] with in_0 = 1,
  // in_l = dim, out_l = dim for l < depth and out_depth = heads.
  std::vector<const float*> weight;
  std::vector<const float*> bias;
  // With norm: depth LayerNorms over dim (weight, bias).
  std::vector<const float*> ln_weight;
  std::vector<const float*> ln_bias;
  // Where the kernels' aligned scratch comes from (tests: one that fails).
  ScratchAllocator scratch;
};

// Gradient outputs, shaped like the parameters of DpbMlp (overwritten).
struct DpbMlpGrads {
  std::vector<float*> weight;
  std::vector<float*> bias;
  std::vector<float*> ln_weight;
  std::vector<float*> ln_bias;
};

// The working memory one thread of the forward (backward = false) or the
// backward needs, in bytes, whatever n: the packed weights and the
// activations of a block of rows (all depth layers of them going backward,
// two going forward), the backward's accumulator and partial gradient. In
// double: an estimate for the memory checks, computed without overflow for
// any dim, heads and depth.
double dpb_mlp_scratch_bytes(std::int64_t dim, std::int64_t heads, std::int64_t depth, bool norm,
                             bool backward);

// Errors of both calls: std::length_error before anything is allocated when
// one thread's scratch (above) exceeds the machine's memory (threads are
// capped so that theirs fit in 1/8 of it); std::length_error naming the
// bytes when an allocation fails (detail::allocation_error, rethrown on the
// calling thread).
//
// y[h * y_stride + k] = MLP(x[k])[h] for k in [0, n). Threaded over rows.
void dpb_mlp_forward(const DpbMlp& mlp, const float* x, std::int64_t n, float* y,
                     std::int64_t y_stride);

// Gradients of L = sum_{h,k} g[h * g_stride + k] * MLP(x[k])[h] with respect
// to every parameter, written to `grads`. Recomputes the forward activations
// block by block (never all at once). Threaded over fixed blocks of rows whose
// partial sums are added in a fixed order: the result does not depend on the
// number of threads. Scratch: about four copies of the parameters per thread
// (its partial sum, padded accumulator and packed weights; threads capped so
// that these fit in 1/8 of the machine's memory) plus one double-precision
// sum, whatever n.
void dpb_mlp_backward(const DpbMlp& mlp, const float* x, std::int64_t n, const float* g,
                      std::int64_t g_stride, const DpbMlpGrads& grads);

// The same on the calling thread only, with the instruction set Highway
// would pick (for tests of every compiled target: call after
// hwy::SetSupportedTargetsForTest).
void dpb_mlp_forward_serial(const DpbMlp& mlp, const float* x, std::int64_t n, float* y,
                            std::int64_t y_stride);

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_KERNELS_DPB_MLP_H_
