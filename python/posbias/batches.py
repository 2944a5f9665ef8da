"""Attention's options and batch layouts (issues 16 and 17), FlashAttention-2's
names and layouts: the dense call's q_offset / window / softcap / key_mask
(autograd through posbias.attention), packed variable-length batches
(attention_varlen, autograd) and attention against a KV cache, paged or not
(attention_with_kvcache, forward only). Each is one core call; shapes, dtypes
and values are checked there (ValueError / TypeError with its message).
Autograd is the ops' own (torch::autograd::Functions in the op library,
torch/src/batch_ops.cc), so C++ callers of the ops get the same gradients."""
from typing import Optional, Sequence, Tuple, Union

import torch

from . import _checks
from ._library import load as _load

_load()

_ops = torch.ops.posbias


def check_window(who: str, window) -> Tuple[int, int]:
    """(left, right) of a window given as a pair of ints (-1: unbounded)."""
    if (not isinstance(window, (tuple, list)) or len(window) != 2 or
            not all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"posbias: {who}: window must be a pair of ints (left, right), "
                        f"-1 for an unbounded side, got {window!r}")
    return int(window[0]), int(window[1])


def _check_common(who, tensors, causal, softcap, scale):
    for name, t in tensors.items():
        # The common case without formatting a name; check_tensor says what is wrong.
        if t is not None and not (isinstance(t, torch.Tensor) and t.is_cpu):
            _checks.check_tensor(f"{who}: {name}", t)
    if not isinstance(causal, bool):
        raise TypeError(f"posbias: {who}: causal must be a bool, got {type(causal).__name__}")
    softcap = _checks.check_float(f"{who}: softcap", softcap, finite=False)
    scale = _checks.check_float(f"{who}: softmax_scale", scale, finite=False)
    return (0.0 if softcap is None else softcap), scale


def attention_options(q, k, v, slopes, table, dense, scale, causal, q_offset, window, softcap,
                      key_mask):
    """The dense attention with options: (out, lse), differentiable in out."""
    left, right = check_window("attention", window)
    if q_offset is not None and (not isinstance(q_offset, int) or isinstance(q_offset, bool)):
        raise TypeError(f"posbias: attention: q_offset must be an int or None, got "
                        f"{type(q_offset).__name__}")
    softcap, _ = _check_common("attention", {"key_mask": key_mask}, causal, softcap, None)
    # The op's Autograd kernel (C++) differentiates out w.r.t. q, k, v and the bias tensors.
    return _ops.attention_options_forward(q, k, v, slopes, table, dense, scale, causal, q_offset,
                                          left, right, softcap, key_mask)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, dropout_p: float = 0.0,
                     softmax_scale: Optional[float] = None, causal: bool = False,
                     window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     distance_table: Optional[torch.Tensor] = None,
                     return_softmax_lse: bool = False):
    """Attention over sequences packed without padding, as FlashAttention-2's
    flash_attn_varlen_func: q [total_q, h, d], k, v [total_k, hk, d]
    (h % hk == 0), cu_seqlens_q / cu_seqlens_k int32 [b + 1] (cumulative
    lengths from 0). Sequence s's queries are its last positions (bottom-right).
    max_seqlen_q / max_seqlen_k are accepted for compatibility (the lengths are
    read from cu_seqlens). dropout_p must be 0. Bias: alibi_slopes [h] or
    [b, h] (-slope |q_pos - k_pos|) or distance_table [h, n] (n odd, read at
    its centre); causal, window_size (left, right; -1 unbounded), softcap.
    Differentiable w.r.t. q, k, v, alibi_slopes and distance_table. Returns
    out [total_q, h, d] in q's dtype, or (out, lse float32 [h, total_q]) with
    return_softmax_lse."""
    who = "attention_varlen"
    if dropout_p != 0.0:
        raise ValueError(f"posbias: {who}: dropout_p must be 0 (no dropout), got {dropout_p!r}")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"posbias: {who}: {name} must be an int, got {type(n).__name__}")
    if alibi_slopes is not None and distance_table is not None:
        raise ValueError(f"posbias: {who}: give at most one of alibi_slopes and distance_table")
    left, right = check_window(who, window_size)
    softcap, scale = _check_common(
        who, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
              "alibi_slopes": alibi_slopes, "distance_table": distance_table},
        causal, softcap, softmax_scale)
    out, lse = _ops.attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                             distance_table, scale, causal, left, right, softcap)
    return (out, lse) if return_softmax_lse else out


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: Union[torch.Tensor, int],
                           block_table: Optional[torch.Tensor] = None,
                           k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[torch.Tensor] = None,
                           distance_table: Optional[torch.Tensor] = None,
                           return_softmax_lse: bool = False,
                           cache_batch_idx: Optional[torch.Tensor] = None):
    """Attention of new queries against a KV cache, as FlashAttention-2's
    flash_attn_with_kvcache (forward only): q [b, i, h, d]; cache_seqlens int32
    [b] (or one int for every sequence); with block_table int32 [b, max_blocks], k_cache and v_cache are paged
    [num_blocks, block_size, hk, d], without it one slab per sequence
    [b, max_len, hk, d]. When k and v [b, n, hk, d] are given they are first
    written into the caches (in place) at positions cache_seqlens[s] ..
    cache_seqlens[s] + n - 1, and attention reads cache_seqlens + n keys
    (cache_seqlens itself is not changed). The queries are each sequence's
    last i positions. Returns out [b, i, h, d] in q's dtype, or with
    return_softmax_lse (out, lse float32 [b, h, i]; float64 for float64 q),
    the natural log of each row's softmax denominator, -inf for a row that
    sees no key (flash_attn_with_kvcache's softmax_lse): what merging this
    result with attention over other keys of the same queries needs.

    cache_batch_idx int32 [b] (slabs only, as flash_attn_with_kvcache's):
    sequence s is slab cache_batch_idx[s] of k_cache / v_cache [B, max_len,
    hk, d] (B may exceed b), a serving engine's per-slot cache. It is the
    paged layout with one block of max_len rows per sequence, and runs as
    that (block_table = cache_batch_idx[:, None], no copy). With k and v
    the indices must be distinct (two sequences would write the same rows)."""
    who = "attention_with_kvcache"
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        # One length for every sequence, as flash_attn_with_kvcache allows.
        if not isinstance(q, torch.Tensor) or q.dim() != 4:
            raise ValueError(f"posbias: {who}: q must be [b, i, h, d]")
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32)
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"posbias: {who}: return_softmax_lse must be a bool, got "
                        f"{type(return_softmax_lse).__name__}")
    if (k is None) != (v is None):
        raise ValueError(f"posbias: {who}: give both k and v or neither")
    if alibi_slopes is not None and distance_table is not None:
        raise ValueError(f"posbias: {who}: give at most one of alibi_slopes and distance_table")
    left, right = check_window(who, window_size)
    softcap, scale = _check_common(
        who, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens,
              "block_table": block_table, "k": k, "v": v, "alibi_slopes": alibi_slopes,
              "distance_table": distance_table}, causal, softcap, softmax_scale)
    if cache_batch_idx is not None:
        block_table = _slab_table(who, cache_batch_idx, block_table, q, k_cache, k is not None)
    seqlens = cache_seqlens
    if k is not None:
        if k.dim() != 4:
            raise ValueError(f"posbias: {who}: k must be [b, n, hk, d], got {tuple(k.shape)}")
        with torch.no_grad():
            _ops.kvcache_append(k_cache, v_cache, cache_seqlens, block_table, k, v)
        seqlens = (cache_seqlens + k.shape[1]).to(cache_seqlens.dtype)
    with torch.no_grad():
        if return_softmax_lse:
            return _ops.attention_kvcache_lse(q, k_cache, v_cache, seqlens, block_table,
                                              alibi_slopes, distance_table, scale, causal, left,
                                              right, softcap)
        return _ops.attention_kvcache(q, k_cache, v_cache, seqlens, block_table, alibi_slopes,
                                      distance_table, scale, causal, left, right, softcap)


def _slab_table(who, idx, block_table, q, k_cache, appending):
    """The block table [b, 1] that reads slab idx[s] for sequence s (the
    slabs [B, max_len, hk, d] as B blocks of max_len rows), after the checks
    of cache_batch_idx."""
    _checks.check_tensor(f"{who}: cache_batch_idx", idx)
    if block_table is not None:
        raise ValueError(f"posbias: {who}: cache_batch_idx indexes slab caches "
                         f"[B, max_len, hk, d]; give it or block_table, not both")
    if idx.dtype != torch.int32:
        raise TypeError(f"posbias: {who}: cache_batch_idx must be int32, got {idx.dtype}")
    b = q.shape[0] if q.dim() >= 1 else -1
    if idx.dim() != 1 or idx.shape[0] != b:
        raise ValueError(f"posbias: {who}: cache_batch_idx must be [b] = [{b}], got "
                         f"{list(idx.shape)}")
    if idx.numel():
        slabs = k_cache.shape[0] if k_cache.dim() == 4 else 0
        bad = ((idx < 0) | (idx >= slabs)).nonzero()
        if bad.numel():
            s = int(bad[0, 0])
            raise ValueError(f"posbias: {who}: cache_batch_idx[{s}] = {int(idx[s])} is outside "
                             f"[0, {slabs}) (the slabs of k_cache {list(k_cache.shape)})")
        if appending and torch.unique(idx).numel() != idx.numel():
            raise ValueError(f"posbias: {who}: cache_batch_idx {idx.tolist()} repeats a slab; "
                             f"with k and v each sequence appends to its own slab")
    return idx.reshape(-1, 1).contiguous()


def empty(*size: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor (like torch.empty(*size, dtype=dtype)) on
    the core's storage: 64-byte aligned, and from 4 MiB up mapped from the
    kernel, 2 MiB aligned and advised as transparent huge pages. Allocate
    long-lived KV caches with it: torch 1.13's allocator never advises huge
    pages, and a decode over a 1 GiB cache in 4 KiB pages spends 15-20% more
    time in TLB misses (docs/python.md). size: ints or one sequence of ints;
    dtype float32, bfloat16, float16 or float64 (TypeError otherwise; a
    negative extent or a size that cannot fit is a ValueError from the core).

        k_cache = posbias.empty(num_blocks, block_size, hk, d, dtype=torch.bfloat16)
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dims = [_checks.check_int(f"empty: size[{n}]", s) for n, s in enumerate(size)]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"posbias: empty: dtype must be a torch.dtype, got "
                        f"{type(dtype).__name__} {dtype!r}")
    return torch.ops.posbias.empty(dims, dtype)
