// Dynamic Position Bias: a small MLP over relative distances whose output is
// a per-head bias (zeta's DynamicPositionBias, and x-transformers' variant
// with depth, log distances and LayerNorm). Trainable: backward() returns the
// gradient of every parameter given the gradient of the bias.
//
// Positions follow the library convention (see alibi.h): the query of row r
// sits at q_r = j - i + r, key c at c, and 0 <= i <= j.
//
//   zeta:            the MLP runs on the j distances 0, 1, .., j-1 (as float)
//                    giving a table T[d][h]; bias[h][r][c] = T[|q_r - c|][h].
//   x-transformers:  the MLP runs on the 2j-1 signed distances -(j-1)..(j-1)
//                    (sign(x) ln(|x| + 1) with log_distance); the bias reads
//                    entry (q_r - c) + (j - 1).
//
// `i` and `j` are lengths, not positions: the seed documentation's
// `module(0, 5)` ("positions 0 to 5") returns an empty [heads, 0, 5] tensor.
//
// The MLP is cheap: forward(i, j) runs it on the distances the call needs
// only (j inputs for zeta, i + j - 1 signed ones for x-transformers, so a
// decode step costs j). The cost of forward() is the gather into
// heads * i * j values, which is written one row at a time as a copy of a
// window of the table, rounded once to the output dtype beforehand
// (kernels/toeplitz.h), at memory speed. The fused attention reads
// distance_table() and never gathers.
//
// Numerics: float32 throughout (fused multiply-adds, LayerNorm statistics in
// float as in PyTorch); results are not bit for bit PyTorch's, and how far
// they are from them grows with the distance: the first layer multiplies
// distances up to j - 1, so the values and their float32 rounding grow with
// them. The difference is float32's conditioning at large distances, which
// PyTorch's float32 module shares (both are about as far from a float64
// evaluation of the same weights); relative to a value it is unbounded near a
// head's zero crossings. The README's results section gives the measured
// differences at j = 4096 and how they were taken. A distance's value does
// not depend on the call it appears in: forward(i, j) equals
// distance_table(j) rounded to the output dtype, bit for bit. Subnormal intermediates (deep in SiLU's tail)
// are flushed to zero.
//
// Training: backward() reduces the bias gradient onto the per-distance table
// in one pass (never materialising per-element activations), then runs the
// MLP backward on the j or 2j-1 distances; its results do not depend on the
// number of OpenMP threads.
//
// Example (a zeta module trained in PyTorch, used for a KV-cache decode step):
//
//   posbias::DynamicPositionBias dpb(64, 8);
//   dpb.load("dpb.safetensors");             // torch state-dict names
//   posbias::Tensor b = dpb.forward(1, 4096);  // [8, 1, 4096], query at 4095
//
// Thread safety: const members may be called concurrently; changing
// parameters (mutable_parameter, load_state_dict, load) while another thread
// runs a const member is a data race.
#ifndef POSBIAS_DPB_H_
#define POSBIAS_DPB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "posbias/dtype.h"
#include "posbias/safetensors.h"
#include "posbias/tensor.h"

namespace posbias {

/// Which DynamicPositionBias MLP: zeta's (the documentation's) or x-transformers'.
enum class DpbVariant : std::uint8_t {
  kZeta = 0,           // Linear(1,dim) SiLU Linear(dim,dim) SiLU Linear(dim,heads)
  kXTransformers = 1,  // depth x (Linear [LayerNorm] SiLU), Linear(dim,heads)
};

/// The constructor arguments of DynamicPositionBias (see the file comment).
struct DpbOptions {
  std::int64_t dim = 0;    // hidden width, >= 1
  std::int64_t heads = 0;  // output heads, >= 1
  DpbVariant variant = DpbVariant::kZeta;
  std::int64_t depth = 2;     // hidden blocks (x-transformers; zeta is 2), >= 1
  bool log_distance = false;  // x-transformers only
  bool norm = false;          // LayerNorm in each block (x-transformers only)
  double layernorm_eps = 1e-5;  // with norm: finite (as a float32 too) and >= 0
};

/// The Dynamic Position Bias module: an MLP over relative distances (see the file comment).
class DynamicPositionBias {
 public:
  /// zeta's module: DynamicPositionBias(dim, heads), parameters initialised
  /// like PyTorch's nn.Linear (weight and bias uniform in
  /// [-1/sqrt(fan_in), 1/sqrt(fan_in)]) from `seed`. The same seed gives the
  /// same parameters on every platform (not the numbers torch.manual_seed
  /// would give). Throws std::invalid_argument for dim < 1 or heads < 1.
  DynamicPositionBias(std::int64_t dim, std::int64_t heads, std::uint64_t seed = 0);

  /// Any variant; LayerNorm weights start at 1 and biases at 0 (PyTorch's
  /// default). Throws std::invalid_argument for dim, heads or depth < 1, or
  /// log_distance / norm / depth != 2 with the zeta variant. Sizes are
  /// checked before anything is allocated: std::length_error naming dim,
  /// heads and depth when the parameter count overflows int64, or when the
  /// parameters (about 4 bytes each plus ~768 per tensor) and one forward
  /// call's working memory exceed the machine's memory (depth 1e12 is
  /// refused at once); std::length_error ("could not allocate N bytes for
  /// ...") when an allocation fails all the same (an address-space limit).
  /// Both constructors.
  explicit DynamicPositionBias(const DpbOptions& options, std::uint64_t seed = 0);

  /// Copies share their parameters, like copies of a torch::nn module holder
  /// (and like posbias::Tensor): training or loading through one is seen by
  /// all. clone() makes an independent module.
  DynamicPositionBias(const DynamicPositionBias&) = default;
  DynamicPositionBias& operator=(const DynamicPositionBias&) = default;
  DynamicPositionBias(DynamicPositionBias&&) noexcept = default;
  DynamicPositionBias& operator=(DynamicPositionBias&&) noexcept = default;

  /// A deep copy: same options and parameter values, its own storage.
  DynamicPositionBias clone() const;

  /// The bias [heads, i, j] in `dtype` (computed in float32, rounded once),
  /// contiguous: bias[h][r][c] = MLP(distance of q_r = j - i + r and c)[h].
  /// Requires 0 <= i <= j (std::invalid_argument otherwise, with i and j);
  /// i = 0 gives an empty [heads, 0, j]. std::length_error when heads*i*j
  /// elements cannot be allocated, and ("could not allocate N bytes for
  /// ...") when any working buffer fails to allocate; never a crash. Cost: the MLP on j (zeta) or i + j - 1
  /// (x-transformers) distances plus one copy per output row. Memory beyond
  /// the result: the float32 table when it is at most 1/8 of the output, else
  /// (few rows: decode steps) tiles of it of at most 2^18 entries per head and
  /// thread.
  Tensor forward(std::int64_t i, std::int64_t j, DType dtype = DType::kFloat32) const;

  /// As forward(), into caller-owned contiguous memory of heads*i*j elements
  /// of `dtype` (any alignment; null only when there are none).
  void forward_into(std::int64_t i, std::int64_t j, DType dtype, void* out) const;

  /// The compact table the MLP produces, float32: zeta [heads, j] indexed by
  /// distance |q - c|; x-transformers [heads, 2j-1] indexed by (q - c) + j - 1
  /// (the same as distance_table(j)). j >= 1 (std::invalid_argument);
  /// std::length_error, naming j and the table's shape, when the table does
  /// not fit in memory (checked before 2j - 1 is formed).
  Tensor table(std::int64_t j) const;

  /// The table in the attention's form for every variant: [heads, 2j-1],
  /// float32, entry (q_r - c) + (j - 1) (zeta's table mirrored). j >= 1;
  /// errors as table().
  Tensor distance_table(std::int64_t j) const;

  /// Parameter gradients of sum(forward(i, j) * grad_bias), keyed by
  /// state-dict name, float32, shaped like the parameters. grad_bias:
  /// [heads, i, j], any strides (a non-contiguous or 16-bit gradient is first
  /// copied to contiguous float32); another shape throws std::invalid_argument
  /// naming the expected and the given shape. Reduces onto the table first
  /// (one pass over grad_bias, threaded), then runs the MLP backward on j (or
  /// i + j - 1) inputs; no per-element activations. i = 0 gives zeros.
  /// The MLP backward keeps every layer's activations of a block of 64
  /// rows per thread: std::length_error before allocating when one thread's
  /// does not fit in memory (threads are capped so that theirs fit in 1/8
  /// of it), or when an allocation fails.
  TensorMap backward(std::int64_t i, std::int64_t j, const Tensor& grad_bias) const;

  /// Parameter gradients of sum(table(j) * grad_table); grad_table has
  /// table(j)'s shape. j is checked as in table() (backward_distance_table
  /// too) before the gradient's shape.
  TensorMap backward_table(std::int64_t j, const Tensor& grad_table) const;

  /// Parameter gradients of sum(distance_table(j) * grad), grad [heads, 2j-1]
  /// (what the fused attention's backward produces). For zeta the entries at
  /// +d and -d both count towards distance d.
  TensorMap backward_distance_table(std::int64_t j, const Tensor& grad) const;

  /// The options this module was built with.
  const DpbOptions& options() const { return options_; }
  std::int64_t dim() const { return options_.dim; }
  std::int64_t heads() const { return options_.heads; }

  /// State-dict names in module order. zeta: mlp.0.weight [dim,1],
  /// mlp.0.bias [dim], mlp.2.weight [dim,dim], mlp.2.bias, mlp.4.weight
  /// [heads,dim], mlp.4.bias [heads]. x-transformers: block b is mlp.b.0
  /// (Linear) and, with norm, mlp.b.1 (LayerNorm weight/bias); the output
  /// Linear is mlp.<depth>.
  std::vector<std::string> parameter_names() const;

  /// A parameter by state-dict name (std::invalid_argument for an unknown
  /// name, quoted, listing the first known ones). float32, contiguous.
  const Tensor& parameter(const std::string& name) const;
  /// Write the values through it (e.g. an optimiser step). Assigning a tensor
  /// that is not contiguous float32 of the parameter's shape makes later calls
  /// throw std::invalid_argument naming it, until load_state_dict() repairs it.
  Tensor& mutable_parameter(const std::string& name);

  /// All parameters by name (handles sharing this module's storage: writing
  /// through them changes the module).
  TensorMap state_dict() const;

  /// Sets every parameter from `state` (values copied into the module's own
  /// storage, converted to float32 from any dtype). Strict: a missing or
  /// unexpected name, a wrong shape ("expected shape [64, 1], got [64]") or a
  /// non-finite value (named with its index) throws std::invalid_argument
  /// naming the tensor and what was expected; on error nothing is changed.
  /// Names are shown quoted and escaped (detail::quoted_name: an empty key
  /// is "", control bytes \u00XX, a long key cut at ~120 characters with its
  /// length), and lists stop after 8 names ("... (N in all)").
  void load_state_dict(const TensorMap& state);

  /// Saves the state dict as safetensors (the state-dict names, float32,
  /// metadata {"format": "pt"}), loadable by `safetensors.torch.load_file` +
  /// `load_state_dict` in PyTorch.
  void save(const std::string& path) const;

  /// Loads a safetensors state dict written by PyTorch or save(): errors of
  /// load_state_dict() are std::invalid_argument prefixed with the path; a
  /// malformed file throws as load_safetensors() does.
  void load(const std::string& path);

 private:
  DpbOptions options_;
  std::vector<std::string> names_;  // state-dict order (module order)
  std::vector<Tensor> params_;      // same order as names_, float32 contiguous
};

/// float64 reference of DynamicPositionBias::distance_table for a float64
/// model (PyTorch's `.double()` module): the MLP of `options` evaluated in
/// double, one distance at a time, on `params` (the state-dict names and
/// shapes of parameter_names(); float64, any strides). Returns [heads, 2j-1]
/// float64, entry (q_r - c) + (j - 1), as distance_table(j): zeta's MLP on
/// |q_r - c|, x-transformers' on q_r - c (sign(x) ln(|x| + 1) in double with
/// log_distance), LayerNorm statistics in double with options.layernorm_eps
/// as given. Plain loops, threaded over distances (results do not depend on
/// the thread count); for gradcheck and float64 models, not for speed.
/// Errors (std::invalid_argument): the options as the constructor checks
/// them; j < 1; a missing, unexpected, wrongly shaped, non-float64 or
/// non-finite parameter (named, as load_state_dict names it).
/// std::length_error when the table does not fit in memory.
Tensor dpb_distance_table_f64(const DpbOptions& options, const TensorMap& params, std::int64_t j);

/// Parameter gradients of sum(dpb_distance_table_f64(options, params, j) *
/// grad) in double, keyed by state-dict name, float64, shaped like the
/// parameters. grad: [heads, 2j-1], float64, any strides (another shape or
/// dtype: std::invalid_argument naming the expected one). zeta's entries at
/// +d and -d both count towards distance d. Serial and in a fixed order
/// (deterministic); the arguments are checked as in dpb_distance_table_f64.
TensorMap dpb_backward_distance_table_f64(const DpbOptions& options, const TensorMap& params,
                                          std::int64_t j, const Tensor& grad);

}  // namespace posbias

#endif  // POSBIAS_DPB_H_
