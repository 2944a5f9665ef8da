"""Learnable ALiBi slopes (issue 18, item 4): a slopes tensor that requires
grad gets its gradient through the fused attention op (the core's
attention_backward's grad_slopes), and AlibiPositionalBias(learnable=True)
keeps the slopes as a Parameter that the bias's gradient reaches. Both
against autograd of a float64 reference with the bias materialised."""
import pytest
import torch

import posbias
import reference as R


def ref_alibi_bias(slopes64, i, j):
    """-m_h |c - q_r| as a differentiable float64 [h, i, j]."""
    return -slopes64[:, None, None] * R.signed_distance(i, j).abs().to(torch.float64)[None]


@pytest.mark.parametrize("b,h,hk,i,j,d,causal", [
    (1, 4, 4, 5, 5, 8, False), (2, 4, 2, 5, 9, 16, True), (1, 3, 1, 7, 4, 8, True),
    (1, 8, 8, 1, 33, 32, False), (2, 2, 1, 17, 17, 8, True)])
def test_attention_slopes_gradient(b, h, hk, i, j, d, causal):
    torch.manual_seed(b * 100 + i * 10 + j)
    q = torch.randn(b, h, i, d, requires_grad=True)
    k = torch.randn(b, hk, j, d, requires_grad=True)
    v = torch.randn(b, hk, j, d, requires_grad=True)
    slopes = (posbias.alibi_slopes(h) * 4).requires_grad_()
    out = posbias.attention(q, k, v, slopes=slopes, causal=causal)
    go = torch.randn_like(out)
    (out * go).sum().backward()

    s64 = slopes.detach().double().requires_grad_()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = R.attention(q64, k64, v64, bias=ref_alibi_bias(s64, i, j)[None], causal=causal)
    (ref * go.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    scale = s64.grad.abs().max().item() + 1e-6
    torch.testing.assert_close(slopes.grad.double(), s64.grad, rtol=1e-4, atol=1e-4 * scale)
    for t, t64 in ((q, q64), (k, k64), (v, v64)):
        torch.testing.assert_close(t.grad.double(), t64.grad, rtol=1e-4, atol=1e-4)


def test_attention_slopes_without_grad_get_none():
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    slopes = posbias.alibi_slopes(2)
    posbias.attention(q, q, q, slopes=slopes).sum().backward()
    assert slopes.grad is None and q.grad is not None


def test_attention_bfloat16_inputs_float32_slopes():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 4, 6, 8).to(torch.bfloat16) for _ in range(3))
    slopes = (posbias.alibi_slopes(4) * 4).requires_grad_()
    posbias.attention(q, k, v, slopes=slopes, causal=True).float().sum().backward()
    assert slopes.grad.dtype == torch.float32 and slopes.grad.shape == (4,)
    s64 = slopes.detach().double().requires_grad_()
    ref = R.attention(q.double(), k.double(), v.double(), bias=ref_alibi_bias(s64, 6, 6)[None],
                      causal=True)
    ref.sum().backward()
    torch.testing.assert_close(slopes.grad.double(), s64.grad, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("heads,total,i,j", [(4, 4, 5, 5), (4, 8, 3, 7), (3, 3, 6, 2),
                                             (2, 5, 0, 4)])
def test_learnable_module(heads, total, i, j):
    m = posbias.AlibiPositionalBias(heads, total, learnable=True)
    assert isinstance(m.slopes, torch.nn.Parameter)
    assert [n for n, _ in m.named_parameters()] == ["slopes"]
    assert list(m.state_dict()) == ["slopes"]
    assert "learnable=True" in repr(m)
    out = m(i, j)
    fixed = posbias.AlibiPositionalBias(heads, total)(i, j)
    torch.testing.assert_close(out.detach(), fixed, rtol=0, atol=0)  # same values, bit for bit
    g = torch.randn_like(out)
    (out * g).sum().backward()
    s64 = m.slopes.detach().double().requires_grad_()
    ref = ref_alibi_bias(s64, i, j)
    (ref * g[:heads].double()).sum().backward()
    torch.testing.assert_close(m.slopes.grad.double(), s64.grad, rtol=1e-5, atol=1e-4)


def test_learnable_module_trains_and_keeps_float32():
    torch.manual_seed(0)
    m = posbias.AlibiPositionalBias(4, learnable=True)
    target = posbias.AlibiPositionalBias(4, slopes=[0.5, 0.25, 0.125, 0.0625])(8, 8)
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    first = None
    for _ in range(200):
        opt.zero_grad()
        loss = (m(8, 8) - target).pow(2).mean()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 1e-3 * first
    param = m.slopes
    m.half()
    assert m.slopes is param and m.slopes.dtype == torch.float32
    assert m(3, 3).dtype == torch.float16


def test_learnable_slopes_in_fused_attention():
    """The module's Parameter trained through posbias.attention."""
    torch.manual_seed(1)
    m = posbias.AlibiPositionalBias(2, learnable=True)
    q = torch.randn(1, 2, 4, 8)
    posbias.attention(q, q, q, slopes=m.slopes, causal=True).sum().backward()
    assert m.slopes.grad is not None and m.slopes.grad.abs().sum() > 0


def test_learnable_must_be_bool():
    with pytest.raises(TypeError, match="learnable must be a bool"):
        posbias.AlibiPositionalBias(4, learnable=1)


@pytest.mark.parametrize("causal", [False, True])
def test_per_sequence_slopes_and_their_gradient(causal):
    """slopes [b, h] (FlashAttention-2's alibi_slopes layout): sequence s uses
    row s; a [b, h] tensor that requires grad gets [b, h] gradients."""
    torch.manual_seed(5)
    b, h, hk, i, j, d = 3, 4, 2, 5, 7, 8
    q = torch.randn(b, h, i, d)
    k, v = torch.randn(b, hk, j, d), torch.randn(b, hk, j, d)
    slopes = (torch.rand(b, h) + 0.1).requires_grad_()
    out = posbias.attention(q, k, v, slopes=slopes, causal=causal)
    go = torch.randn_like(out)
    (out * go).sum().backward()
    s64 = slopes.detach().double().requires_grad_()
    bias = -s64[:, :, None, None] * R.signed_distance(i, j).abs().double()[None, None]
    ref = R.attention(q.double(), k.double(), v.double(), bias=bias, causal=causal)
    (ref * go.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    assert slopes.grad.shape == (b, h)
    torch.testing.assert_close(slopes.grad.double(), s64.grad, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"ALiBi needs .*one set per sequence.*got 8"):
        posbias.attention(q, k, v, slopes=torch.ones(2, 4))
