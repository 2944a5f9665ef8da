// Checks this build against a reference-vector file in the format of
// tests/data/golden/README.md (the project's golden.json: cases computed by an
// independent PyTorch implementation of SPEC.md).
//
// Every case has a `kind`. A table in golden_check.cc maps each kind to the
// function that checks it; kinds the format defines but this build does not
// compute yet, and kinds nobody knows, are counted as skipped, never passed.
// Comparison: shapes exactly, values with |got - want| <= 1e-6 + 1e-5 |want|
// (attention outputs: 1e-5 + 1e-4 |want|); T5 buckets exactly.
//
// Attention cases: q, k, v and the bias (none, ALiBi slopes [h] or [b, h],
// or a distance table read at its centre) are built as float32 tensors and
// both the fused path and the plain path must give `out`: attention_forward
// and attention_reference (kinds attention and attention_masked, the latter
// with q_offset, window, softcap and key_mask), attention_varlen_forward and
// attention_varlen_reference (attention_varlen: packed q, k, v, cu_seqlens),
// attention_kvcache_forward and attention_kvcache_reference (attention_paged:
// a block table and cache_seqlens). Integer fields (key_mask, block_table)
// must hold integers. A bias type the format does not define, or inputs of
// the wrong rank, make the case malformed (failed).
//
// DynamicPositionBias cases: a zeta case's `params` are loaded by state-dict
// name, an x-transformers case's `layers` (linear, [layernorm,] silu per
// block, then linear) become mlp.<b>.0, mlp.<b>.1 and mlp.<depth> as in
// x-transformers' state dict; every call is checked in order, and `grad`
// (required for zeta, checked for any case that has one) with
// DynamicPositionBias::backward against every parameter's gradient.
//
//   posbias::cli::GoldenReport report =
//       posbias::cli::check_golden_file("tests/data/golden/golden.json");
//   for (const auto& c : report.cases) {
//     if (c.status == posbias::cli::CaseStatus::kFailed) std::cout << c.message;
//   }
//   std::cout << report.summary() << "\n";  // "60 passed, 0 failed, 0 skipped"
//
// Used by `posbias check-golden` and by the tests in tests/cli/.
#ifndef POSBIAS_CLI_GOLDEN_CHECK_H_
#define POSBIAS_CLI_GOLDEN_CHECK_H_

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace posbias::cli {

enum class CaseStatus { kPassed, kFailed, kSkipped };

/// The outcome of one case of the file.
struct CaseResult {
  std::size_t index = 0;  // position in the file's "cases" array
  std::string kind;       // empty when the case has no readable kind
  CaseStatus status = CaseStatus::kPassed;
  bool known_kind = true;  // false: a kind the format does not define
  std::string message;     // why it failed or was skipped; empty if passed
};

struct GoldenReport {
  std::vector<CaseResult> cases;  // in file order

  std::size_t passed() const;
  std::size_t failed() const;
  std::size_t skipped() const;
  /// "N passed, M failed, K skipped".
  std::string summary() const;
};

/// Golden files larger than this are refused before they are parsed (and
/// read no further than this + 1 byte: a device such as /dev/zero or a pipe
/// ends there). The project's golden files are about 90 KB.
constexpr std::size_t kMaxGoldenFileBytes = std::size_t{64} << 20;  // 64 MiB

/// Arrays and objects nested deeper than this are refused while the file
/// is parsed, before anything recurses into them. The format needs 7
/// levels (file, cases, case, params, tensor, shape/data, ...).
constexpr int kMaxGoldenDepth = 64;

/// The file cannot be read, is not JSON, or is not an object with a "cases"
/// array; or it is past kMaxGoldenFileBytes or kMaxGoldenDepth. The message
/// names the file (quoted and escaped) and the limit. (A malformed *case* is
/// not this error: it is a failed case.)
class GoldenFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads and checks the file at `path`. Files a case refers to (the
/// safetensors of `dynamic_position_bias_file`) are looked up beside it.
/// Throws GoldenFileError; never throws for a bad case.
GoldenReport check_golden_file(const std::string& path);

/// Checks the JSON text of a golden file; `base_dir` is where files named by
/// cases are looked up. Throws GoldenFileError for text that is not a golden
/// file.
GoldenReport check_golden_text(const std::string& json_text, const std::string& base_dir);

/// The kinds this build checks, in table order.
std::vector<std::string> golden_checked_kinds();

/// The kinds the format defines that this build does not check yet (their
/// cases are skipped).
std::vector<std::string> golden_pending_kinds();

}  // namespace posbias::cli

#endif  // POSBIAS_CLI_GOLDEN_CHECK_H_
