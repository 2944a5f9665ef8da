"""Attention with a positional bias across processes, on torch.distributed.

Two ways to shard (they combine):

* Head (tensor) parallelism: rank k of n holds the query heads
  head_range(H, k, n) and the matching kv heads. ALiBi needs exactly slopes
  [h0, h1) of the H-head schedule (alibi_slopes_range), a distance table its
  rows [h0, h1). tp_attention() picks them; gather_heads() all-gathers the
  outputs along the head dimension.

* Sequence (context) parallelism: rank k holds a block of query positions and
  a block of key/value positions (global positions in the key coordinates:
  self-attention over L tokens puts both at sequence_range(L, k, n)).
  cp_attention() all-gathers the key/value blocks, runs attention_lse on each
  with the bias of the *global* positions (ALiBi and distance tables depend on
  q - k; causal masking across blocks) and merges the softmax states with the
  log-sum-exp. Forward only: the op's lse carries no gradient.

The calls are the same on one machine and on a cluster: only the
torch.distributed.init_process_group() arguments change (see docs/python.md).
"""
import torch
import torch.distributed as dist

from . import _checks
from .alibi import alibi_slopes_range
from .attention import attention, attention_lse

# ------------------------------------------------------------------ ranges


def split_range(n, rank, world_size):
    """[begin, end) of rank's share when n items are split as evenly as possible
    over world_size ranks (the first n % world_size ranks get one more)."""
    n = _checks.check_int("split_range: n", n, minimum=0)
    world_size = _checks.check_int("split_range: world_size", world_size, minimum=1)
    rank = _checks.check_int("split_range: rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"posbias: split_range: rank {rank} is not below world_size "
                         f"{world_size}")
    base, extra = divmod(n, world_size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def head_range(total_heads, rank, world_size):
    """The query heads [h0, h1) of a tensor-parallel rank."""
    return split_range(total_heads, rank, world_size)


def sequence_range(length, rank, world_size):
    """The positions [s0, s1) of a context-parallel rank."""
    return split_range(length, rank, world_size)


def _rank_world(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("posbias.parallel: torch.distributed is not initialised (call "
                           "torch.distributed.init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather_padded(t, dim, group):
    """all_gather of tensors whose size along `dim` differs between ranks (gloo
    needs equal sizes: pad to the largest, then cut)."""
    _, world = _rank_world(group)
    n = torch.tensor([t.shape[dim]], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    sizes = [int(s.item()) for s in sizes]
    m = max(sizes)
    if t.shape[dim] < m:
        pad_shape = list(t.shape)
        pad_shape[dim] = m - t.shape[dim]
        t = torch.cat([t, t.new_zeros(pad_shape)], dim=dim)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return [p.narrow(dim, 0, s) for p, s in zip(parts, sizes)]


# ------------------------------------------------------------------ heads


def tp_attention(q, k, v, *, total_heads, head_begin, bias="none", table=None, max_bias=None,
                 dense=None, scale=None, causal=False):
    """Attention of one tensor-parallel rank. q [b, h_local, i, d] holds the
    query heads [head_begin, head_begin + h_local) of total_heads; k, v the
    matching kv heads. bias="alibi": the slopes of those heads of the
    total_heads schedule (max_bias: the ggml form); bias="table": `table` is
    the full [total_heads, n] table (its rows are taken here) or already the
    local [h_local, n] rows; bias="dense": the local heads' dense bias.
    Returns the local [b, h_local, i, d]."""
    _checks.check_tensor("tp_attention: q", q, ndim=4)
    h_local = q.shape[1]
    total_heads = _checks.check_int("tp_attention: total_heads", total_heads, minimum=1)
    head_begin = _checks.check_int("tp_attention: head_begin", head_begin, minimum=0)
    if head_begin + h_local > total_heads:
        raise ValueError(f"posbias: tp_attention: heads [{head_begin}, {head_begin + h_local})"
                         f" are not within total_heads {total_heads}")
    if bias == "alibi":
        slopes = alibi_slopes_range(total_heads, head_begin, head_begin + h_local, max_bias)
        return attention(q, k, v, "alibi", slopes=slopes, scale=scale, causal=causal)
    if bias == "table":
        _checks.check_tensor("tp_attention: table", table, ndim=2)
        if table.shape[0] == total_heads and total_heads != h_local:
            table = table[head_begin:head_begin + h_local]
        return attention(q, k, v, "table", table=table, scale=scale, causal=causal)
    return attention(q, k, v, bias, dense=dense, scale=scale, causal=causal)


def gather_heads(out_local, group=None):
    """All-gathers the ranks' [b, h_k, i, d] outputs into [b, H, i, d] (rank
    order = head order; the head counts may differ between ranks)."""
    return torch.cat(_all_gather_padded(out_local, 1, group), dim=1)


# ------------------------------------------------------------------ sequence


def merge_partials(outs, lses):
    """Merges attention over disjoint key blocks: out_k [b, h, i, d] and
    lse_k [b, h, i] of each block -> (out, lse) of all keys together:
    lse = logsumexp_k lse_k, out = sum_k exp(lse_k - lse) out_k (rows that see
    no key anywhere: zeros, lse -inf). Computed in float32."""
    if not outs or len(outs) != len(lses):
        raise ValueError(f"posbias: merge_partials: needs as many outputs as lse tensors "
                         f"(at least one), got {len(outs)} and {len(lses)}")
    lse_all = torch.stack([x.to(torch.float32) for x in lses])          # [n, b, h, i]
    lse = torch.logsumexp(lse_all, dim=0)
    finite = torch.isfinite(lse)
    w = torch.exp(lse_all - torch.where(finite, lse, torch.zeros_like(lse)))
    w = torch.where(finite.unsqueeze(0), w, torch.zeros_like(w))
    out = sum(w_k.unsqueeze(-1) * o.to(torch.float32) for w_k, o in zip(w, outs))
    return out.to(outs[0].dtype), lse


def block_attention(q, k, v, *, q_start, k_start, total_keys, bias="none", slopes=None,
                    table=None, scale=None, causal=False):
    """Partial attention of a query block against one key block, with the bias
    of the global positions: the block's queries sit at q_start .. q_start+i-1
    and its keys at k_start .. k_start+j-1 (key coordinates; the full sequence
    has total_keys keys). bias "alibi" uses slopes [h] (-m |q - k|), "table" a
    global [h, >= 2 total_keys - 1] table read at (q - k) + (total_keys - 1).
    causal masks keys after the query. Returns (out, lse) for merge_partials."""
    b, h, i, d = q.shape
    j = k.shape[2]
    delta = (q_start - k_start) - (j - i)  # global q - k minus the block-local one
    empty = (torch.zeros(b, h, i, d, dtype=q.dtype),
             torch.full((b, h, i), float("-inf"), dtype=torch.float32))
    if j == 0 or i == 0:
        return empty
    last_q, last_k = q_start + i - 1, k_start + j - 1
    local_causal = False
    need_mask = False
    if causal:
        if k_start > last_q:
            return empty                      # every key is in every query's future
        if last_k > q_start:                  # some pair is masked
            if delta == 0:
                local_causal = True           # the block's own bottom-right mask is exact
            else:
                need_mask = True
    if bias == "alibi" and delta == 0 and not need_mask:
        return attention_lse(q, k, v, "alibi", slopes=slopes, scale=scale, causal=local_causal)
    if bias == "none" and not need_mask:
        return attention_lse(q, k, v, "none", scale=scale, causal=local_causal)
    if not need_mask and i <= j:
        # A local [h, 2j - 1] table: local entry e is global distance e - (j-1) + delta.
        dist_g = torch.arange(2 * j - 1, dtype=torch.int64) - (j - 1) + delta
        return attention_lse(q, k, v, "table", table=_global_table(bias, slopes, table,
                                                                     total_keys, dist_g),
                             scale=scale, causal=local_causal)
    # General block (a partial causal mask off the block diagonal, or i > j): dense.
    qpos = torch.arange(q_start, q_start + i, dtype=torch.int64)
    kpos = torch.arange(k_start, k_start + j, dtype=torch.int64)
    dist_g = qpos[:, None] - kpos[None, :]                               # [i, j]
    if bias == "none":
        dense = torch.zeros(1, 1, i, j, dtype=torch.float32)
    else:
        dense = _global_table(bias, slopes, table, total_keys,
                              dist_g.reshape(-1)).reshape(h, i, j)[None]
    if causal:
        dense = dense.masked_fill(dist_g < 0, float("-inf"))
    return attention_lse(q, k, v, "dense", dense=dense, scale=scale, causal=False)


def _global_table(bias, slopes, table, total_keys, dist_g):
    """Bias values [h, len(dist_g)] at the given global distances q - k."""
    if bias == "alibi":
        return -slopes.to(torch.float32)[:, None] * dist_g.abs().to(torch.float32)[None]
    if bias == "table":
        idx = (dist_g + (total_keys - 1)).clamp(0, table.shape[1] - 1)  # unread when clamped
        return table.index_select(1, idx)
    raise ValueError(f"posbias: cp_attention: unsupported bias {bias!r} (use none, alibi or "
                     f"table)")


def cp_attention(q, k, v, *, q_start, k_start, total_keys, bias="none", slopes=None,
                 table=None, scale=None, causal=False, group=None):
    """Context-parallel attention of this rank's query block. q [b, h, i, d] at
    global positions q_start..q_start+i-1; k, v [b, hk, j, d] this rank's key
    block at k_start..k_start+j-1 (the blocks of all ranks tile 0..total_keys-1
    in any order; sizes may differ). The key/value blocks are all-gathered,
    each is attended with the global positions' bias, and the softmax states
    are merged. bias: "none", "alibi" (slopes [h]) or "table" (the global
    [h, >= 2 total_keys - 1] distance table). Returns this rank's
    [b, h, i, d], equal (to float32 rounding) to rows q_start.. of one-process
    attention over all keys. Forward only."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(f"cp_attention: {name}", t, dtypes=_checks.FLOAT_DTYPES, ndim=4)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k, v, table)):
        raise RuntimeError("posbias: cp_attention is forward-only (the lse merge carries no "
                           "gradient); run it under torch.no_grad()")
    if bias not in ("none", "alibi", "table"):
        raise ValueError(f"posbias: cp_attention: bias must be none, alibi or table, got "
                         f"{bias!r}")
    if bias == "alibi":
        _checks.check_slopes("cp_attention: slopes", slopes, heads=q.shape[1])
    if bias == "table":
        _checks.check_tensor("cp_attention: table", table, ndim=2)
        if table.shape[0] != q.shape[1] or table.shape[1] < 2 * total_keys - 1:
            raise ValueError(f"posbias: cp_attention: table {_checks.shape_str(table)} must "
                             f"be [h, >= 2 total_keys - 1] = [{q.shape[1]}, "
                             f">= {2 * total_keys - 1}]")
    ks = _all_gather_padded(k, 2, group)
    vs = _all_gather_padded(v, 2, group)
    _, world = _rank_world(group)
    starts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(starts, torch.tensor([int(k_start)], dtype=torch.int64), group=group)
    outs, lses = [], []
    for kb, vb, s in zip(ks, vs, starts):
        o, l = block_attention(q, kb, vb, q_start=q_start, k_start=int(s.item()),
                               total_keys=total_keys, bias=bias, slopes=slopes, table=table,
                               scale=scale, causal=causal)
        outs.append(o)
        lses.append(l)
    return merge_partials(outs, lses)[0]
