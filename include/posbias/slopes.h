// ALiBi slope schedules (Press, Smith and Lewis, "Train Short, Test Longer",
// ICLR 2022), exactly as the paper, x-transformers, zeta, fairseq, BLOOM and
// MPT compute them, plus ggml's `max_bias` form and head sub-ranges for
// tensor parallelism.
//
// Every function validates its arguments and throws std::invalid_argument with
// the offending values in the message; nothing is allocated before the checks.
// Head counts are limited to 2^24 = 16777216 (no model has more; a longer
// list would only exhaust memory).
#ifndef POSBIAS_SLOPES_H_
#define POSBIAS_SLOPES_H_

#include <cstdint>
#include <vector>

namespace posbias {

/// The standard ALiBi slopes for `heads` heads (heads >= 1).
///
/// With c = 2^floor(log2 heads):
///  - heads a power of two: m_h = 2^(-8 (h+1) / heads), h = 0..heads-1;
///  - otherwise m_h = 2^(-8 (h+1) / c) for h < c, then the odd entries of the
///    2c-head schedule, m_h = 2^(-4 (2 (h - c) + 1) / c) for h >= c.
/// The order is the references' order (not monotonic for non-powers of two).
/// Computed in double, rounded once to float32.
///
///   alibi_slopes(8)  -> {0.5, 0.25, ..., 0.00390625}
///   alibi_slopes(6)  -> {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}
std::vector<float> alibi_slopes(std::int64_t heads);

/// ggml's `ggml_soft_max_ext` / MPT's `alibi_bias_max` schedule: with
/// nl2 = 2^floor(log2 heads), m0 = 2^(-max_bias / nl2) and
/// m1 = 2^(-(max_bias / 2) / nl2), slope m0^(h+1) for h < nl2, else
/// m1^(2 (h - nl2) + 1). max_bias = 8 equals alibi_slopes(heads). As in
/// ggml, max_bias <= 0 gives slope 1 for every head. Computed in float32 with
/// powf, as ggml does. Throws std::invalid_argument for heads < 1 or a
/// non-finite max_bias.
std::vector<float> alibi_slopes_max_bias(std::int64_t heads, float max_bias);

/// The slopes of heads [h0, h1) of the `total_heads`-head schedule: what a
/// tensor-parallel rank holding those heads needs (never the schedule of
/// h1 - h0 heads). Requires 0 <= h0 <= h1 <= total_heads, total_heads >= 1.
std::vector<float> alibi_slopes_range(std::int64_t total_heads,
                                      std::int64_t h0, std::int64_t h1);

/// Like alibi_slopes_range, over the max_bias schedule.
std::vector<float> alibi_slopes_range_max_bias(std::int64_t total_heads,
                                               std::int64_t h0,
                                               std::int64_t h1,
                                               float max_bias);

}  // namespace posbias

#endif  // POSBIAS_SLOPES_H_
