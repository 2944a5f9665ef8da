"""posbias.attention's options (q_offset, window, softcap, key_mask),
posbias.attention_varlen and posbias.attention_with_kvcache against a naive
float64 reference written here from the contract (include/posbias/attention.h):
rel = q_pos - k_pos; score = softcap ? cap tanh(scale q.k / cap) : scale q.k;
plus -slope |rel| or table[h][rel + (n - 1) / 2]; key visible iff (causal:
rel >= 0), (left >= 0: rel <= left), (right >= 0: -rel <= right), mask; a row
that sees no key outputs zeros. Gradients of q, k, v, slopes and table against
float64 autograd of that reference."""
import itertools

import pytest
import torch

import posbias

TABLE_N = 41


def ref_one(q, k, v, scale, causal, q_offset, window, softcap, slopes=None, table=None,
            mask=None):
    """One sequence: q [h, i, d], k, v [hk, j, d] (float64) -> out [h, i, d], lse [h, i]."""
    h, i, _ = q.shape
    hk, j, _ = k.shape
    k = k.repeat_interleave(h // hk, 0)
    v = v.repeat_interleave(h // hk, 0)
    s = scale * q @ k.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    rel = (q_offset + torch.arange(i))[:, None] - torch.arange(j)[None, :]
    if slopes is not None:
        s = s - slopes.to(torch.float64)[:, None, None] * rel.abs().to(torch.float64)
    if table is not None:
        n = table.shape[1]
        s = s + table.to(torch.float64)[:, (rel + (n - 1) // 2).clamp(0, n - 1)]
    vis = torch.ones(i, j, dtype=torch.bool)
    if causal:
        vis &= rel >= 0
    if window[0] >= 0:
        vis &= rel <= window[0]
    if window[1] >= 0:
        vis &= -rel <= window[1]
    if mask is not None:
        vis &= mask.bool()[None, :]
    vis = vis.expand(h, i, j)
    any_vis = vis.any(-1, keepdim=True)
    s2 = torch.where(any_vis, torch.where(vis, s, torch.tensor(float("-inf"), dtype=s.dtype)),
                     torch.zeros_like(s))
    p = torch.softmax(s2, -1) * vis
    lse = torch.where(any_vis[..., 0], torch.logsumexp(s2, -1),
                      torch.tensor(float("-inf"), dtype=s.dtype))
    return p @ v, lse


def leaf(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype).requires_grad_()


def close(a, b, tol=2e-4):
    b = b.to(a.dtype)
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol * (1 + b.abs().max().item() if b.numel() else 1), err


def check_grads(ours, refs, tol=3e-4):
    for name, (a, b) in zip(("q", "k", "v", "bias"), zip(ours, refs)):
        assert a is not None and b is not None, name
        close(a, b, tol)


def make_bias(kind, b, h):
    if kind == "alibi":
        return {"slopes": (posbias.alibi_slopes(h) * 4).requires_grad_()}
    if kind == "alibi_bh":
        return {"slopes": (torch.rand(b, h) * 0.5 + 0.05).requires_grad_()}
    if kind == "table":
        return {"table": leaf(h, TABLE_N, scale=0.5)}
    return {}


OPTION_CASES = list(itertools.product(
    [False, True], [(-1, -1), (2, 1), (3, -1), (0, 0)], [0.0, 3.0], [None, 4, -2]))


@pytest.mark.parametrize("bias", ["none", "alibi", "alibi_bh", "table"])
@pytest.mark.parametrize("causal,window,softcap,q_offset", OPTION_CASES)
def test_attention_options(bias, causal, window, softcap, q_offset):
    torch.manual_seed(hash((bias, causal, window, softcap, q_offset)) % 1000)
    b, h, hk, i, j, d = 2, 4, 2, 5, 7, 8
    q, k, v = leaf(b, h, i, d), leaf(b, hk, j, d), leaf(b, hk, j, d)
    mask = torch.rand(b, j) > 0.3
    mask[1, :] = False if q_offset == -2 else mask[1, :]  # a sequence with every key masked
    bias_t = make_bias(bias, b, h)
    kw = dict(causal=causal, window=window, softcap=softcap, q_offset=q_offset, key_mask=mask)
    out = posbias.attention(q, k, v, **bias_t, **kw)
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, [q, k, v] + list(bias_t.values()), go)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    bias64 = {n: t.detach().double().requires_grad_() for n, t in bias_t.items()}
    outs = []
    for s in range(b):
        sl = bias64.get("slopes")
        if sl is not None and sl.dim() == 2:
            sl = sl[s]
        off = j - i if q_offset is None else q_offset
        outs.append(ref_one(q64[s], k64[s], v64[s], d ** -0.5, causal, off, window, softcap,
                            slopes=sl, table=bias64.get("table"), mask=mask[s])[0])
    ref = torch.stack(outs)
    close(out, ref)
    refs = torch.autograd.grad(ref, [q64, k64, v64] + list(bias64.values()), go.double())
    check_grads(grads, refs)


def test_attention_options_uint8_mask_and_defaults():
    torch.manual_seed(1)
    q, k, v = leaf(1, 2, 3, 4), leaf(1, 2, 6, 4), leaf(1, 2, 6, 4)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]], dtype=torch.uint8)
    a = posbias.attention(q, k, v, key_mask=mask)
    b = posbias.attention(q, k, v, key_mask=mask.bool())
    assert torch.equal(a, b)
    # all-ones mask, window (-1, -1), softcap 0 and q_offset j - i are the plain call
    full = posbias.attention(q, k, v, key_mask=torch.ones(1, 6, dtype=torch.bool), q_offset=3)
    close(full, posbias.attention(q, k, v), 1e-6)


VARLEN = [([3, 0, 5], [2, 2, 6]), ([1, 4], [4, 4]), ([2], [0])]


@pytest.mark.parametrize("lens_q,lens_k", VARLEN)
@pytest.mark.parametrize("bias", ["none", "alibi", "alibi_bh", "table"])
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (True, (2, -1), 0.0), (False, (1, 2), 2.5)])
def test_attention_varlen(lens_q, lens_k, bias, causal, window, softcap):
    torch.manual_seed(len(lens_q) * 7 + int(causal))
    h, hk, d = 4, 2, 8
    b = len(lens_q)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    q, k, v = leaf(sum(lens_q), h, d), leaf(sum(lens_k), hk, d), leaf(sum(lens_k), hk, d)
    bias_t = make_bias(bias, b, h)
    out, lse = posbias.attention_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=bias_t.get("slopes"), distance_table=bias_t.get("table"),
        return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (h, sum(lens_q)) and lse.dtype == torch.float32
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, [q, k, v] + list(bias_t.values()), go)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    bias64 = {n: t.detach().double().requires_grad_() for n, t in bias_t.items()}
    outs, lses = [], []
    for s in range(b):
        qs = q64[cu_q[s]:cu_q[s + 1]].transpose(0, 1)
        ks = k64[cu_k[s]:cu_k[s + 1]].transpose(0, 1)
        vs = v64[cu_k[s]:cu_k[s + 1]].transpose(0, 1)
        sl = bias64.get("slopes")
        if sl is not None and sl.dim() == 2:
            sl = sl[s]
        o, ls = ref_one(qs, ks, vs, d ** -0.5, causal, lens_k[s] - lens_q[s], window, softcap,
                        slopes=sl, table=bias64.get("table"))
        outs.append(o.transpose(0, 1))
        lses.append(ls)
    ref = torch.cat(outs)
    ref_lse = torch.cat(lses, 1)
    close(out, ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    close(lse[fin], ref_lse[fin])
    if ref.requires_grad:
        refs = torch.autograd.grad(ref, [q64, k64, v64] + list(bias64.values()), go.double(),
                                   allow_unused=True)
        refs = [torch.zeros_like(t) if g is None else g
                for g, t in zip(refs, [q64, k64, v64] + list(bias64.values()))]
        check_grads(grads, refs)
    assert posbias.attention_varlen(q, k, v, cu_q, cu_k, 1, 1, causal=causal,
                                    window_size=window, softcap=softcap,
                                    alibi_slopes=bias_t.get("slopes"),
                                    distance_table=bias_t.get("table")).shape == q.shape


def paged_cache(b, max_blocks, block_size, hk, d, dtype=torch.float32):
    num_blocks = b * max_blocks + 1
    k_cache = torch.randn(num_blocks, block_size, hk, d).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, d).to(dtype)
    block_table = torch.randperm(num_blocks)[:b * max_blocks].view(b, max_blocks).to(torch.int32)
    return k_cache, v_cache, block_table


def contiguous_keys(cache, block_table, s, n):
    """[n, hk, d] keys 0 .. n - 1 of sequence s (paged, or slab s without a table)."""
    if block_table is None:
        return cache[s, :n]
    bs = cache.shape[1]
    rows = [cache[block_table[s, c // bs], c % bs] for c in range(n)]
    return torch.stack(rows) if rows else cache[0, :0]


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("append", [0, 2])
@pytest.mark.parametrize("bias", ["none", "alibi", "alibi_bh", "table"])
@pytest.mark.parametrize("causal,window,softcap", [(True, (-1, -1), 0.0), (False, (-1, -1), 0.0),
                                                   (True, (3, -1), 4.0)])
def test_attention_with_kvcache(paged, append, bias, causal, window, softcap):
    torch.manual_seed(3 + append)
    b, h, hk, d, block_size, max_blocks, i = 2, 4, 2, 8, 4, 4, 2
    if paged:
        k_cache, v_cache, block_table = paged_cache(b, max_blocks, block_size, hk, d)
    else:
        k_cache = torch.randn(b, max_blocks * block_size, hk, d)
        v_cache = torch.randn(b, max_blocks * block_size, hk, d)
        block_table = None
    seqlens = torch.tensor([5, 9], dtype=torch.int32)
    q = torch.randn(b, i, h, d)
    kn = torch.randn(b, append, hk, d) if append else None
    vn = torch.randn(b, append, hk, d) if append else None
    bias_t = {n: t.detach() for n, t in make_bias(bias, b, h).items()}
    before_k = k_cache.clone()
    out = posbias.attention_with_kvcache(
        q, k_cache, v_cache, seqlens, block_table=block_table, k=kn, v=vn, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=bias_t.get("slopes"),
        distance_table=bias_t.get("table"))
    assert out.shape == q.shape
    assert torch.equal(seqlens, torch.tensor([5, 9], dtype=torch.int32))  # not changed
    refs = []
    for s in range(b):
        j = int(seqlens[s]) + append
        ks = contiguous_keys(k_cache, block_table, s, j)
        vs = contiguous_keys(v_cache, block_table, s, j)
        assert torch.equal(ks[:int(seqlens[s])], contiguous_keys(before_k, block_table, s,
                                                                 int(seqlens[s])))
        if append:
            assert torch.equal(ks[int(seqlens[s]):], kn[s])
            assert torch.equal(vs[int(seqlens[s]):], vn[s])
        sl = bias_t.get("slopes")
        if sl is not None and sl.dim() == 2:
            sl = sl[s]
        ref, ref_lse = ref_one(q[s].transpose(0, 1).double(), ks.transpose(0, 1).double(),
                               vs.transpose(0, 1).double(), d ** -0.5, causal, j - i, window,
                               softcap, slopes=sl, table=bias_t.get("table"))
        close(out[s], ref.transpose(0, 1))
        refs.append(ref_lse)
    # The same call with the lse (the keys appended above now in the cache):
    # out the same bits, lse [b, h, i] the reference's.
    out2, lse = posbias.attention_with_kvcache(
        q, k_cache, v_cache, seqlens + append, block_table=block_table, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=bias_t.get("slopes"),
        distance_table=bias_t.get("table"), return_softmax_lse=True)
    assert torch.equal(out2, out)
    assert lse.shape == (b, h, i) and lse.dtype == torch.float32
    ref_lse = torch.stack(refs)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    close(lse[fin], ref_lse[fin])


def test_kvcache_bfloat16_cache_with_float32_queries():
    torch.manual_seed(5)
    k_cache, v_cache, block_table = paged_cache(1, 3, 4, 2, 8, torch.bfloat16)
    seqlens = torch.tensor([10], dtype=torch.int32)
    q = torch.randn(1, 1, 2, 8)
    out = posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table, causal=True)
    ks = contiguous_keys(k_cache, block_table, 0, 10).double().transpose(0, 1)
    vs = contiguous_keys(v_cache, block_table, 0, 10).double().transpose(0, 1)
    ref, _ = ref_one(q[0].transpose(0, 1).double(), ks, vs, 8 ** -0.5, True, 9, (-1, -1), 0.0)
    close(out[0], ref.transpose(0, 1))


@pytest.mark.parametrize("paged", [True, False])
def test_kvcache_lse_merges_a_split_of_the_keys(paged):
    """Each sequence's keys split in two caches (a prefix, the rest), each
    attended with return_softmax_lse, merged as the lse says (logaddexp of
    the two, each out weighted by exp(lse_part - lse)): the attention over all
    the keys. Without a position bias and not causal, a query scores every
    key the same in either call."""
    torch.manual_seed(11)
    b, h, hk, d, bs = 3, 4, 2, 16, 4
    lens = [9, 1, 14]
    prefix = [4, 0, 8]  # the second sequence's prefix is empty: lse -inf there
    q = torch.randn(b, 1, h, d)
    keys = [torch.randn(n, hk, d) for n in lens]
    vals = [torch.randn(n, hk, d) for n in lens]

    def cache_of(parts):
        seqlens = torch.tensor([p.shape[0] for p in parts[0]], dtype=torch.int32)
        if not paged:
            n = max(int(seqlens.max()), 1)
            kc, vc = torch.zeros(b, n, hk, d), torch.zeros(b, n, hk, d)
            for s in range(b):
                kc[s, :parts[0][s].shape[0]] = parts[0][s]
                vc[s, :parts[1][s].shape[0]] = parts[1][s]
            return kc, vc, seqlens, None
        max_blocks = max((int(n) + bs - 1) // bs for n in seqlens)
        kc, vc, table = paged_cache(b, max(max_blocks, 1), bs, hk, d)
        for s in range(b):
            for c in range(int(seqlens[s])):
                kc[table[s, c // bs], c % bs] = parts[0][s][c]
                vc[table[s, c // bs], c % bs] = parts[1][s][c]
        return kc, vc, seqlens, table

    whole = cache_of((keys, vals))
    first = cache_of(([k[:n] for k, n in zip(keys, prefix)], [v[:n] for v, n in zip(vals, prefix)]))
    rest = cache_of(([k[n:] for k, n in zip(keys, prefix)], [v[n:] for v, n in zip(vals, prefix)]))
    want, want_lse = posbias.attention_with_kvcache(q, *whole[:3], block_table=whole[3],
                                                    return_softmax_lse=True)
    o1, l1 = posbias.attention_with_kvcache(q, *first[:3], block_table=first[3],
                                            return_softmax_lse=True)
    o2, l2 = posbias.attention_with_kvcache(q, *rest[:3], block_table=rest[3],
                                            return_softmax_lse=True)
    assert torch.isinf(l1[1]).all() and (l1[1] < 0).all()
    lse = torch.logaddexp(l1, l2)
    w1 = torch.exp(l1 - lse).transpose(1, 2).unsqueeze(-1)  # [b, i, h, 1]
    w2 = torch.exp(l2 - lse).transpose(1, 2).unsqueeze(-1)
    close(lse, want_lse)
    close(o1 * w1 + o2 * w2, want)


@pytest.mark.parametrize("append", [0, 2])
def test_kvcache_cache_batch_idx_reads_and_writes_its_slabs(append):
    """cache_batch_idx (flash_attn_with_kvcache's): sequence s uses slab
    cache_batch_idx[s] of a cache with more slabs than sequences; the result
    is the call on those slabs gathered in order, and an append writes only
    the indexed slabs."""
    torch.manual_seed(13)
    slabs, b, max_len, h, hk, d, i = 5, 3, 12, 4, 2, 8, 2
    k_cache, v_cache = torch.randn(slabs, max_len, hk, d), torch.randn(slabs, max_len, hk, d)
    idx = torch.tensor([3, 0, 4], dtype=torch.int32)
    seqlens = torch.tensor([6, 1, 9], dtype=torch.int32)
    q = torch.randn(b, i, h, d)
    kn = torch.randn(b, append, hk, d) if append else None
    vn = torch.randn(b, append, hk, d) if append else None
    k_want, v_want = k_cache[idx.long()].clone(), v_cache[idx.long()].clone()
    untouched = [1, 2]
    k_before = k_cache.clone()
    slopes = posbias.alibi_slopes(h)
    out, lse = posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=kn, v=vn,
                                              causal=True, alibi_slopes=slopes,
                                              return_softmax_lse=True, cache_batch_idx=idx)
    want, want_lse = posbias.attention_with_kvcache(q, k_want, v_want, seqlens, k=kn, v=vn,
                                                    causal=True, alibi_slopes=slopes,
                                                    return_softmax_lse=True)
    close(out, want)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))  # a row before key 0: -inf
    fin = torch.isfinite(want_lse)
    close(lse[fin], want_lse[fin])
    assert torch.equal(k_cache[idx.long()], k_want) and torch.equal(v_cache[idx.long()], v_want)
    assert torch.equal(k_cache[untouched], k_before[untouched])


def test_kvcache_one_int_length_for_every_sequence():
    torch.manual_seed(17)
    k_cache, v_cache, block_table = paged_cache(2, 3, 4, 2, 8)
    q = torch.randn(2, 1, 4, 8)
    got = posbias.attention_with_kvcache(q, k_cache, v_cache, 9, block_table, causal=True)
    want = posbias.attention_with_kvcache(q, k_cache, v_cache,
                                          torch.tensor([9, 9], dtype=torch.int32), block_table,
                                          causal=True)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="-1"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, -1, block_table)


def test_kvcache_cache_batch_idx_errors():
    k_cache, v_cache = torch.randn(4, 8, 2, 8), torch.randn(4, 8, 2, 8)
    q = torch.randn(2, 1, 4, 8)
    seqlens = torch.tensor([3, 5], dtype=torch.int32)

    def call(idx, **kw):
        return posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, cache_batch_idx=idx,
                                              **kw)
    with pytest.raises(TypeError, match="cache_batch_idx must be int32"):
        call(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"cache_batch_idx must be \[b\] = \[2\], got \[3\]"):
        call(torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] = 4 is outside \[0, 4\)"):
        call(torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_batch_idx\[0\] = -1"):
        call(torch.tensor([-1, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="give it or block_table, not both"):
        call(torch.tensor([0, 1], dtype=torch.int32),
             block_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="repeats a slab"):
        call(torch.tensor([2, 2], dtype=torch.int32), k=torch.randn(2, 1, 2, 8),
             v=torch.randn(2, 1, 2, 8))
    # Reading one slab for two sequences is allowed: each reads its own length of it.
    out = call(torch.tensor([2, 2], dtype=torch.int32))
    for s in range(2):
        alone = posbias.attention_with_kvcache(q[s:s + 1], k_cache[2:3], v_cache[2:3],
                                               seqlens[s:s + 1])
        close(out[s:s + 1], alone)


def test_empty_gives_huge_page_aligned_caches_that_attention_reads():
    """posbias.empty: the core's storage, 2 MiB aligned from 4 MiB up, usable
    as a KV cache like any torch tensor; it lives as long as the tensor."""
    k_cache = posbias.empty(512, 16, 4, 128, dtype=torch.bfloat16)  # 8 MiB
    v_cache = posbias.empty((512, 16, 4, 128), dtype=torch.bfloat16)
    assert k_cache.shape == (512, 16, 4, 128) and k_cache.dtype == torch.bfloat16
    assert k_cache.data_ptr() % (2 << 20) == 0 and v_cache.data_ptr() % (2 << 20) == 0
    small = posbias.empty(3, 5)
    assert small.dtype == torch.float32 and small.data_ptr() % 64 == 0
    assert posbias.empty(0, 4).shape == (0, 4)
    assert posbias.empty(2, dtype=torch.float64).dtype == torch.float64
    torch.manual_seed(2)
    k_ref = torch.randn(512, 16, 4, 128).bfloat16()
    v_ref = torch.randn(512, 16, 4, 128).bfloat16()
    k_cache.copy_(k_ref)
    v_cache.copy_(v_ref)
    table = torch.arange(512, dtype=torch.int32).reshape(2, 256)
    seqlens = torch.tensor([3000, 4095], dtype=torch.int32)
    q = torch.randn(2, 1, 8, 128)
    out = posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, table, causal=True)
    want = posbias.attention_with_kvcache(q, k_ref, v_ref, seqlens, table, causal=True)
    assert torch.equal(out, want)
    view = k_cache[1:3]
    del k_cache
    assert torch.equal(view, k_ref[1:3])  # the storage outlives the first handle


def test_empty_errors():
    with pytest.raises(TypeError, match="dtype must be float32, bfloat16, float16 or float64"):
        posbias.empty(2, 3, dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        posbias.empty(2, 3, dtype="float32")
    with pytest.raises(TypeError, match=r"size\[1\] must be an int, got float 2.5"):
        posbias.empty(2, 2.5)
    with pytest.raises(ValueError, match="-4"):
        posbias.empty(2, -4)
    with pytest.raises(ValueError, match="memory|too large|overflow"):
        posbias.empty(1 << 40, 1 << 30)


# ---------------------------------------------------------------- errors


def varlen_inputs():
    q = torch.randn(5, 2, 4)
    k = torch.randn(6, 2, 4)
    return q, k, k.clone()


def test_varlen_errors():
    q, k, v = varlen_inputs()
    good = torch.tensor([0, 2, 5], dtype=torch.int32)
    good_k = torch.tensor([0, 3, 6], dtype=torch.int32)
    for bad in ([1, 2, 5], [0, 3, 2], [0, 2, 4]):
        with pytest.raises(ValueError, match="cu_seqlens"):
            posbias.attention_varlen(q, k, v, torch.tensor(bad, dtype=torch.int32), good_k, 3, 3)
    with pytest.raises(ValueError, match="cu_seqlens"):
        posbias.attention_varlen(q, k, v, good, torch.tensor([0, 6], dtype=torch.int32), 3, 6)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        posbias.attention_varlen(q, k, v, good.long(), good_k, 3, 3)
    with pytest.raises(ValueError, match="dropout_p"):
        posbias.attention_varlen(q, k, v, good, good_k, 3, 3, dropout_p=0.1)
    with pytest.raises(TypeError, match="float32, bfloat16, float16 or float64"):
        posbias.attention_varlen(q.int(), k.int(), v.int(), good, good_k, 3, 3)
    with pytest.raises(TypeError, match="window"):
        posbias.attention_varlen(q, k, v, good, good_k, 3, 3, window_size=(1.5, 2))
    with pytest.raises(ValueError, match="window"):
        posbias.attention_varlen(q, k, v, good, good_k, 3, 3, window_size=(-2, 2))
    with pytest.raises(ValueError, match="softcap"):
        posbias.attention_varlen(q, k, v, good, good_k, 3, 3, softcap=-1.0)


def test_kvcache_errors():
    k_cache, v_cache, block_table = paged_cache(2, 2, 4, 2, 8)
    q = torch.randn(2, 1, 2, 8)
    seqlens = torch.tensor([3, 8], dtype=torch.int32)
    bad_table = block_table.clone()
    bad_table[1, 1] = 99
    with pytest.raises(ValueError, match="99"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, bad_table)
    with pytest.raises(ValueError, match="cache_seqlens"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, torch.tensor([3, 9], dtype=torch.int32),
                                       block_table)
    with pytest.raises(TypeError, match="block_table must be int32"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table.long())
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens.long(), block_table)
    with pytest.raises(ValueError):  # append past the cache's end
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table,
                                       k=torch.randn(2, 1, 2, 8), v=torch.randn(2, 1, 2, 8))
    with pytest.raises(ValueError, match="both k and v"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table,
                                       k=torch.randn(2, 1, 2, 8))
    with pytest.raises(TypeError, match="return_softmax_lse must be a bool"):
        posbias.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table,
                                       return_softmax_lse=1)


def test_attention_option_errors():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    with pytest.raises(TypeError, match="key_mask must be bool or uint8"):
        posbias.attention(q, k, v, key_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="key_mask"):
        posbias.attention(q, k, v, key_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="window"):
        posbias.attention(q, k, v, window=(-3, 1))
    with pytest.raises(ValueError, match="softcap"):
        posbias.attention(q, k, v, softcap=float("inf"))
    with pytest.raises(TypeError, match="q_offset"):
        posbias.attention(q, k, v, q_offset=1.5)


def test_ops_differentiate_themselves():
    """The forward ops carry their own autograd (C++ Functions): calling
    torch.ops.posbias.* directly, with no Python wrapper, gives gradients in the
    inputs' dtypes and shapes equal to the float64 reference's."""
    torch.manual_seed(7)
    h, hk, d, i, j = 4, 2, 8, 5, 9
    q, k, v = leaf(1, h, i, d), leaf(1, hk, j, d), leaf(1, hk, j, d)
    slopes = (torch.rand(1, h) * 0.5 + 0.05).requires_grad_()  # per sequence [b, h]
    out, lse = torch.ops.posbias.attention_options_forward(
        q, k, v, slopes, None, None, None, True, None, 3, -1, 2.0, None)
    assert out.grad_fn is not None and not lse.requires_grad
    go = torch.randn_like(out)
    out.backward(go)
    ref_in = [t.detach().double().requires_grad_() for t in (q[0], k[0], v[0], slopes[0])]
    ref, _ = ref_one(*ref_in[:3], d ** -0.5, True, j - i, (3, -1), 2.0, slopes=ref_in[3])
    close(out.detach()[0], ref)
    ref.backward(go[0].double())
    check_grads([q.grad[0], k.grad[0], v.grad[0], slopes.grad[0]], [t.grad for t in ref_in])
    assert slopes.grad.shape == slopes.shape and slopes.grad.dtype == slopes.dtype

    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    qv, kv_, vv = leaf(7, h, d, dtype=torch.bfloat16), leaf(7, hk, d), leaf(7, hk, d)
    kv_, vv = kv_.detach().bfloat16().requires_grad_(), vv.detach().bfloat16().requires_grad_()
    table = leaf(h, TABLE_N, dtype=torch.bfloat16, scale=0.5)
    out, _ = torch.ops.posbias.attention_varlen_forward(qv, kv_, vv, cu, cu, None, table, None,
                                                        True, -1, -1, 0.0)
    out.float().sum().backward()
    for t in (qv, kv_, vv, table):
        assert t.grad is not None and t.grad.dtype == torch.bfloat16 and t.grad.shape == t.shape
        assert t.grad.float().abs().sum() > 0


@pytest.mark.parametrize("bias", ["alibi", "table"])
@pytest.mark.parametrize("q_offset,window,softcap,masked", [
    (None, (-1, -1), 0.0, False), (11, (-1, -1), 0.0, False), (-3, (4, 2), 5.0, True),
    (6, (2, -1), 0.0, True)])
def test_attention_lse_options(bias, q_offset, window, softcap, masked):
    """posbias.attention_lse takes attention()'s options (ring attention places
    a block with q_offset): out and lse against the float64 reference, and out's
    gradients."""
    torch.manual_seed(11)
    b, h, hk, i, j, d = 2, 4, 2, 6, 9, 8
    q, k, v = leaf(b, h, i, d), leaf(b, hk, j, d), leaf(b, hk, j, d)
    kw = make_bias(bias, b, h)
    mask = (torch.rand(b, j) > 0.3).to(torch.uint8) if masked else None
    out, lse = posbias.attention_lse(q, k, v, causal=True, q_offset=q_offset, window=window,
                                     softcap=softcap, key_mask=mask, **kw)
    assert lse.shape == (b, h, i) and lse.dtype == torch.float32 and not lse.requires_grad
    go = torch.randn_like(out)
    out.backward(go)
    bias_t = kw.get("slopes", kw.get("table"))
    ref_bias_t = bias_t.detach().double().requires_grad_()
    qo = j - i if q_offset is None else q_offset
    for s in range(b):
        ins = [t.detach()[s].double().requires_grad_() for t in (q, k, v)]
        ref, ref_lse = ref_one(*ins, d ** -0.5, True, qo, window, softcap,
                               mask=None if mask is None else mask[s],
                               **{("slopes" if bias == "alibi" else "table"): ref_bias_t})
        close(out.detach()[s], ref)
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[s]), fin)
        close(lse[s][fin], ref_lse[fin])
        ref.backward(go[s].double())
        check_grads([q.grad[s], k.grad[s], v.grad[s]], [t.grad for t in ins])
    close(bias_t.grad, ref_bias_t.grad, 3e-4)
