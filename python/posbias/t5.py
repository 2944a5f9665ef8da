"""x-transformers' T5 RelativePositionBias, drop-in."""
import torch
from torch import nn

from . import _checks
from ._library import load as _load
from .dpb import expand_distance_table

_load()


class RelativePositionBias(nn.Module):
    """RelativePositionBias(scale, causal=False, num_buckets=32, max_distance=128,
    heads=8): an embedding `relative_attention_bias` [num_buckets, heads];
    forward(i, j) -> [heads, i, j], E[bucket(c - q_r)][h] * scale, q_r = j - i + r
    (0 <= i <= j), the core's expansion of distance_table(j) (its backward is
    the core's reduction). distance_table(j) gives the [heads, 2j - 1] table
    for posbias.attention(..., bias="table"): the core RelativePositionBias's
    distance_table over the embedding (the op t5_distance_table; its backward
    the core's scatter-add of the gradient into the buckets). Both
    differentiable w.r.t. the embedding; float32, bfloat16 or float16, and
    float64 on the core's reference path (t5_distance_table_f64: the buckets,
    the gather and the scale in double; its backward the scatter-add in
    double), so gradcheck runs on it."""

    def __init__(self, scale: float, causal: bool = False, num_buckets: int = 32,
                 max_distance: int = 128, heads: int = 8) -> None:
        super().__init__()
        self.scale = _checks.check_float("RelativePositionBias: scale", scale, allow_none=False,
                                         finite=False)
        if not isinstance(causal, bool):
            raise TypeError("posbias: RelativePositionBias: causal must be a bool")
        self.causal = causal
        self.num_buckets = _checks.check_int("RelativePositionBias: num_buckets", num_buckets)
        self.max_distance = _checks.check_int("RelativePositionBias: max_distance", max_distance)
        # The embedding's size is checked before torch allocates it; the
        # bucket arguments and the scale by the core, now (a one-entry table of
        # a zero embedding is a core call), not at the first forward.
        heads = _checks.check_int("RelativePositionBias: heads", heads, minimum=1)
        torch.ops.posbias.t5_distance_table(torch.zeros(max(self.num_buckets, 0), heads), 1,
                                            causal, self.num_buckets, self.max_distance,
                                            self.scale)
        self.heads = heads
        self.relative_attention_bias = nn.Embedding(self.num_buckets, heads)

    def distance_table(self, j: int) -> torch.Tensor:
        """[heads, 2j - 1]: entry (q_r - c) + (j - 1) holds E[bucket(c - q_r)] * scale."""
        j = _checks.check_int("RelativePositionBias.distance_table: j", j)
        _checks.check_tensor("RelativePositionBias: relative_attention_bias.weight",
                             self.relative_attention_bias.weight)  # CPU-only
        return torch.ops.posbias.t5_distance_table(self.relative_attention_bias.weight, j,
                                                   self.causal, self.num_buckets,
                                                   self.max_distance, self.scale)

    def forward(self, i: int, j: int) -> torch.Tensor:
        i = _checks.check_int("RelativePositionBias: i", i, minimum=0)
        j = _checks.check_int("RelativePositionBias: j", j, minimum=0)
        if i > j:
            raise ValueError(f"posbias: RelativePositionBias: needs 0 <= i <= j, got i = {i}, "
                             f"j = {j}")
        if j == 0:
            return self.relative_attention_bias.weight.new_zeros(self.heads, 0, 0)
        return expand_distance_table(self.distance_table(j), i, j)

    def extra_repr(self):
        return (f"scale={self.scale}, causal={self.causal}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, heads={self.heads}")
