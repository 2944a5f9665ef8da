"""attention(q, k, v, ...): the fused CPU attention op with a positional bias."""
import math
from typing import Optional, Tuple

import torch

from . import _checks
from ._library import load as _load

_load()

BIAS_KINDS = ("none", "alibi", "table", "dense")
_TENSOR_NAMES = {"alibi": "slopes", "table": "table", "dense": "dense"}


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
        raise ValueError(f"posbias: attention: bias={bias!r} does not use "
                         f"{', '.join(_TENSOR_NAMES[k] for k in wrong)}")
    if bias != "none" and given[bias] is None:
        raise ValueError(f"posbias: attention: bias={bias!r} needs {_TENSOR_NAMES[bias]}")
    return bias


def check_attention_args(q, k, v, bias=None, slopes=None, table=None, dense=None, scale=None,
                         causal=False):
    """Checks what only Python sees (types, devices, the bias keyword) and
    returns (bias kind, scale). Shapes, dtypes and values are checked once, in
    the op and the core: ValueError / TypeError with their messages."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t)
    if not isinstance(causal, bool):
        raise TypeError(f"posbias: attention: causal must be a bool, got "
                        f"{type(causal).__name__}")
    scale = _checks.check_float("attention: scale", scale, finite=False)
    kind = _resolve_bias(bias, slopes, table, dense)
    if kind != "none":
        _checks.check_tensor(f"attention: {_TENSOR_NAMES[kind]}",
                             {"alibi": slopes, "table": table, "dense": dense}[kind])
    return kind, scale


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[str] = None, *,
              slopes: Optional[torch.Tensor] = None, table: Optional[torch.Tensor] = None,
              dense: Optional[torch.Tensor] = None, scale: Optional[float] = None,
              causal: bool = False, q_offset: Optional[int] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fused attention with a positional bias:
    ``softmax(scale * q @ k^T + bias, mask) @ v`` (softmax in float32).

    q [b, h, i, d]; k, v [b, hk, j, d] with h % hk == 0 (grouped-query); float32,
    bfloat16, float16 or float64, all three alike, on the CPU (float64: the core's
    double reference path, exact but not fast, for gradcheck). Queries are the last i of
    the j key positions (bottom-right): row r sits at q_r = j - i + r.

    bias: "none", "alibi" (slopes [h]: -m_h |c - q_r|), "table" (table
    [h, n], n odd, read at its centre: entry (n - 1) / 2 + (q_r - c), so a
    [h, 2j - 1] table or any longer one: DynamicPositionBias,
    RelativePositionBias, any Toeplitz bias) or "dense" (dense broadcastable to
    [b, h, i, j]); None infers it from the tensor given. scale defaults to
    1/sqrt(d). causal masks key c for row r when c > q_r; a row without a
    visible key outputs zeros.

    Differentiable with respect to q, k, v, slopes (learned ALiBi), table and
    dense. Returns [b, h, i, d]
    in q's dtype.

    Options (the core's AttentionOptions, also in the backward): q_offset
    (int: row r sits at q_offset + r instead of j - i + r), window (left,
    right): key c visible iff q_r - left <= c <= q_r + right, -1 unbounded;
    softcap > 0: the score becomes softcap * tanh(scale q.k / softcap) before
    the bias; key_mask bool or uint8 [b, j], 0 = masked key (Hugging Face's
    attention_mask). slopes may also be [b, h] (one set per sequence)."""
    kind, scale = check_attention_args(q, k, v, bias, slopes, table, dense, scale, causal)
    if _has_options(q_offset, window, softcap, key_mask):
        return _with_options(q, k, v, kind, slopes, table, dense, scale, causal, q_offset, window,
                             softcap, key_mask)[0]
    return torch.ops.posbias.attention(q, k, v, kind, slopes, table, dense, scale, causal)


def _has_options(q_offset, window, softcap, key_mask):
    return (q_offset is not None or not isinstance(window, (tuple, list)) or
            tuple(window) != (-1, -1) or softcap != 0.0 or key_mask is not None)


def _with_options(q, k, v, kind, slopes, table, dense, scale, causal, q_offset, window, softcap,
                  key_mask):
    """(out, lse) of the op attention_options_forward (the options' checks in
    batches.attention_options)."""
    from .batches import attention_options
    pick = {name: (t if kind == name else None)
            for name, t in (("alibi", slopes), ("table", table), ("dense", dense))}
    return attention_options(q, k, v, pick["alibi"], pick["table"], pick["dense"], scale, causal,
                             q_offset, window, softcap, key_mask)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[str] = None,
                  *, slopes: Optional[torch.Tensor] = None,
                  table: Optional[torch.Tensor] = None, dense: Optional[torch.Tensor] = None,
                  scale: Optional[float] = None, causal: bool = False,
                  q_offset: Optional[int] = None, window: Tuple[int, int] = (-1, -1),
                  softcap: float = 0.0,
                  key_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """As attention() (the same bias and options: q_offset, window, softcap,
    key_mask), also returning lse float32 [b, h, i]: the natural log of each
    row's softmax denominator (-inf for a row without visible keys), which
    merges partial results over key blocks (see posbias.parallel.merge_partials;
    q_offset places a block at its global position). out is differentiable as
    attention()'s; no gradient flows through lse."""
    kind, scale = check_attention_args(q, k, v, bias, slopes, table, dense, scale, causal)
    if _has_options(q_offset, window, softcap, key_mask):
        return _with_options(q, k, v, kind, slopes, table, dense, scale, causal, q_offset, window,
                             softcap, key_mask)
    return torch.ops.posbias.attention_lse(q, k, v, kind, slopes, table, dense, scale, causal)


def default_scale(d: int) -> float:
    """1 / sqrt(d), the default scale of attention()."""
    return 1.0 / math.sqrt(d)
