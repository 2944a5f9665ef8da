"""zeta's DynamicPositionBias, drop-in (same parameter names), trainable."""
import torch
from torch import nn

from . import _checks
from ._library import load as _load

_load()


class _ExpandTable(torch.autograd.Function):
    """[h, 2j - 1] distance table -> [h, i, j] bias, bias[h][r][c] =
    table[h][(q_r - c) + (j - 1)] with q_r = j - i + r. The backward sums the
    gradient along each diagonal (one pass, no scatter)."""

    @staticmethod
    def forward(ctx, table, i, j):
        ctx.i, ctx.j = i, j
        if i == 0:
            return table.new_zeros(table.shape[0], 0, j)
        # f[u] = table[2j - 2 - u]; row r is the window of f starting at i - 1 - r.
        f = table[:, :2 * j - 1].flip(-1)
        return f.unfold(-1, j, 1)[:, :i].flip(1)  # flip copies: contiguous

    @staticmethod
    def backward(ctx, grad):
        i, j = ctx.i, ctx.j
        h = grad.shape[0]
        out = grad.new_zeros(h, 2 * j - 1)
        if i == 0:
            return out, None, None
        # In mirrored coordinates u = (2j - 2) - entry = (i - 1 - r) + c, row r of
        # the gradient adds onto the window [i - 1 - r, i - 1 - r + j): one pass
        # over the gradient, no index tensor, no copy of it (a per-row loop is
        # ~10x faster here than a padded skew view or index_add).
        acc = grad.new_zeros(h, i - 1 + j)
        for r in range(i):
            acc[:, i - 1 - r:i - 1 - r + j].add_(grad[:, r])
        out[:, j - i:] = acc.flip(-1)
        return out, None, None


def expand_distance_table(table, i, j):
    """The [h, i, j] bias of a distance table [h, >= 2j - 1] (entry
    (q_r - c) + (j - 1)), differentiable with respect to the table. 0 <= i <= j."""
    _checks.check_tensor("expand_distance_table: table", table, ndim=2, cpu=False)
    i = _checks.check_int("expand_distance_table: i", i, minimum=0)
    j = _checks.check_int("expand_distance_table: j", j, minimum=0)
    if i > j:
        raise ValueError(f"posbias: expand_distance_table: needs i <= j, got i = {i}, j = {j}")
    if table.shape[1] < 2 * j - 1:
        raise ValueError(f"posbias: expand_distance_table: table {_checks.shape_str(table)} "
                         f"has fewer than 2j - 1 = {2 * j - 1} entries per head")
    if j == 0:
        return table.new_zeros(table.shape[0], 0, 0)
    return _ExpandTable.apply(table, i, j)


class DynamicPositionBias(nn.Module):
    """zeta's DynamicPositionBias(dim, heads), drop-in.

    mlp = Sequential(Linear(1, dim), SiLU, Linear(dim, dim), SiLU,
    Linear(dim, heads)) (state-dict names mlp.0/2/4.weight/bias, so zeta state
    dicts load). forward(i, j), 0 <= i <= j, runs the MLP on the distances
    0..j-1 (the op dpb_distance_table) and returns [heads, i, j] with
    bias[h][r][c] = MLP(|q_r - c|)[h], q_r = j - i + r. i and j are lengths,
    not positions: the seed's module(0, 5) is an empty [heads, 0, 5].
    Trainable through autograd; the output has the parameters' dtype.

    distance_table(j) returns the [heads, 2j - 1] table that
    posbias.attention(..., bias="table") reads directly (no [heads, i, j]
    tensor at all), also differentiable."""

    def __init__(self, dim, heads):
        super().__init__()
        dim = _checks.check_int("DynamicPositionBias: dim", dim, minimum=1)
        heads = _checks.check_int("DynamicPositionBias: heads", heads, minimum=1)
        self.dim = dim
        self.heads = heads
        self.mlp = nn.Sequential(
            nn.Linear(1, dim), nn.SiLU(),
            nn.Linear(dim, dim), nn.SiLU(),
            nn.Linear(dim, heads))

    def _params(self):
        m = self.mlp
        return [m[0].weight, m[0].bias, m[2].weight, m[2].bias, m[4].weight, m[4].bias]

    def distance_table(self, j):
        """[heads, 2j - 1]: entry (q_r - c) + (j - 1) holds MLP(|q_r - c|)."""
        j = _checks.check_int("DynamicPositionBias.distance_table: j", j, minimum=1)
        params = self._params()
        if params[0].device.type == "cpu":  # the op keeps the parameters' dtype
            return torch.ops.posbias.dpb_distance_table(params, j, "zeta", False, False, 1e-5)
        # Other devices: the same MLP in torch.
        t = self.mlp(torch.arange(j, dtype=params[0].dtype, device=params[0].device)[:, None])
        idx = (torch.arange(2 * j - 1, device=t.device) - (j - 1)).abs()
        return t[idx].t()

    def forward(self, i, j):
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
        return f"dim={self.dim}, heads={self.heads}"
