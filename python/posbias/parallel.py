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
  ring_attention() takes the same arguments and has a backward: the blocks
  travel around a ring of ranks (each holds one at a time), and gradients
  of q, k, v, slopes and table equal a one-process run's.

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


def _block_masked(i, j, q_start, k_start, causal):
    """True when a block of i queries at q_start.. against j keys at k_start..
    has nothing to attend (empty, or every key in every query's future)."""
    return i == 0 or j == 0 or (causal and k_start > q_start + i - 1)


def _bias_tensors(bias, slopes, table):
    return (slopes if bias == "alibi" else None), (table if bias == "table" else None)


def block_attention(q, k, v, *, q_start, k_start, total_keys, bias="none", slopes=None,
                    table=None, scale=None, causal=False):
    """Partial attention of a query block against one key block, with the bias
    of the global positions: the block's queries sit at q_start .. q_start+i-1
    and its keys at k_start .. k_start+j-1 (key coordinates; the full sequence
    has total_keys keys). bias "alibi" uses slopes [h] (-m |q - k|), "table" a
    global [h, >= 2 total_keys - 1] table read at (q - k) from its centre.
    causal masks keys after the query. One op call with q_offset = q_start -
    k_start (the global q - k of the block's first pair), so the bias and the
    causal mask are the global ones with nothing materialised. Returns (out,
    lse) for merge_partials."""
    b, h, i, d = q.shape
    if _block_masked(i, k.shape[2], q_start, k_start, causal):
        return (torch.zeros(b, h, i, d, dtype=q.dtype),
                torch.full((b, h, i), float("-inf"), dtype=torch.float32))
    sl, tb = _bias_tensors(bias, slopes, table)
    return attention_lse(q, k, v, bias, slopes=sl, table=tb, scale=scale, causal=causal,
                         q_offset=int(q_start) - int(k_start))


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


# ------------------------------------------------------------------ ring


def _global_rank(group, r):
    if group is None:
        return r
    return dist.distributed_c10d._get_global_rank(group, r)  # torch 1.13 and 2.x


def _ring_pass(tensors, recv_like, group):
    """Sends `tensors` to the next rank of the ring and returns the ones received
    from the previous rank (shapes and dtypes of `recv_like`)."""
    rank, world = _rank_world(group)
    nxt, prv = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
    received = [torch.empty_like(t) for t in recv_like]
    reqs = [dist.isend(t.contiguous(), nxt, group=group) for t in tensors]
    reqs += [dist.irecv(t, prv, group=group) for t in received]
    for req in reqs:
        req.wait()
    return received


def _block_shape(t, j):
    shape = list(t.shape)
    shape[2] = j
    return torch.empty(shape, dtype=t.dtype)


class _RingAttention(torch.autograd.Function):
    """Forward: each rank attends its queries to the key/value block it holds,
    passes the block to the next rank and receives the previous rank's,
    world_size times, merging the softmax states (log-sum-exp). Backward: the
    same ring; each held block's share of dq, dk, dv and of the slopes' or
    table's gradient is the op attention_options_backward at the block's
    global offset with the merged out and lse; dk and dv travel with their
    block and are home after world_size passes."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, table, cfg):
        rank, world = _rank_world(cfg["group"])
        info = torch.tensor([k.shape[2], cfg["k_start"]], dtype=torch.int64)
        infos = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(infos, info, group=cfg["group"])
        blocks = [(int(x[0]), int(x[1])) for x in infos]  # (j, k_start) of each rank
        held_k, held_v = k.detach(), v.detach()
        out = lse = None
        for step in range(world):
            j, k_start = blocks[(rank - step) % world]
            o, l = block_attention(q.detach(), held_k, held_v, q_start=cfg["q_start"],
                                   k_start=k_start, total_keys=cfg["total_keys"],
                                   bias=cfg["bias"], slopes=slopes, table=table,
                                   scale=cfg["scale"], causal=cfg["causal"])
            out, lse = (o, l) if out is None else merge_partials([out, o], [lse, l])
            if step + 1 < world:
                jn = blocks[(rank - step - 1) % world][0]
                held_k, held_v = _ring_pass([held_k, held_v], [_block_shape(k, jn),
                                                               _block_shape(v, jn)], cfg["group"])
        ctx.save_for_backward(q, k, v, slopes, table, out, lse)
        ctx.cfg, ctx.blocks = cfg, blocks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, table, out, lse = ctx.saved_tensors
        cfg, blocks = ctx.cfg, ctx.blocks
        rank, world = _rank_world(cfg["group"])
        sl, tb = _bias_tensors(cfg["bias"], slopes, table)
        grad_out = grad_out.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32)
        gsum = [None if t is None else torch.zeros(t.shape, dtype=torch.float32)
                for t in (sl, tb)]
        held = [k.detach(), v.detach(), torch.zeros(k.shape, dtype=torch.float32),
                torch.zeros(v.shape, dtype=torch.float32)]
        for step in range(world):
            j, k_start = blocks[(rank - step) % world]
            if not _block_masked(q.shape[2], j, cfg["q_start"], k_start, cfg["causal"]):
                # The block's share with the merged out and lse (FlashAttention-2's
                # recomputation), at the block's global offset.
                g = torch.ops.posbias.attention_options_backward(
                    q.detach(), held[0], held[1], None if sl is None else sl.detach(),
                    None if tb is None else tb.detach(), None, cfg["scale"], cfg["causal"],
                    int(cfg["q_start"]) - int(k_start), -1, -1, 0.0, None, out, lse, grad_out)
                dq += g[0]
                held[2] += g[1]
                held[3] += g[2]
                for acc, gt in zip(gsum, (g[3], g[4])):
                    if acc is not None:
                        acc += gt.view(acc.shape)
            jn = blocks[(rank - step - 1) % world][0]
            held = _ring_pass(held, [_block_shape(k, jn), _block_shape(v, jn),
                                     _block_shape(held[2], jn), _block_shape(held[3], jn)],
                              cfg["group"])
        # After world_size passes every block (with its dk, dv) is back home.
        gslopes = None if gsum[0] is None or not slopes.requires_grad else gsum[0].to(slopes.dtype)
        gtable = None if gsum[1] is None or not table.requires_grad else gsum[1].to(table.dtype)
        return (dq.to(q.dtype), held[2].to(k.dtype), held[3].to(v.dtype), gslopes, gtable, None)


def ring_attention(q, k, v, *, q_start, k_start, total_keys, bias="none", slopes=None,
                   table=None, scale=None, causal=False, group=None):
    """Context-parallel attention with a backward (ring attention): the
    arguments and the result of cp_attention(), but the key/value blocks are
    passed around the ring of ranks (send to rank + 1, receive from rank - 1;
    one block in flight per rank, never all of them), and the result is
    differentiable: q, k, v, slopes and table get the gradients a
    one-process posbias.attention over all keys would give them (each rank
    its shard's; slopes and table gradients are this rank's queries' share:
    all-reduce them (sum) to get the full gradient, as data-parallel training
    does for any parameter). Every rank of the group must call it, with the
    same bias, causal, scale and total_keys."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(f"ring_attention: {name}", t, dtypes=_checks.FLOAT_DTYPES, ndim=4)
    if bias not in ("none", "alibi", "table"):
        raise ValueError(f"posbias: ring_attention: bias must be none, alibi or table, got "
                         f"{bias!r}")
    if bias == "alibi":
        _checks.check_slopes("ring_attention: slopes", slopes, heads=q.shape[1])
    elif slopes is not None:
        raise ValueError(f"posbias: ring_attention: bias={bias!r} takes no slopes")
    if bias == "table":
        _checks.check_tensor("ring_attention: table", table, ndim=2)
        if table.shape[0] != q.shape[1] or table.shape[1] < 2 * total_keys - 1:
            raise ValueError(f"posbias: ring_attention: table {_checks.shape_str(table)} must "
                             f"be [h, >= 2 total_keys - 1] = [{q.shape[1]}, "
                             f">= {2 * total_keys - 1}]")
    elif table is not None:
        raise ValueError(f"posbias: ring_attention: bias={bias!r} takes no table")
    cfg = dict(q_start=_checks.check_int("ring_attention: q_start", q_start),
               k_start=_checks.check_int("ring_attention: k_start", k_start, minimum=0),
               total_keys=_checks.check_int("ring_attention: total_keys", total_keys, minimum=1),
               bias=bias, scale=_checks.check_float("ring_attention: scale", scale),
               causal=causal, group=group)
    return _RingAttention.apply(q, k, v, slopes, table, cfg)
