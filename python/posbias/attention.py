"""attention(q, k, v, ...): the fused CPU attention op with a positional bias."""
import math

import torch

from . import _checks
from ._library import load as _load

_load()

BIAS_KINDS = ("none", "alibi", "table", "dense")


def _resolve_bias(bias, slopes, table, dense):
    given = {"alibi": slopes, "table": table, "dense": dense}
    present = [k for k, t in given.items() if t is not None]
    if bias is None:
        if len(present) > 1:
            raise ValueError("posbias: attention: give at most one of slopes, table and dense "
                             f"(got {', '.join(present)})")
        return present[0] if present else "none"
    if not isinstance(bias, str):
        raise TypeError(f"posbias: attention: bias must be a str (one of {', '.join(BIAS_KINDS)})"
                        f", got {type(bias).__name__}")
    if bias not in BIAS_KINDS:
        raise ValueError(f"posbias: attention: unknown bias {bias!r}; expected one of "
                         f"{', '.join(BIAS_KINDS)}")
    wrong = [k for k in present if k != bias]
    if wrong:
        names = {"alibi": "slopes", "table": "table", "dense": "dense"}
        raise ValueError(f"posbias: attention: bias={bias!r} does not use "
                         f"{', '.join(names[k] for k in wrong)}")
    if bias != "none" and given[bias] is None:
        names = {"alibi": "slopes", "table": "table", "dense": "dense"}
        raise ValueError(f"posbias: attention: bias={bias!r} needs {names[bias]}")
    return bias


def check_attention_args(q, k, v, bias=None, slopes=None, table=None, dense=None, scale=None,
                         causal=False):
    """Validates the arguments of attention(); returns the bias kind."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, dtypes=_checks.FLOAT_DTYPES, ndim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"posbias: attention: q, k and v must have the same dtype, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    b, h, i, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"posbias: attention: k {_checks.shape_str(k)} and v "
                         f"{_checks.shape_str(v)} must have the same shape")
    bk, hk, j, dk = k.shape
    if bk != b or dk != d:
        raise ValueError(f"posbias: attention: q {_checks.shape_str(q)} and k "
                         f"{_checks.shape_str(k)} must agree in batch (dim 0) and head "
                         f"dimension (dim 3)")
    if d == 0:
        raise ValueError(f"posbias: attention: head dimension d must be >= 1, got q "
                         f"{_checks.shape_str(q)}")
    if hk == 0 or h % hk != 0:
        raise ValueError(f"posbias: attention: q has {h} heads and k {hk}; the query heads "
                         f"must be a multiple of the kv heads (grouped-query attention)")
    if not isinstance(causal, bool):
        raise TypeError(f"posbias: attention: causal must be a bool, got "
                        f"{type(causal).__name__}")
    scale = _checks.check_float("attention: scale", scale)
    kind = _resolve_bias(bias, slopes, table, dense)
    if kind == "alibi":
        _checks.check_slopes("attention: slopes", slopes, heads=h)
    elif kind == "table":
        _checks.check_tensor("attention: table", table, ndim=2)
        if not table.is_floating_point():
            raise TypeError(f"posbias: attention: table must be floating, got {table.dtype}")
        need = max(2 * j - 1, 0)
        if table.shape[0] != h or table.shape[1] < need:
            raise ValueError(f"posbias: attention: table {_checks.shape_str(table)} must be "
                             f"[h, >= 2j - 1] = [{h}, >= {need}] for q {_checks.shape_str(q)} "
                             f"and k {_checks.shape_str(k)}")
        if not causal and i > j:
            raise ValueError(f"posbias: attention: a distance table without causal masking "
                             f"needs i <= j (rows before the first key have no table entry); "
                             f"got i = {i}, j = {j}")
    elif kind == "dense":
        _checks.check_tensor("attention: dense", dense)
        if not dense.is_floating_point():
            raise TypeError(f"posbias: attention: dense must be floating, got {dense.dtype}")
        if dense.dim() > 4:
            raise ValueError(f"posbias: attention: dense has {dense.dim()} dimensions; at most "
                             f"4 (broadcastable to [b, h, i, j])")
        target = (b, h, i, j)
        for pos in range(1, dense.dim() + 1):
            s = dense.shape[-pos]
            if s != 1 and s != target[-pos]:
                raise ValueError(f"posbias: attention: dense {_checks.shape_str(dense)} does "
                                 f"not broadcast to [b, h, i, j] = {list(target)}")
    return kind, scale


def attention(q, k, v, bias=None, *, slopes=None, table=None, dense=None, scale=None,
              causal=False):
    """Fused attention with a positional bias:
    ``softmax(scale * q @ k^T + bias, mask) @ v`` (softmax in float32).

    q [b, h, i, d]; k, v [b, hk, j, d] with h % hk == 0 (grouped-query); float32,
    bfloat16 or float16, all three alike, on the CPU. Queries are the last i of
    the j key positions (bottom-right): row r sits at q_r = j - i + r.

    bias: "none", "alibi" (slopes [h]: -m_h |c - q_r|), "table" (table
    [h, >= 2j - 1] read at (q_r - c) + (j - 1): DynamicPositionBias,
    RelativePositionBias, any Toeplitz bias) or "dense" (dense broadcastable to
    [b, h, i, j]); None infers it from the tensor given. scale defaults to
    1/sqrt(d). causal masks key c for row r when c > q_r; a row without a
    visible key outputs zeros.

    Differentiable with respect to q, k, v, table and dense. Returns [b, h, i, d]
    in q's dtype."""
    kind, scale = check_attention_args(q, k, v, bias, slopes, table, dense, scale, causal)
    return torch.ops.posbias.attention(q, k, v, kind, slopes, table, dense, scale, causal)


def attention_lse(q, k, v, bias=None, *, slopes=None, table=None, dense=None, scale=None,
                  causal=False):
    """As attention(), also returning lse float32 [b, h, i]: the natural log of
    each row's softmax denominator (-inf for a row without visible keys), which
    merges partial results over key blocks (see posbias.parallel.merge_partials).
    No gradient flows through lse."""
    kind, scale = check_attention_args(q, k, v, bias, slopes, table, dense, scale, causal)
    return torch.ops.posbias.attention_lse(q, k, v, kind, slopes, table, dense, scale, causal)


def default_scale(d):
    return 1.0 / math.sqrt(d)
