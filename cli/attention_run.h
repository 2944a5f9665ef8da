// What the three forms of `posbias attention` share (internal to the tool):
// the parsed arguments, the options and bias they describe, the memory guard,
// and the report (summary or tensor, and the --check line against the plain
// path). attention_command.cc runs the dense form; attention_batches.cc the
// packed (--seqlens) and KV-cache (--cache-seqlens, --paged) forms.
#ifndef POSBIAS_CLI_ATTENTION_RUN_H_
#define POSBIAS_CLI_ATTENTION_RUN_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "posbias/attention.h"
#include "posbias/dtype.h"
#include "posbias/tensor.h"

namespace posbias::cli {

struct AttentionArgs {
  std::optional<std::int64_t> batch;
  std::optional<std::int64_t> heads;
  std::optional<std::int64_t> kv_heads;
  std::optional<std::int64_t> i;
  std::optional<std::int64_t> j;
  std::optional<std::int64_t> d;
  bool causal = false;
  std::optional<float> scale;
  std::string bias = "none";
  std::string table_from = "dpb";
  std::vector<float> slopes;
  bool slopes_per_sequence = false;
  std::optional<std::int64_t> q_offset;
  std::vector<std::int64_t> window;  // [left, right] when given
  std::optional<float> softcap;
  std::vector<std::int64_t> key_mask;  // valid key length per sequence
  bool left_pad = false;
  std::vector<std::int64_t> seqlens;    // --seqlens: packed batch
  std::vector<std::int64_t> seqlens_k;  // --seqlens-k (default --seqlens)
  std::vector<std::int64_t> cache_seqlens;
  bool paged = false;
  std::optional<std::int64_t> block_size;
  CLI::Option* slopes_option = nullptr;
  CLI::Option* table_from_option = nullptr;
  CLI::Option* dtype_option = nullptr;
  CLI::Option* kv_dtype_option = nullptr;
  std::string seed = "0";
  std::string dtype = "float32";
  std::string kv_dtype;
  std::string format = "summary";
  std::string inputs;
  bool check = false;
};

/// "[2, 3]".
std::string shape_list(const std::vector<std::int64_t>& shape);
/// "100,7,3".
std::string int_list(const std::vector<std::int64_t>& values);
/// printf of one double.
std::string number(double v, const char* format = "%.9g");

/// std::invalid_argument "NAME must be >= 0, got V" for a negative value.
void require_nonnegative(const char* name, std::int64_t value);

/// The dtype of k and v: --kv-dtype when given, else the dtype of q.
DType kv_dtype_of(const AttentionArgs& a, DType q_dtype);

/// scale, causal, window, softcap (checked for their shape here: --window
/// takes exactly two values), and q_offset; not the key mask.
AttentionOptions make_options(const AttentionArgs& a);

/// The bias of --bias none|alibi|table for h query heads and `sequences`
/// sequences (per-sequence ALiBi slopes: sequence s uses --slopes' values
/// s * h ... s * h + h - 1, or alibi_slopes(h) times 1 + s / 2); a table is
/// built for distances up to `length` - 1 ([h, 2 length - 1], centred).
AttentionBias make_bias(const AttentionArgs& a, std::int64_t h, std::int64_t sequences,
                        std::int64_t length, std::uint64_t seed);

/// "causal; bias table (dpb); scale 0.125; window 128,-1; softcap 30" (the
/// window, softcap and per-sequence slopes only when given); d gives the
/// default scale.
std::string options_text(const AttentionArgs& a, std::int64_t d);

/// Saturating products and sums of non-negative counts.
std::uint64_t times(std::uint64_t a, std::uint64_t b);
std::uint64_t plus(std::uint64_t a, std::uint64_t b);
std::uint64_t product(std::initializer_list<std::int64_t> extents);

/// std::length_error naming `what` when `bytes` exceed the machine's memory.
void check_memory(const std::string& what, std::uint64_t bytes);

/// Prints the result (summary: `call` and the out shape, `inputs_line`, a
/// checksum, the time `ms`, and with a reference the --check line; text or
/// json: the tensor, a failed check on stderr). Returns the exit code: 1 when
/// the check fails, else 0.
int report_attention(const AttentionArgs& a, const std::string& call, const Tensor& result,
                     double ms, const std::optional<Tensor>& reference,
                     const std::string& inputs_line, std::ostream& out);

/// The packed form (--seqlens) and the KV-cache form (--cache-seqlens, with
/// --paged a block table): attention_batches.cc.
int run_attention_varlen(const AttentionArgs& a, std::ostream& out);
int run_attention_kvcache(const AttentionArgs& a, std::ostream& out);

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_ATTENTION_RUN_H_
