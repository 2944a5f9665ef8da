"""DynamicPositionBias, RelativePositionBias and the table expansion against the
reference; zeta state dicts; gradients (the float32 ops and modules against
the float64 reference's autograd; float64 modules on the reference path)."""
import pytest
import torch
from torch import nn

import reference as R

posbias = pytest.importorskip("posbias")


class ZetaDPB(nn.Module):
    """zeta's module layout (for state-dict compatibility), written from SPEC."""

    def __init__(self, dim, heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim), nn.SiLU(),
                                 nn.Linear(dim, heads))


def close(a, b, atol=1e-5, rtol=1e-4):
    torch.testing.assert_close(a.detach().to(torch.float64), torch.as_tensor(b).to(
        torch.float64), atol=atol, rtol=rtol)


def test_parameter_names_match_zeta():
    m = posbias.DynamicPositionBias(dim=64, heads=8)
    z = ZetaDPB(64, 8)
    assert [(k, tuple(v.shape)) for k, v in m.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in z.state_dict().items()]
    m.load_state_dict(z.state_dict())  # strict
    assert all(p.requires_grad for p in m.parameters())


@pytest.mark.parametrize("dim,heads", [(1, 1), (8, 2), (16, 4), (64, 8), (32, 12)])
@pytest.mark.parametrize("i,j", [(0, 0), (0, 5), (1, 1), (1, 9), (4, 4), (5, 9), (16, 31),
                                 (40, 40), (3, 100)])
def test_forward_matches_reference(dim, heads, i, j):
    torch.manual_seed(dim * 100 + heads)
    m = posbias.DynamicPositionBias(dim, heads)
    out = m(i, j)
    assert out.shape == (heads, i, j) and out.dtype == torch.float32
    close(out, R.zeta_dpb_bias(m.state_dict(), i, j))


def test_seed_example_positions_0_to_5_is_empty():
    m = posbias.DynamicPositionBias(dim=64, heads=8)
    assert m(0, 5).shape == (8, 0, 5)


def test_distance_table_matches_reference():
    torch.manual_seed(1)
    m = posbias.DynamicPositionBias(16, 4)
    for j in (1, 2, 7, 50):
        t = m.distance_table(j)
        ref = R.zeta_dpb_table(m.state_dict(), j)  # [j, heads]
        idx = (torch.arange(2 * j - 1) - (j - 1)).abs()
        close(t, ref[idx].t())


@pytest.mark.parametrize("i,j", [(1, 1), (3, 3), (2, 7), (6, 9), (0, 4)])
def test_gradients_match_reference_autograd(i, j):
    torch.manual_seed(2)
    m = posbias.DynamicPositionBias(8, 3)
    g = torch.randn(3, i, j)
    (m(i, j) * g).sum().backward()
    ref_params = {k: v.detach().double().requires_grad_() for k, v in m.state_dict().items()}
    (R.zeta_dpb_bias(ref_params, i, j) * g.double()).sum().backward()
    for name, p in m.named_parameters():
        close(p.grad, ref_params[name].grad, atol=1e-4, rtol=1e-4)


def _xt_params(dim, heads, depth, norm):
    """An x-transformers DPB's parameters in state-dict order (float32) and the
    same MLP as reference.py layers (float64 leaves)."""
    params, layers = [], []
    fan_in = 1
    for _ in range(depth):
        w, b = torch.randn(dim, fan_in) / fan_in ** 0.5, torch.randn(dim) * 0.1
        params += [w, b]
        layers.append({"type": "linear", "weight": w, "bias": b})
        if norm:
            nw, nb = 1 + 0.1 * torch.randn(dim), 0.1 * torch.randn(dim)
            params += [nw, nb]
            layers.append({"type": "layernorm", "weight": nw, "bias": nb, "eps": 1e-5})
        layers.append({"type": "silu"})
        fan_in = dim
    w, b = torch.randn(heads, dim) / dim ** 0.5, torch.randn(heads) * 0.1
    params += [w, b]
    layers.append({"type": "linear", "weight": w, "bias": b})
    params = [p.requires_grad_() for p in params]
    for layer in layers:
        for k in ("weight", "bias"):
            if k in layer:
                layer[k] = layer[k].detach().double().requires_grad_()
    return params, layers


@pytest.mark.parametrize("j", [1, 2, 5, 33])
def test_dpb_table_op_gradients_zeta(j):
    """The op dpb_distance_table (the core's distance_table, backward the core's
    backward_distance_table) against the float64 reference's autograd, to
    float32 tolerance: values and every parameter's gradient."""
    torch.manual_seed(3)
    m = posbias.DynamicPositionBias(6, 3)
    params = [p.detach().clone().requires_grad_() for p in m.parameters()]
    names = [n for n, _ in m.named_parameters()]
    ref = {n: p.detach().double().requires_grad_() for n, p in zip(names, params)}
    table = torch.ops.posbias.dpb_distance_table(params, j, "zeta", False, False, 1e-5)
    idx = (torch.arange(2 * j - 1) - (j - 1)).abs()
    ref_table = R.zeta_dpb_table(ref, j)[idx].t()
    assert table.shape == (3, 2 * j - 1) and table.dtype == torch.float32
    close(table, ref_table)
    g = torch.randn(3, 2 * j - 1)
    (table * g).sum().backward()
    (ref_table * g.double()).sum().backward()
    for n, p in zip(names, params):
        close(p.grad, ref[n].grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("depth,norm,log_distance", [(1, False, False), (2, True, False),
                                                      (3, False, True), (2, True, True)])
def test_dpb_table_op_gradients_x_transformers(depth, norm, log_distance):
    torch.manual_seed(4)
    j = 7
    params, layers = _xt_params(5, 2, depth, norm)
    table = torch.ops.posbias.dpb_distance_table(params, j, "x-transformers", log_distance,
                                                 norm, 1e-5)
    assert table.shape == (2, 2 * j - 1) and table.dtype == torch.float32
    out = posbias.expand_distance_table(table, j, j)
    ref = R.xt_dpb_bias(layers, log_distance, j, j)
    close(out, ref)
    g = torch.randn(2, j, j)
    (out * g).sum().backward()
    (ref * g.double()).sum().backward()
    ref_leaves = [layer[k] for layer in layers for k in ("weight", "bias") if k in layer]
    for p, r in zip(params, ref_leaves):
        close(p.grad, r.grad, atol=1e-4, rtol=1e-4)


def test_float64_module_keeps_its_state_dict_and_computes_in_float64():
    """float64 modules take the reference path (issue 18; gradcheck in
    test_float64.py); the state dict is the module's own either way."""
    m = posbias.DynamicPositionBias(4, 2).double()
    assert [n for n, _ in m.named_parameters()] == [
        "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "mlp.4.weight",
        "mlp.4.bias"]
    assert m.distance_table(3).dtype == torch.float64 and m(3, 5).dtype == torch.float64
    t5 = posbias.RelativePositionBias(scale=1.0, num_buckets=8, max_distance=16, heads=2).double()
    assert t5(2, 3).dtype == torch.float64


def test_dpb_sixteen_bit_module():
    """A bfloat16 module: the core computes in float32, the table and the
    gradients come back in the parameters' dtype."""
    torch.manual_seed(5)
    m = posbias.DynamicPositionBias(4, 2)
    ref = m(3, 5).detach()
    m16 = posbias.DynamicPositionBias(4, 2).to(torch.bfloat16)
    m16.load_state_dict(m.state_dict())
    out = m16(3, 5)
    assert out.dtype == torch.bfloat16
    close(out, R.zeta_dpb_bias(m16.state_dict(), 3, 5), atol=2e-2, rtol=2e-2)
    close(out, ref, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in m16.parameters())


@pytest.mark.parametrize("i,j,extra", [(1, 1, 0), (2, 3, 0), (4, 4, 2), (3, 6, 0), (0, 2, 0),
                                       (6, 3, 1), (1, 40, 3), (30, 30, 0)])
def test_expand_distance_table_gradient(i, j, extra):
    """The op (the core's expansion, float32) against a plain PyTorch gather in
    float64, values and gradients; tables read at their centre, longer than
    needed, strided; i > j allowed by the expansion itself."""
    torch.manual_seed(4)
    n = 2 * max(i, j) - 1 + 2 * extra
    t64 = torch.randn(n, 3, dtype=torch.float64).t().requires_grad_()  # strided [3, n]
    t32 = t64.detach().float().requires_grad_()
    g = torch.randn(3, i, j, dtype=torch.float64)
    out = posbias.expand_distance_table(t32, i, j)
    ref = R.centred_table_to_bias(t64, i, j)
    assert out.shape == (3, i, j) and out.dtype == torch.float32
    assert torch.equal(out, ref.detach().float())  # a copy: exact
    (out * g.float()).sum().backward()
    (ref * g).sum().backward()
    close(t32.grad, t64.grad, atol=1e-5, rtol=1e-5)
    # gradcheck of the op in float32 (it is linear: the difference quotient is
    # exact up to float32 rounding of x +- eps), and of the reduction's backward.
    x = torch.randn(3, n, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: posbias.expand_distance_table(v, i, j), (x,),
                                    eps=1e-2, atol=1e-3, rtol=1e-3)
    gr = torch.randn(3, i, j, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: torch.ops.posbias.reduce_distance_table(v, n),
                                    (gr,), eps=1e-2, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_expand_distance_table_dtypes(dtype):
    torch.manual_seed(5)
    t = torch.randn(2, 15)
    for table_dtype in (torch.float32, dtype):
        got = posbias.expand_distance_table(t.to(table_dtype), 5, 8, dtype)
        assert got.dtype == dtype
        assert torch.equal(got, R.centred_table_to_bias(t.to(table_dtype), 5, 8).to(dtype))
    assert posbias.expand_distance_table(t.to(dtype), 5, 8).dtype == dtype  # default: the table's
    if dtype == torch.float16:
        return  # torch 1.13 has no float16 Linear on the CPU (the module's MLP)
    m = posbias.DynamicPositionBias(8, 2).to(dtype)
    torch.manual_seed(6)
    out = m(3, 7)
    assert out.dtype == dtype
    assert torch.equal(out, R.centred_table_to_bias(m.distance_table(7), 3, 7))
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == dtype for p in m.parameters())


def test_training_step_moves_towards_a_target():
    torch.manual_seed(5)
    m = posbias.DynamicPositionBias(16, 2)
    target = R.alibi_bias([0.5, 0.25], 8, 8).float()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = ((m(8, 8) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


# ------------------------------------------------------------------ T5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nb,md", [(32, 128), (16, 64), (8, 20)])
@pytest.mark.parametrize("i,j", [(1, 1), (5, 5), (1, 300), (20, 150), (0, 3)])
def test_relative_position_bias(causal, nb, md, i, j):
    torch.manual_seed(6)
    m = posbias.RelativePositionBias(scale=0.5, causal=causal, num_buckets=nb,
                                     max_distance=md, heads=4)
    e = m.relative_attention_bias.weight.detach()
    close(m(i, j), R.t5_bias(e, i, j, causal, nb, md, 0.5), atol=1e-6, rtol=1e-6)
    close(m.distance_table(j), R.t5_distance_table(e, j, causal, nb, md, 0.5), atol=1e-6,
          rtol=1e-6)


def test_relative_position_bias_gradient():
    torch.manual_seed(7)
    m = posbias.RelativePositionBias(scale=2.0, causal=False, num_buckets=8, max_distance=16,
                                     heads=2)
    g = torch.randn(2, 5, 9)
    (m(5, 9) * g).sum().backward()
    e = m.relative_attention_bias.weight.detach().double().requires_grad_()
    (R.t5_bias(e, 5, 9, False, 8, 16, 2.0) * g.double()).sum().backward()
    close(m.relative_attention_bias.weight.grad, e.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("j", [1, 4, 60])
def test_t5_table_op_gradient(causal, j):
    """The op t5_distance_table (the core's distance_table over the embedding,
    backward the core's scatter-add into the buckets) against the float64
    reference's autograd; the bucket a table entry reads is the reference's."""
    torch.manual_seed(8)
    e = torch.randn(8, 3, requires_grad=True)
    e64 = e.detach().double().requires_grad_()
    table = torch.ops.posbias.t5_distance_table(e, j, causal, 8, 16, 0.5)
    ref = R.t5_distance_table(e64, j, causal, 8, 16, 0.5)
    assert table.shape == (3, 2 * j - 1) and table.dtype == torch.float32
    close(table, ref, atol=1e-6, rtol=1e-6)
    g = torch.randn(3, 2 * j - 1)
    (table * g).sum().backward()
    (ref * g.double()).sum().backward()
    close(e.grad, e64.grad, atol=1e-5, rtol=1e-5)
