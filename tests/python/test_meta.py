"""Meta (shape-only) kernels of the ops, and torch.jit.trace of a model using
the modules (issue 18, item 5). torch 1.13 has no torch.compile."""
import pytest
import torch
from torch import nn

import posbias

P = torch.ops.posbias


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_meta(dtype):
    q, kv = meta(2, 8, 5, 16, dtype=dtype), meta(2, 2, 7, 16, dtype=dtype)
    out = P.attention(q, kv, kv, "alibi", meta(8), None, None, None, True)
    assert out.is_meta and out.shape == (2, 8, 5, 16) and out.dtype == dtype
    out, lse = P.attention_lse(q, kv, kv, "table", None, meta(8, 13), None, 0.5, False)
    assert out.shape == (2, 8, 5, 16) and lse.shape == (2, 8, 5) and lse.dtype == torch.float32
    assert lse.is_meta
    # requires_grad meta inputs go through the Autograd kernel to the same shapes.
    qg = meta(1, 4, 3, 8).requires_grad_()
    assert P.attention(qg, qg, qg, "none", None, None, None, None, False).shape == (1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"h % hk == 0"):
        P.attention(meta(1, 3, 5, 16), meta(1, 2, 5, 16), meta(1, 2, 5, 16), "none", None, None,
                    None, None, False)
    with pytest.raises(ValueError, match="4-d"):
        P.attention(meta(3, 5, 16), kv, kv, "none", None, None, None, None, False)


def test_table_ops_meta():
    t = P.expand_distance_table(meta(3, 9), 4, 5, torch.bfloat16)
    assert t.is_meta and t.shape == (3, 4, 5) and t.dtype == torch.bfloat16
    assert P.expand_distance_table(meta(3, 9), 4, 5, None).dtype == torch.float32
    r = P.reduce_distance_table(meta(3, 4, 5), 9)
    assert r.is_meta and r.shape == (3, 9)
    dpb = posbias.DynamicPositionBias(16, 4).to("meta")
    t = P.dpb_distance_table(list(dpb.mlp.parameters()), 6, "zeta", False, False, 1e-5)
    assert t.is_meta and t.shape == (4, 11)
    t = P.t5_distance_table(meta(32, 6), 5, False, 32, 128, 1.0)
    assert t.is_meta and t.shape == (6, 9)
    assert P.alibi_distance_table(meta(4), 3, True).shape == (4, 5)
    assert P.alibi_bias_build(meta(4), 4, True, 2, 3, torch.float16).shape == (1, 4, 2, 3)
    pos = torch.empty(5, dtype=torch.long, device="meta")
    assert P.alibi_bias_custom_pos(meta(4), 8, pos, pos[:3], None).shape == (8, 5, 3)
    with pytest.raises(ValueError, match="j must be >= 1"):
        P.t5_distance_table(meta(32, 6), 0, False, 32, 128, 1.0)


def test_meta_matches_cpu_shapes_and_dtypes():
    q = torch.randn(1, 4, 6, 8, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 9, 8, dtype=torch.bfloat16)
    slopes = posbias.alibi_slopes(4)
    for args in (("alibi", slopes, None, None), ("table", None, torch.randn(4, 17), None)):
        cpu = P.attention_lse(q, kv, kv, *args, None, True)
        m = P.attention_lse(q.to("meta"), kv.to("meta"), kv.to("meta"), args[0],
                            *(a.to("meta") if a is not None else None for a in args[1:]), None,
                            True)
        for c, mm in zip(cpu, m):
            assert c.shape == mm.shape and c.dtype == mm.dtype


class Block(nn.Module):
    """An attention block over posbias modules and the fused op."""

    def __init__(self, heads=4, d=8):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = nn.Linear(heads * d, 3 * heads * d)
        self.dpb = posbias.DynamicPositionBias(16, heads)
        self.alibi = posbias.AlibiPositionalBias(heads)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        out = posbias.attention(q, k, v, table=self.dpb.distance_table(n), causal=True)
        scores = q @ k.transpose(-1, -2) + self.alibi(n, n)  # the materialised form
        return out.sum(-1) + scores.softmax(-1).sum(-1)


def test_jit_trace_of_modules():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 10, 32)
    traced = torch.jit.trace(model, (x,), check_trace=True)  # two runs give one graph
    graph = str(traced.inlined_graph)
    for op in ("attention", "dpb_distance_table", "alibi_bias"):
        assert f"posbias::{op}" in graph, graph
    x2 = torch.randn(2, 10, 32, requires_grad=True)
    torch.testing.assert_close(traced(x2), model(x2))
    traced(x2).sum().backward()  # gradients through the traced ops
    assert x2.grad is not None and model.dpb.mlp[0].weight.grad is not None


def test_jit_trace_saved_and_loaded(tmp_path):
    model = Block()
    x = torch.randn(1, 6, 32)
    traced = torch.jit.trace(model, (x,))
    path = tmp_path / "block.pt"
    traced.save(str(path))
    loaded = torch.jit.load(str(path))
    torch.testing.assert_close(loaded(x), model(x))


def test_no_torch_compile_in_this_torch():
    """docs/python.md says so; if a newer torch has it, this reminds to test it."""
    if hasattr(torch, "compile"):
        pytest.skip("this torch has torch.compile: not covered by these tests")
    assert torch.__version__.startswith("1.")


# ---------------------------------------------------------------- batch ops

def _same_meta(cpu, m):
    cpu = cpu if isinstance(cpu, (tuple, list)) else (cpu,)
    m = m if isinstance(m, (tuple, list)) else (m,)
    assert len(cpu) == len(m)
    for c, mm in zip(cpu, m):
        assert mm.is_meta and c.shape == mm.shape and c.dtype == mm.dtype, (c.shape, mm.shape)


def _to_meta(args):
    return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_options_meta_matches_cpu(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 5, 8, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 9, 8, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(2, 9, dtype=torch.bool)
    for bias in ((posbias.alibi_slopes(4), None, None), (None, torch.randn(4, 17), None),
                 (None, None, torch.randn(1, 4, 5, 9)), (torch.rand(2, 4), None, None)):
        args = [q, k, v, *bias, 0.3, True, 2, 3, 0, 20.0, mask]
        fwd = P.attention_options_forward(*args)
        _same_meta(fwd, P.attention_options_forward(*_to_meta(args)))
        bargs = args + [fwd[0], fwd[1], torch.randn_like(fwd[0])]
        _same_meta(P.attention_options_backward(*bargs),
                   P.attention_options_backward(*_to_meta(bargs)))
    with pytest.raises(ValueError, match="4-d"):
        P.attention_options_forward(meta(5, 8), meta(1, 2, 9, 8), meta(1, 2, 9, 8), None, None,
                                    None, None, False, None, -1, -1, 0.0, None)


def test_float64_calls_meta_matches_cpu():
    """In a float64 call the lse and the bias gradients are float64 on the
    CPU; the Meta kernels say so too."""
    g = torch.Generator().manual_seed(6)
    F64 = torch.float64
    q = torch.randn(1, 2, 3, 4, generator=g, dtype=F64)
    k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=F64) for _ in range(2))
    slopes = torch.tensor([0.3, 0.5], dtype=F64)
    args = [q, k, v, slopes, None, None, None, True, None, -1, -1, 0.0, None]
    fwd = P.attention_options_forward(*args)
    assert fwd[1].dtype == F64
    _same_meta(fwd, P.attention_options_forward(*_to_meta(args)))
    bargs = args + [fwd[0], fwd[1], torch.randn_like(fwd[0])]
    _same_meta(P.attention_options_backward(*bargs), P.attention_options_backward(*_to_meta(bargs)))
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    qv = torch.randn(7, 2, 4, generator=g, dtype=F64)
    kv, vv = (torch.randn(9, 2, 4, generator=g, dtype=F64) for _ in range(2))
    vargs = [qv, kv, vv, cu_q, cu_k, slopes, None, None, True, -1, -1, 0.0]
    vf = P.attention_varlen_forward(*vargs)
    _same_meta(vf, P.attention_varlen_forward(*_to_meta(vargs)))
    vb = vargs + [vf[0], vf[1], torch.randn_like(vf[0])]
    _same_meta(P.attention_varlen_backward(*vb), P.attention_varlen_backward(*_to_meta(vb)))
    kc, vc = (torch.randn(1, 6, 1, 4, generator=g, dtype=F64) for _ in range(2))
    cargs = [q.transpose(1, 2), kc, vc, torch.tensor([5], dtype=torch.int32), None, slopes,
             None, None, True, -1, -1, 0.0]
    _same_meta(P.attention_kvcache_lse(*cargs), P.attention_kvcache_lse(*_to_meta(cargs)))


def test_attention_varlen_meta_matches_cpu():
    g = torch.Generator().manual_seed(4)
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6, 11], dtype=torch.int32)
    q = torch.randn(7, 4, 8, generator=g, dtype=torch.float32).to(torch.float16)
    k, v = (torch.randn(11, 2, 8, generator=g).to(torch.float16) for _ in range(2))
    for slopes, table in ((posbias.alibi_slopes(4), None), (None, torch.randn(4, 21)),
                          (None, None)):
        args = [q, k, v, cu_q, cu_k, slopes, table, None, True, -1, 0, 0.0]
        fwd = P.attention_varlen_forward(*args)
        assert fwd[1].shape == (4, 7)
        _same_meta(fwd, P.attention_varlen_forward(*_to_meta(args)))
        bargs = args + [fwd[0], fwd[1], torch.randn_like(fwd[0])]
        _same_meta(P.attention_varlen_backward(*bargs),
                   P.attention_varlen_backward(*_to_meta(bargs)))
    with pytest.raises(ValueError, match=r"h % hk == 0"):
        P.attention_varlen_forward(meta(7, 3, 8), meta(11, 2, 8), meta(11, 2, 8), cu_q.to("meta"),
                                   cu_k.to("meta"), None, None, None, False, -1, -1, 0.0)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_meta_matches_cpu(paged):
    g = torch.Generator().manual_seed(5)
    b, hk, d = 2, 2, 8
    cache_shape = (6, 4, hk, d) if paged else (b, 12, hk, d)
    kc, vc = (torch.randn(*cache_shape, generator=g) for _ in range(2))
    block_table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32) if paged else None
    seqlens = torch.tensor([5, 7], dtype=torch.int32)
    q = torch.randn(b, 1, 4, d, generator=g)
    args = [q, kc, vc, seqlens, block_table, posbias.alibi_slopes(4), None, None, True, -1, -1,
            0.0]
    _same_meta(P.attention_kvcache(*args), P.attention_kvcache(*_to_meta(args)))
    _same_meta(P.attention_kvcache_lse(*args), P.attention_kvcache_lse(*_to_meta(args)))
    kn, vn = (torch.randn(b, 2, hk, d, generator=g) for _ in range(2))
    margs = _to_meta([kc, vc, seqlens, block_table, kn, vn])
    P.kvcache_append(*margs)  # shape checks only, nothing written
    with pytest.raises(ValueError, match="kvcache_append"):
        P.kvcache_append(*margs[:4], meta(b, 2, 3, d), meta(b, 2, 3, d))
    with pytest.raises(ValueError, match=r"h % hk == 0"):
        P.attention_kvcache(meta(b, 1, 3, d), *_to_meta(args[1:]))


class VarlenBlock(nn.Module):
    """Packed attention (learned ALiBi slopes) then a decode step against a cache."""

    def __init__(self, heads=4, d=8):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = nn.Linear(heads * d, 3 * heads * d)
        self.slopes = nn.Parameter(posbias.alibi_slopes(heads))

    def forward(self, x, cu, kc, vc, seqlens):
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, self.d).unbind(1)
        out = posbias.attention_varlen(q, k, v, cu, cu, 8, 8, causal=True,
                                       alibi_slopes=self.slopes)
        step = posbias.attention_with_kvcache(q[:2].unsqueeze(1), kc, vc, seqlens,
                                              alibi_slopes=self.slopes)
        return out.sum() + step.sum()


def test_jit_trace_of_varlen_and_kvcache():
    torch.manual_seed(1)
    model = VarlenBlock()
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    kc, vc = torch.randn(2, 10, 4, 8), torch.randn(2, 10, 4, 8)
    seqlens = torch.tensor([4, 10], dtype=torch.int32)
    x = torch.randn(12, 32)
    traced = torch.jit.trace(model, (x, cu, kc, vc, seqlens), check_trace=True)
    graph = str(traced.inlined_graph)
    for op in ("attention_varlen_forward", "attention_kvcache"):
        assert f"posbias::{op}" in graph, graph
    cu2 = torch.tensor([0, 9, 12], dtype=torch.int32)  # other lengths, same traced graph
    x2 = torch.randn(12, 32)
    torch.testing.assert_close(traced(x2, cu2, kc, vc, seqlens), model(x2, cu2, kc, vc, seqlens))
    traced(x2, cu2, kc, vc, seqlens).backward()  # the op's own autograd, through the trace
    assert model.slopes.grad is not None and model.qkv.weight.grad is not None
