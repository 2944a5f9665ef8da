"""float64 (issue 18, item 8): every op accepts float64 and computes in
float64 on the reference path, so torch.autograd.gradcheck (and
gradgradcheck) runs in float64; values equal the float64 references of
reference.py to float64 rounding and the float32 ops to float32 rounding.
Attention (dense with its options, varlen, KV cache) takes the core's double
reference path: its gradcheck covers q, k, v, slopes per head and per
sequence, a table and a dense bias."""
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import posbias
import reference as R

P = torch.ops.posbias
F64 = torch.float64


@pytest.mark.parametrize("i,j,n", [(4, 5, 9), (5, 5, 9), (1, 7, 15), (6, 3, 11), (0, 4, 7)])
def test_expand_and_reduce_gradcheck(i, j, n):
    torch.manual_seed(i * 10 + j)
    table = torch.randn(3, n, dtype=F64, requires_grad=True)
    out = posbias.expand_distance_table(table, i, j)
    assert out.dtype == F64
    torch.testing.assert_close(out, R.centred_table_to_bias(table.detach(), i, j), rtol=0, atol=0)
    assert gradcheck(lambda t: posbias.expand_distance_table(t, i, j), (table,))
    assert gradgradcheck(lambda t: posbias.expand_distance_table(t, i, j), (table,))
    grad = torch.randn(3, i, j, dtype=F64, requires_grad=True)
    assert gradcheck(lambda g: P.reduce_distance_table(g, n), (grad,))
    red32 = P.reduce_distance_table(grad.detach().float(), n)
    torch.testing.assert_close(P.reduce_distance_table(grad.detach(), n).float(), red32,
                               rtol=1e-5, atol=1e-5)


def test_expand_to_float64_from_float32_table():
    table = torch.randn(2, 7, requires_grad=True)
    out = posbias.expand_distance_table(table, 3, 4, dtype=F64)
    assert out.dtype == F64
    out.sum().backward()
    assert table.grad.dtype == torch.float32


def test_float64_bad_lengths_are_value_errors():
    with pytest.raises(ValueError, match=r"n = 8 .* must be odd"):
        posbias.expand_distance_table(torch.zeros(2, 8, dtype=F64), 2, 3)
    with pytest.raises(ValueError,
                       match=r"too short for i = 2, j = 5: .*n >= 2 max\(i, j\) - 1 = 9"):
        posbias.expand_distance_table(torch.zeros(2, 7, dtype=F64), 2, 5)
    with pytest.raises(ValueError, match="j must be >= 1"):
        posbias.DynamicPositionBias(4, 2).double().distance_table(0)


@pytest.mark.parametrize("i,j", [(5, 7), (3, 3), (0, 4)])
def test_zeta_dpb_float64(i, j):
    torch.manual_seed(j)
    m32 = posbias.DynamicPositionBias(8, 3)
    m = posbias.DynamicPositionBias(8, 3)
    m.load_state_dict(m32.state_dict())
    m.double()
    out = m(i, j)
    ref = R.zeta_dpb_bias({k: v.detach() for k, v in m.state_dict().items()}, i, j)
    torch.testing.assert_close(out.detach(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.detach().float(), m32(i, j).detach(), rtol=1e-5, atol=1e-5)
    params = tuple(m.mlp.parameters())
    assert gradcheck(lambda *p: P.dpb_distance_table(list(p), 4, "zeta", False, False, 1e-5),
                     params)


@pytest.mark.parametrize("depth,norm,log_distance", [(1, False, False), (2, True, True)])
def test_x_transformers_dpb_float64_gradcheck(depth, norm, log_distance):
    torch.manual_seed(depth)
    m = posbias.DynamicPositionBias(6, heads=2, depth=depth, log_distance=log_distance,
                                    norm=norm).double()
    params = tuple(m.mlp.parameters())
    assert gradcheck(lambda *p: P.dpb_distance_table(list(p), 3, "x-transformers",
                                                     log_distance, norm, 1e-5), params)
    m32 = posbias.DynamicPositionBias(6, heads=2, depth=depth, log_distance=log_distance,
                                      norm=norm)
    m32.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    torch.testing.assert_close(m(4, 6).detach().float(), m32(4, 6).detach(), rtol=1e-5,
                               atol=1e-5)


def test_x_transformers_dpb_float64_values_are_the_double_mlp():
    """The core's float64 reference (log distances in double, LayerNorm with
    eps as given) equals the MLP written with torch ops in float64."""
    torch.manual_seed(7)
    m = posbias.DynamicPositionBias(5, heads=3, depth=2, log_distance=True, norm=True).double()
    with torch.no_grad():
        for blk in m.mlp[:-1]:
            blk[1].weight.uniform_(0.5, 1.5)
            blk[1].bias.uniform_(-0.5, 0.5)
    layers = []
    for blk in m.mlp[:-1]:
        layers += [{"type": "linear", "weight": blk[0].weight.detach(),
                    "bias": blk[0].bias.detach()},
                   {"type": "layernorm", "weight": blk[1].weight.detach(),
                    "bias": blk[1].bias.detach(), "eps": 1e-5},
                   {"type": "silu"}]
    layers.append({"type": "linear", "weight": m.mlp[-1].weight.detach(),
                   "bias": m.mlp[-1].bias.detach()})
    torch.testing.assert_close(m(4, 9).detach(), R.xt_dpb_bias(layers, True, 4, 9),
                               rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_t5_float64(causal):
    torch.manual_seed(3)
    m = posbias.RelativePositionBias(scale=0.5, causal=causal, num_buckets=8, max_distance=16,
                                     heads=2).double()
    e = m.relative_attention_bias.weight
    torch.testing.assert_close(m(5, 9).detach(),
                               R.t5_bias(e.detach(), 5, 9, causal, 8, 16, 0.5), rtol=0, atol=0)
    assert gradcheck(lambda w: P.t5_distance_table(w, 6, causal, 8, 16, 0.5), (e,))
    assert gradcheck(lambda w: posbias.expand_distance_table(
        P.t5_distance_table(w, 6, causal, 8, 16, 0.5), 4, 6), (e,))
    with pytest.raises(ValueError):
        P.t5_distance_table(e, 4, causal, 1, 16, 0.5)  # the core's bucket checks


def test_alibi_float64():
    slopes = posbias.alibi_slopes(4)
    m = posbias.AlibiPositionalBias(4, 6).double()
    assert m.slopes.dtype == torch.float32
    out = m(3, 5)
    assert out.dtype == F64
    torch.testing.assert_close(out, R.alibi_bias(slopes, 3, 5, 6).to(F64), rtol=0, atol=0)
    pos_q, pos_k = torch.tensor([0, 3, 9]), torch.tensor([1, 2, 5, 11])
    custom = m.forward_custom_pos(pos_q, pos_k)
    assert custom.dtype == F64
    torch.testing.assert_close(custom, R.alibi_bias_custom_pos(slopes, pos_q, pos_k, 6).to(F64))
    seed = posbias.AlibiBias(3, causal=True)
    b = seed.build(4, 6, dtype=F64)
    assert b.dtype == F64
    ref = R.seed_alibi_bias(3, True, seed.slopes.double(), 4, 6)
    torch.testing.assert_close(b, ref.to(F64).reshape(b.shape))
    with pytest.raises(ValueError, match="total_heads"):
        P.alibi_bias(slopes, 2, 2, 3, F64)  # the core's check, on the float64 path too


def test_learnable_alibi_float64_module():
    m = posbias.AlibiPositionalBias(2, learnable=True).double()
    out = m(3, 4)
    assert out.dtype == F64 and m.slopes.dtype == torch.float32
    out.sum().backward()
    assert m.slopes.grad is not None


def _qkv(b, h, hk, i, j, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, i, d, dtype=F64, generator=g, requires_grad=True)
    k = torch.randn(b, hk, j, d, dtype=F64, generator=g, requires_grad=True)
    v = torch.randn(b, hk, j, d, dtype=F64, generator=g, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "alibi", "alibi_seq", "table", "dense"])
def test_attention_float64_values_and_gradcheck(kind, causal):
    """Every bias kind in float64 equals reference.py's float64 attention to
    float64 rounding, and gradcheck runs on q, k, v and the bias tensor."""
    b, h, hk, i, j, d = 2, 4, 2, 3, 5, 4
    q, k, v = _qkv(b, h, hk, i, j, d, 3)
    g = torch.Generator().manual_seed(4)
    bias_args, ref_bias = {}, None
    pos = R.signed_distance(i, j).abs().to(F64)  # |q_r - c|
    if kind in ("alibi", "alibi_seq"):
        shape = (h,) if kind == "alibi" else (b, h)
        slopes = (torch.rand(*shape, dtype=F64, generator=g) * 0.5 + 0.1).requires_grad_()
        bias_args["slopes"] = slopes
        ref_bias = -(slopes.view(-1 if kind == "alibi" else b, h, 1, 1) * pos)
    elif kind == "table":
        table = torch.randn(h, 2 * j + 1, dtype=F64, generator=g, requires_grad=True)
        bias_args["table"] = table
        ref_bias = R.centred_table_to_bias(table, i, j).unsqueeze(0)
    elif kind == "dense":
        dense = torch.randn(1, h, i, j, dtype=F64, generator=g, requires_grad=True)
        bias_args["dense"] = dense
        ref_bias = dense
    out, lse = posbias.attention_lse(q, k, v, **bias_args, causal=causal)
    assert out.dtype == F64 and lse.dtype == F64
    want, want_lse = R.attention(q, k, v, ref_bias, causal=causal, return_lse=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    (gq, gk, gv), (wq, wk, wv) = [torch.autograd.grad(o.sum(), (q, k, v)) for o in (out, want)]
    for got, exp in ((gq, wq), (gk, wk), (gv, wv)):
        torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)
    names = list(bias_args)
    fn = lambda q_, k_, v_, *bias: posbias.attention(q_, k_, v_, causal=causal,
                                                     **dict(zip(names, bias)))
    assert gradcheck(fn, (q, k, v, *bias_args.values()))
    # float64 agrees with the float32 path of the same inputs to float32 rounding.
    out32 = posbias.attention(q.detach().float(), k.detach().float(), v.detach().float(),
                              **{n: t.detach().float() for n, t in bias_args.items()},
                              causal=causal)
    torch.testing.assert_close(out.detach().float(), out32, rtol=1e-5, atol=1e-5)


def test_attention_float64_options_gradcheck():
    """q_offset, window, softcap and key_mask in float64 (the option op's path)."""
    q, k, v = _qkv(2, 2, 1, 3, 6, 4, 5)
    slopes = torch.tensor([0.3, 0.7], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    fn = lambda q_, k_, v_, s_: posbias.attention(q_, k_, v_, slopes=s_, causal=True, q_offset=4,
                                                  window=(3, 0), softcap=2.0, key_mask=mask)
    assert fn(q, k, v, slopes).dtype == F64
    assert gradcheck(fn, (q, k, v, slopes))


@pytest.mark.parametrize("bias", ["none", "alibi", "alibi_seq", "table"])
def test_attention_varlen_float64_gradcheck(bias):
    lens_q, lens_k, h, hk, d = [2, 0, 3], [3, 2, 4], 2, 1, 3
    cu_q = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(5, h, d, dtype=F64, generator=g, requires_grad=True)
    k = torch.randn(9, hk, d, dtype=F64, generator=g, requires_grad=True)
    v = torch.randn(9, hk, d, dtype=F64, generator=g, requires_grad=True)
    extra = {}
    if bias == "alibi":
        extra["alibi_slopes"] = torch.tensor([0.25, 0.5], dtype=F64, requires_grad=True)
    elif bias == "alibi_seq":
        extra["alibi_slopes"] = (torch.rand(3, h, dtype=F64, generator=g) + 0.1).requires_grad_()
    elif bias == "table":
        extra["distance_table"] = torch.randn(h, 9, dtype=F64, generator=g, requires_grad=True)
    names = list(extra)
    fn = lambda q_, k_, v_, *b_: posbias.attention_varlen(
        q_, k_, v_, cu_q, cu_k, 3, 4, causal=True, softcap=1.5, **dict(zip(names, b_)))
    out, lse = posbias.attention_varlen(q, k, v, cu_q, cu_k, 3, 4, causal=True,
                                        return_softmax_lse=True, **extra)
    assert out.dtype == F64 and lse.dtype == F64
    assert gradcheck(fn, (q, k, v, *extra.values()))


def test_attention_kvcache_float64_matches_dense():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 2, 3, dtype=F64, generator=g)  # [b, i, h, d]
    kc = torch.randn(1, 6, 1, 3, dtype=F64, generator=g)
    vc = torch.randn(1, 6, 1, 3, dtype=F64, generator=g)
    seqlens = torch.tensor([5], dtype=torch.int32)
    slopes = torch.tensor([0.3, 0.6], dtype=F64)
    out = posbias.attention_with_kvcache(q, kc, vc, seqlens, causal=True, alibi_slopes=slopes)
    assert out.dtype == F64
    dense = posbias.attention(q.transpose(1, 2), kc[:, :5].transpose(1, 2),
                              vc[:, :5].transpose(1, 2), slopes=slopes, causal=True)
    torch.testing.assert_close(out, dense.transpose(1, 2), rtol=1e-12, atol=1e-12)
    # The lse in float64 too: [b, h, i], the dense call's.
    out2, lse = posbias.attention_with_kvcache(q, kc, vc, seqlens, causal=True,
                                               alibi_slopes=slopes, return_softmax_lse=True)
    assert lse.dtype == F64 and lse.shape == (1, 2, 2) and torch.equal(out2, out)
    _, dense_lse = posbias.attention_lse(q.transpose(1, 2), kc[:, :5].transpose(1, 2),
                                         vc[:, :5].transpose(1, 2), slopes=slopes, causal=True)
    torch.testing.assert_close(lse, dense_lse, rtol=1e-12, atol=1e-12)


def test_attention_kvcache_append_float64_is_exact():
    """k= and v= in float64 are copied exactly into a float64 cache (slabs and
    pages), and the attention over the appended keys matches dense float64."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 2, 3, dtype=F64, generator=g)  # [b, i, h, d]
    k_new = torch.randn(1, 2, 1, 3, dtype=F64, generator=g) / 3
    v_new = torch.randn(1, 2, 1, 3, dtype=F64, generator=g) / 7
    seqlens = torch.tensor([4], dtype=torch.int32)
    slopes = torch.tensor([0.3, 0.6], dtype=F64)
    kc = torch.randn(1, 6, 1, 3, dtype=F64, generator=g)
    vc = torch.randn(1, 6, 1, 3, dtype=F64, generator=g)
    kp, vp = kc.reshape(3, 2, 1, 3).flip(0).clone(), vc.reshape(3, 2, 1, 3).flip(0).clone()
    table = torch.tensor([[2, 1, 0]], dtype=torch.int32)  # pages in reverse order
    out = posbias.attention_with_kvcache(q, kc, vc, seqlens, k=k_new, v=v_new, causal=True,
                                         alibi_slopes=slopes)
    outp = posbias.attention_with_kvcache(q, kp, vp, seqlens, block_table=table, k=k_new,
                                          v=v_new, causal=True, alibi_slopes=slopes)
    assert torch.equal(kc[:, 4:6], k_new) and torch.equal(vc[:, 4:6], v_new)
    assert torch.equal(kp[0], k_new[0]) and torch.equal(vp[0], v_new[0])
    dense = posbias.attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                              slopes=slopes, causal=True)
    torch.testing.assert_close(out, dense.transpose(1, 2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outp, out, rtol=1e-12, atol=1e-12)
    with pytest.raises((TypeError, ValueError), match="all float64"):
        posbias.attention_with_kvcache(q, kc.float(), vc.float(), seqlens, k=k_new, v=v_new)


def test_attention_float64_mixed_dtypes_are_type_errors():
    q = torch.zeros(1, 2, 3, 4, dtype=F64)
    with pytest.raises(TypeError, match="one dtype, got Double, Float, Float"):
        posbias.attention(q, q.float(), q.float())
    with pytest.raises(TypeError, match="one dtype, got Float, Double, Double"):
        posbias.attention(q.float(), q, q)
    with pytest.raises(ValueError, match="float64, float32, float32"):
        posbias.attention(q, q.float(), q.float(), window=(1, 1))


def test_float64_explicit_scale_and_softcap_are_taken_in_double():
    """scale = 0.1 and softcap = 0.3 are not float32 values: a float64 call
    uses them as given (AttentionOptions holds doubles)."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=F64) for _ in range(3))
    out = posbias.attention(q, k, v, scale=0.1)
    torch.testing.assert_close(out, R.attention(q, k, v, scale=0.1), rtol=1e-13, atol=1e-14)
    capped = posbias.attention(q, k, v, scale=0.1, softcap=0.3)
    s = 0.3 * torch.tanh(0.1 * q @ k.transpose(-1, -2) / 0.3)
    want = torch.softmax(s, dim=-1) @ v
    torch.testing.assert_close(capped, want, rtol=1e-13, atol=1e-14)
