"""ALiBi: slopes, zeta's AlibiPositionalBias (with the corrected bottom-right
cache) and the "ALiBi" seed's AlibiBias builder."""
import threading
from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from . import _checks
from ._library import load as _load
from .dpb import expand_distance_table

_load()


def alibi_slopes(heads: int, max_bias: Optional[float] = None) -> torch.Tensor:
    """The ALiBi slope schedule of `heads` heads, float32 [heads]
    (2^-8(h+1)/n for a power of two, interleaved otherwise); with max_bias the
    ggml / MPT form (max_bias = 8 gives the standard schedule)."""
    heads = _checks.check_int("alibi_slopes: heads", heads)
    max_bias = _checks.check_float("alibi_slopes: max_bias", max_bias, finite=False)
    return torch.ops.posbias.alibi_slopes(heads, max_bias)


def alibi_slopes_range(total_heads: int, head_begin: int, head_end: int,
                       max_bias: Optional[float] = None) -> torch.Tensor:
    """Slopes of heads [head_begin, head_end) of the total_heads schedule (a
    tensor-parallel rank's share; never the schedule of head_end - head_begin
    heads)."""
    total_heads = _checks.check_int("alibi_slopes_range: total_heads", total_heads)
    head_begin = _checks.check_int("alibi_slopes_range: head_begin", head_begin)
    head_end = _checks.check_int("alibi_slopes_range: head_end", head_end)
    max_bias = _checks.check_float("alibi_slopes_range: max_bias", max_bias, finite=False)
    return torch.ops.posbias.alibi_slopes_range(total_heads, head_begin, head_end, max_bias)


def alibi_distance_table(slopes: torch.Tensor, j: int) -> torch.Tensor:
    """[h, 2j - 1] float32 table for attention(bias="table"): entry
    (q_r - c) + (j - 1) holds -m_h |q_r - c| (the core's alibi_distance_table;
    not differentiable)."""
    _checks.check_tensor("alibi_distance_table: slopes", slopes)
    j = _checks.check_int("alibi_distance_table: j", j)
    return torch.ops.posbias.alibi_distance_table(slopes, j, True)


class _SlopeModule(nn.Module):
    """Keeps the `slopes` buffer float32 whatever .to()/.half() does to the
    module (FlashAttention #846), while recording the module's dtype for the
    output."""

    def _apply(self, fn):
        # The float32 values (a Parameter's .data is converted in place, so
        # keep its tensor, not the Parameter); .half() would round them.
        slopes = self.slopes.data if isinstance(self.slopes, nn.Parameter) else self.slopes
        super()._apply(fn)
        probe = fn(torch.empty(0, dtype=getattr(self, "dtype", torch.float32)))
        if probe.is_floating_point():
            self.dtype = probe.dtype
        if isinstance(self.slopes, nn.Parameter):  # learnable: the same Parameter object
            self.slopes.data = slopes.to(device=self.slopes.device)
            if self.slopes.grad is not None:
                self.slopes.grad = self.slopes.grad.to(torch.float32)
        else:
            self.slopes = slopes.to(device=self.slopes.device)  # new device, old values
        return self


class AlibiPositionalBias(_SlopeModule):
    """zeta's / x-transformers' AlibiPositionalBias, drop-in.

    AlibiPositionalBias(heads, total_heads=heads, slopes=None).
    forward(i, j) -> [total_heads, i, j] with bias[h][r][c] = -m_h |c - q_r| for
    h < heads and 0 for the appended heads; queries are the last i of the j
    keys (q_r = j - i + r), so forward(1, j) is the bias of a KV-cache decode
    step. i, j are lengths.

    The module keeps its largest result (attribute `bias`); a call that fits in
    it returns the bottom-right block [:, rows - i:, cols - j:] (a view, equal
    to a fresh build), a larger one replaces it. Thread-safe; a result handed
    out stays valid when the cache is replaced (it is never written to).

    Slopes stay float32 (.half() does not cast them); the output has the
    module's dtype (float32 unless the module was cast) and device; a
    float64 module (.double()) computes in double (the reference path).

    learnable=True keeps the slopes as a Parameter (in the state dict as
    `slopes`, trained by any optimizer): forward(i, j) is then the core's
    expansion of the [total_heads, 2 max(i, j) - 1] ALiBi table -m_h |e|, so
    the bias's gradient reaches the slopes (the core's reduction of it onto
    the distances, then a [h, 2j - 1] product), and nothing is cached. To
    train slopes inside the fused attention, pass the Parameter as
    posbias.attention(..., slopes=module.slopes)."""

    def __init__(self, heads: int, total_heads: Optional[int] = None,
                 slopes: Union[torch.Tensor, Sequence[float], None] = None,
                 learnable: bool = False) -> None:
        super().__init__()
        if slopes is not None:
            if isinstance(slopes, torch.Tensor):
                slopes = slopes.detach().to(torch.float32).reshape(-1).cpu()
            else:
                slopes = torch.tensor([float(s) for s in slopes], dtype=torch.float32)
            heads = slopes.numel()
        else:
            heads = _checks.check_int("AlibiPositionalBias: heads", heads)
            slopes = torch.ops.posbias.alibi_slopes(heads, None)
        if total_heads is None:
            total_heads = heads
        total_heads = _checks.check_int("AlibiPositionalBias: total_heads", total_heads)
        # The core checks the slopes (at least one, finite) and total_heads
        # now, not at the first call: an empty build is a core call.
        torch.ops.posbias.alibi_bias(slopes, 0, 0, total_heads, None)
        if not isinstance(learnable, bool):
            raise TypeError(f"posbias: AlibiPositionalBias: learnable must be a bool, got "
                            f"{type(learnable).__name__}")
        self.heads = heads
        self.total_heads = total_heads
        self.learnable = learnable
        self.dtype = torch.float32
        if learnable:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes, persistent=False)
        self.register_buffer("bias", None, persistent=False)
        self._lock = threading.Lock()

    @staticmethod
    def _get_slopes(heads: int) -> List[float]:
        """The slope schedule as a Python list (zeta's static method)."""
        return alibi_slopes(heads).tolist()

    @property
    def device(self) -> torch.device:
        return self.slopes.device

    def _build(self, i, j):
        out = torch.ops.posbias.alibi_bias(self.slopes.cpu(), i, j, self.total_heads, self.dtype)
        return out.to(self.device)

    def get_bias(self, i: int, j: int, device=None) -> torch.Tensor:
        """The slope-free distances -|c - q_r|, [1, i, j], float32."""
        i = _checks.check_int("AlibiPositionalBias.get_bias: i", i)
        j = _checks.check_int("AlibiPositionalBias.get_bias: j", j)
        out = torch.ops.posbias.alibi_bias(torch.ones(1), i, j, 1, torch.float32)
        return out.to(device if device is not None else self.device)

    def forward(self, i: int, j: int) -> torch.Tensor:
        i = _checks.check_int("AlibiPositionalBias: i", i)
        j = _checks.check_int("AlibiPositionalBias: j", j)
        if self.learnable:
            return self._learnable_bias(i, j)
        if torch.jit.is_tracing():  # the op in the graph, not a constant of the cache
            return self._build(i, j)
        with self._lock:
            cached = self.bias
            if (cached is not None and cached.dtype == self.dtype and
                    cached.device == self.device and i <= cached.shape[-2] and
                    j <= cached.shape[-1]):
                rows, cols = cached.shape[-2], cached.shape[-1]
                return cached[:, rows - i:, cols - j:]
            out = self._build(i, j)
            self.bias = out  # a request that does not fit replaces the cache
            return out

    def _learnable_bias(self, i, j):
        n = max(i, j, 1)
        # -|e| for e = -(n - 1) .. n - 1 (a core call), times the slopes: the
        # table, differentiable in the slopes; zero rows for appended heads.
        distances = torch.ops.posbias.alibi_distance_table(torch.ones(1), n, True)
        slopes = self.slopes.to(torch.float32)
        table = slopes[:, None] * distances.to(slopes.device)
        if self.total_heads > self.heads:
            table = torch.cat([table, table.new_zeros(self.total_heads - self.heads, 2 * n - 1)])
        _checks.check_tensor("AlibiPositionalBias: slopes", table)  # CPU-only
        return expand_distance_table(table, i, j, self.dtype)

    def forward_custom_pos(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Arbitrary positions (packed sequences, chunked prefill, context
        parallelism): [total_heads, len(q_pos), len(k_pos)],
        -m_h |k_pos[c] - q_pos[r]|. Positions are integer tensors (1-D)."""
        # Integer 1-d positions are the op's (and the core's) checks.
        core_dtype = (self.dtype if self.dtype in (torch.bfloat16, torch.float16, torch.float64)
                      else None)  # float64: computed in double
        out = torch.ops.posbias.alibi_bias_custom_pos(self.slopes.cpu(), self.total_heads,
                                                      q_pos, k_pos, core_dtype)
        return out.to(self.device, self.dtype)

    def extra_repr(self):
        learnable = ", learnable=True" if self.learnable else ""
        return f"heads={self.heads}, total_heads={self.total_heads}{learnable}"


class AlibiBias(_SlopeModule):
    """The "ALiBi" seed's builder: AlibiBias(n_heads, causal=True, slopes=None).

    build(q_len, k_len, device=None, dtype=None) -> [1, n_heads, q_len, k_len],
    bias = slope_h * dist with this seed's top-left positions (q = r, k = c):
    causal dist = max(r - c, 0) (future keys get 0: the causal mask is
    separate), non-causal |r - c|. Default slopes linspace(-0.05, -0.5, n_heads)
    (negative). Computed by the core (AlibiBias::build, the op
    alibi_bias_build) in float32 and rounded once to `dtype` (float64: computed
    in double on the reference path, the float32 slopes widened). The cache is keyed by
    (q_len, k_len, dtype, device). The slopes are a buffer, not trained."""

    def __init__(self, n_heads: int, causal: bool = True,
                 slopes: Union[torch.Tensor, Sequence[float], None] = None) -> None:
        super().__init__()
        n_heads = _checks.check_int("AlibiBias: n_heads", n_heads)
        if not isinstance(causal, bool):
            raise TypeError(f"posbias: AlibiBias: causal must be a bool, got "
                            f"{type(causal).__name__}")
        if slopes is None:
            # The seed's own default, torch.linspace itself: the core's
            # AlibiBias::default_slopes is within 2 ulp of it but not always
            # equal (n_heads >= 9), and a drop-in keeps the seed's bits.
            slopes = torch.linspace(-0.05, -0.5, steps=max(n_heads, 0))
        elif not isinstance(slopes, torch.Tensor):
            slopes = torch.tensor([float(s) for s in slopes], dtype=torch.float32)
        _checks.check_tensor("AlibiBias: slopes", slopes, cpu=False)
        self.n_heads = n_heads
        self.causal = causal
        self.dtype = torch.float32
        # The core checks n_heads and the slopes (count, finite) now, not at
        # the first build: an empty build is a core call.
        self._core_build(slopes.detach().cpu(), 0, 0, torch.float32)
        self.register_buffer("slopes", slopes.detach().to(torch.float32), persistent=False)
        self._cache_key = None
        self._cached_bias = None
        self._lock = threading.Lock()

    def _core_build(self, slopes, q_len, k_len, dtype):
        return torch.ops.posbias.alibi_bias_build(slopes, self.n_heads, self.causal, q_len,
                                                  k_len, dtype)

    @torch.no_grad()
    def build(self, q_len: int, k_len: int, device=None,
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        q_len = _checks.check_int("AlibiBias.build: q_len", q_len)
        k_len = _checks.check_int("AlibiBias.build: k_len", k_len)
        device = torch.device(device) if device is not None else self.slopes.device
        dtype = dtype or self.dtype
        if not dtype.is_floating_point:
            raise TypeError(f"posbias: AlibiBias.build: dtype must be floating, got {dtype}")
        key = (q_len, k_len, dtype, device)
        with self._lock:
            if self._cache_key == key:
                return self._cached_bias
            bias = self._core_build(self.slopes.cpu(), q_len, k_len, dtype)  # float64: in double
            bias = bias.to(device=device, dtype=dtype)
            self._cache_key = key
            self._cached_bias = bias
            return bias

    def forward(self, q_len: int, k_len: int, device=None,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """build(q_len, k_len, device, dtype)."""
        return self.build(q_len, k_len, device, dtype)

    def extra_repr(self):
        return f"n_heads={self.n_heads}, causal={self.causal}"
