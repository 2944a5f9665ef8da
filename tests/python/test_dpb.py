"""DynamicPositionBias, RelativePositionBias and the table expansion against the
reference; zeta state dicts; gradients (gradcheck in double, and the float32
module's gradients against the float64 reference's autograd)."""
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


def test_gradcheck_double():
    """torch.autograd.gradcheck in float64 of the module's forward (the op
    dpb_distance_table, which keeps float64, then the package's expansion) with
    respect to every parameter."""
    torch.manual_seed(3)
    m = posbias.DynamicPositionBias(4, 2).double()
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in m.parameters())
    assert m.distance_table(3).dtype == torch.float64

    def f(*ps):
        return torch.nn.utils.stateless.functional_call(m, dict(zip(names, ps)), (3, 5))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(lambda *ps: torch.nn.utils.stateless.functional_call(
        m, dict(zip(names, ps)), (0, 4)), params)


@pytest.mark.parametrize("i,j", [(1, 1), (2, 3), (4, 4), (3, 6), (0, 2)])
def test_expand_distance_table_gradcheck(i, j):
    torch.manual_seed(4)
    t = torch.randn(3, 2 * j - 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: posbias.expand_distance_table(x, i, j), (t,))
    close(posbias.expand_distance_table(t, i, j), R.table_to_bias(t.detach(), i, j))


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
