"""zeta's DynamicPositionBias, drop-in (same parameter names), trainable."""
from typing import Optional

import torch
from torch import nn

from . import _checks
from ._library import load as _load

_load()


def expand_distance_table(table: torch.Tensor, i: int, j: int,
                          dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The [h, i, j] bias of a distance table [h, n], n odd, read at its centre:
    bias[h][r][c] = table[h][(n - 1) / 2 + (q_r - c)] with q_r = j - i + r, so
    one table built for the longest sequence serves every shorter one (with
    n = 2j - 1 the centre is j - 1). Needs n >= 2 max(i, j) - 1. One core call
    (the op expand_distance_table), differentiable with respect to the table
    (the backward is the core's reduction, the op reduce_distance_table).
    table: float32, bfloat16 or float16 on the CPU, any strides; dtype: the
    output dtype (default the table's). A float64 table or dtype takes the
    core's reference path (exact in double; the backward too, so gradcheck and
    gradgradcheck run in float64). The core validates the arguments:
    ValueError / TypeError with its message."""
    _checks.check_tensor("expand_distance_table: table", table, cpu=False)
    i = _checks.check_int("expand_distance_table: i", i)
    j = _checks.check_int("expand_distance_table: j", j)
    return torch.ops.posbias.expand_distance_table(table, i, j, dtype)


class DynamicPositionBias(nn.Module):
    """zeta's DynamicPositionBias(dim, heads), and x-transformers'
    DynamicPositionBias(dim, heads=, depth=, log_distance=False, norm=False),
    drop-in.

    zeta (depth None): mlp = Sequential(Linear(1, dim), SiLU, Linear(dim, dim),
    SiLU, Linear(dim, heads)) over |q_r - c| (state-dict names mlp.0/2/4.weight
    and .bias, so zeta state dicts load strict). x-transformers (depth given):
    mlp = ModuleList([Sequential(Linear(1, dim), LayerNorm(dim) if norm else
    Identity, SiLU), depth - 1 x Sequential(Linear(dim, dim), norm, SiLU),
    Linear(dim, heads)]) over the signed distance q_r - c (sign(x) log(|x| + 1)
    with log_distance); state-dict names mlp.0.0.weight ... mlp.<depth>.bias.

    forward(i, j), 0 <= i <= j, returns [heads, i, j] with
    bias[h][r][c] = MLP(distance)[h], q_r = j - i + r: two core calls, the
    core DynamicPositionBias's distance_table(j) on these parameters (the op
    dpb_distance_table; its backward the core's backward_distance_table) and
    the core's expansion (expand_distance_table; its backward the core's
    reduction). i and j are lengths, not positions: the seed's module(0, 5) is
    an empty [heads, 0, 5]. Trainable through autograd. The core computes in
    float32; the output has the parameters' dtype (float32, bfloat16 or
    float16). A float64 module (.double()) takes the core's reference path: the
    same MLP in double (dpb_distance_table_f64 and its backward) and the
    expansion in double, so torch.autograd.gradcheck runs on it
    (docs/python.md).

    distance_table(j) returns the [heads, 2j - 1] table that
    posbias.attention(..., bias="table") reads directly (no [heads, i, j]
    tensor at all), also differentiable."""

    def __init__(self, dim: int, heads: int, depth: Optional[int] = None,
                 log_distance: bool = False, norm: bool = False) -> None:
        super().__init__()
        # The sizes of the torch parameters, before nn.Linear allocates them
        # (the core checks them again on every call).
        dim = _checks.check_int("DynamicPositionBias: dim", dim, minimum=1)
        heads = _checks.check_int("DynamicPositionBias: heads", heads, minimum=1)
        for name, flag in (("log_distance", log_distance), ("norm", norm)):
            if not isinstance(flag, bool):
                raise TypeError(f"posbias: DynamicPositionBias: {name} must be a bool, got "
                                f"{type(flag).__name__}")
        self.dim = dim
        self.heads = heads
        self.depth = depth
        self.log_distance = log_distance
        self.norm = norm
        if depth is None:  # zeta
            if log_distance or norm:
                raise ValueError("posbias: DynamicPositionBias: log_distance and norm belong to "
                                 "the x-transformers variant: give depth as well")
            self.mlp = nn.Sequential(
                nn.Linear(1, dim), nn.SiLU(),
                nn.Linear(dim, dim), nn.SiLU(),
                nn.Linear(dim, heads))
            return
        depth = _checks.check_int("DynamicPositionBias: depth", depth, minimum=1)
        self.depth = depth

        def block(n_in):
            return nn.Sequential(nn.Linear(n_in, dim), nn.LayerNorm(dim) if norm else nn.Identity(),
                                 nn.SiLU())

        self.mlp = nn.ModuleList([block(1)] + [block(dim) for _ in range(depth - 1)] +
                                 [nn.Linear(dim, heads)])

    def _params(self):
        return list(self.mlp.parameters())  # state-dict order, as the op takes them

    def distance_table(self, j: int) -> torch.Tensor:
        """[heads, 2j - 1]: entry (q_r - c) + (j - 1) holds MLP(|q_r - c|)."""
        j = _checks.check_int("DynamicPositionBias.distance_table: j", j)
        # One core call (and one for the backward); float32, bfloat16 or float16.
        params = self._params()
        _checks.check_tensor("DynamicPositionBias: mlp.0.weight", params[0])  # CPU-only
        variant = "zeta" if self.depth is None else "x-transformers"
        return torch.ops.posbias.dpb_distance_table(params, j, variant, self.log_distance,
                                                    self.norm, 1e-5)

    def forward(self, i: int, j: int) -> torch.Tensor:
        i = _checks.check_int("DynamicPositionBias: i", i, minimum=0)
        j = _checks.check_int("DynamicPositionBias: j", j, minimum=0)
        if i > j:
            raise ValueError(f"posbias: DynamicPositionBias: needs 0 <= i <= j (i and j are "
                             f"the query and key lengths), got i = {i}, j = {j}")
        if j == 0:
            p = self._params()[0]
            return p.new_zeros(self.heads, 0, 0)
        return expand_distance_table(self.distance_table(j), i, j)

    def extra_repr(self):
        if self.depth is None:
            return f"dim={self.dim}, heads={self.heads}"
        return (f"dim={self.dim}, heads={self.heads}, depth={self.depth}, "
                f"log_distance={self.log_distance}, norm={self.norm}")
