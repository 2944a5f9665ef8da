// The checkers of the golden file's kinds (internal to the golden checker,
// see golden_check.h; the table of kinds is in golden_check.cc). Each
// returns "" when the case passes, else a one-line description of the first
// difference; a malformed case throws MalformedCase, an argument the library
// refuses the library's exception.
#ifndef POSBIAS_CLI_GOLDEN_KINDS_H_
#define POSBIAS_CLI_GOLDEN_KINDS_H_

#include <string>

#include "golden_case.h"

namespace posbias::cli::golden {

struct CheckContext {
  std::string base_dir;  // where files named by a case live
};

using CheckFn = std::string (*)(const json& c, const CheckContext& ctx);

std::string check_alibi_slopes(const json& c, const CheckContext& ctx);
std::string check_ggml_slopes(const json& c, const CheckContext& ctx);
std::string check_alibi_positional_bias(const json& c, const CheckContext& ctx);
std::string check_alibi_bias(const json& c, const CheckContext& ctx);
std::string check_dynamic_position_bias(const json& c, const CheckContext& ctx);
/// Its safetensors file is read from ctx.base_dir.
std::string check_dynamic_position_bias_file(const json& c, const CheckContext& ctx);
std::string check_t5_bucket(const json& c, const CheckContext& ctx);
// golden_attention_kinds.cc: each through the fused path and the plain
// (reference) path, both against `out`.
/// attention_forward and attention_reference.
std::string check_attention(const json& c, const CheckContext& ctx);
/// As check_attention with q_offset, window, softcap, key_mask, per-sequence
/// slopes and a centred distance table.
std::string check_attention_masked(const json& c, const CheckContext& ctx);
/// attention_varlen_forward and attention_varlen_reference (packed).
std::string check_attention_varlen(const json& c, const CheckContext& ctx);
/// attention_kvcache_forward and attention_kvcache_reference (paged).
std::string check_attention_paged(const json& c, const CheckContext& ctx);

}  // namespace posbias::cli::golden

#endif  // POSBIAS_CLI_GOLDEN_KINDS_H_
