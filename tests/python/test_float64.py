"""float64 (issue 18, item 8): every op but attention accepts float64 and
computes in float64 on the reference path, so torch.autograd.gradcheck (and
gradgradcheck) runs in float64; values equal the float64 references of
reference.py to float64 rounding and the float32 ops to float32 rounding.
Attention has no float64 path in the core yet: refused with TypeError."""
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
    with pytest.raises(ValueError, match=r"too short for i = 2, j = 5: it must be >= 2 max\(i, j\) - 1 = 9"):
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


def test_attention_float64_refused():
    q = torch.zeros(1, 2, 3, 4, dtype=F64)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16, got Double"):
        posbias.attention(q, q, q)
