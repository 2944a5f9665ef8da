"""Drop-in for zeta and x-transformers (issue 18, item 3): module names and
constructor arguments, state-dict keys (checkpoints of the originals' layouts
load strict), casts that keep the slopes float32, torch-like repr, misspelled
keywords raising TypeError, and a non-CPU tensor refused with "CPU-only"."""
import pytest
import torch
from torch import nn

import posbias
import reference as R


# ----------------------------------------------------- names and constructors

def test_zeta_names_and_positional_arguments():
    from posbias import AlibiPositionalBias, DynamicPositionBias  # zeta.nn's names
    assert AlibiPositionalBias(4, 8)(3, 5).shape == (8, 3, 5)
    assert DynamicPositionBias(16, 4)(3, 5).shape == (4, 3, 5)


def test_x_transformers_names_and_keywords():
    from posbias import AlibiPositionalBias, DynamicPositionBias, RelativePositionBias
    assert AlibiPositionalBias(heads=4, total_heads=8)(2, 2).shape == (8, 2, 2)
    dpb = DynamicPositionBias(dim=16, heads=4, depth=2, log_distance=True, norm=True)
    assert dpb(4, 4).shape == (4, 4, 4)
    rpb = RelativePositionBias(scale=0.125, causal=True, num_buckets=32, max_distance=128,
                               heads=8)
    assert rpb(4, 6).shape == (8, 4, 6)


# ---------------------------------------------------------------- state dicts

class ZetaDpb(nn.Module):
    """zeta's DynamicPositionBias layout (written here from its documentation)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim), nn.SiLU(),
                                 nn.Linear(dim, heads))


class XtDpb(nn.Module):
    """x-transformers' DynamicPositionBias layout."""

    def __init__(self, dim, heads, depth, norm):
        super().__init__()

        def block(n_in):
            return nn.Sequential(nn.Linear(n_in, dim), nn.LayerNorm(dim) if norm else nn.Identity(),
                                 nn.SiLU())
        self.mlp = nn.ModuleList([block(1)] + [block(dim) for _ in range(depth - 1)] +
                                 [nn.Linear(dim, heads)])


def test_zeta_dpb_checkpoint_loads_strict():
    torch.manual_seed(0)
    theirs = ZetaDpb(32, 4)
    ours = posbias.DynamicPositionBias(32, 4)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ref = R.zeta_dpb_bias(theirs.state_dict(), 5, 7)
    torch.testing.assert_close(ours(5, 7).double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depth,norm,log_distance", [(1, False, False), (2, True, False),
                                                     (3, False, True)])
def test_x_transformers_dpb_checkpoint_loads_strict(depth, norm, log_distance):
    torch.manual_seed(1)
    theirs = XtDpb(16, 3, depth, norm)
    ours = posbias.DynamicPositionBias(16, heads=3, depth=depth, log_distance=log_distance,
                                       norm=norm)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    layers = []
    for blk in theirs.mlp[:-1]:
        layers.append(dict(type="linear", weight=blk[0].weight.double(),
                           bias=blk[0].bias.double()))
        if norm:
            layers.append(dict(type="layernorm", weight=blk[1].weight.double(),
                               bias=blk[1].bias.double(), eps=1e-5))
        layers.append(dict(type="silu"))
    layers.append(dict(type="linear", weight=theirs.mlp[-1].weight.double(),
                       bias=theirs.mlp[-1].bias.double()))
    ref = R.xt_dpb_bias(layers, log_distance, 6, 6)
    torch.testing.assert_close(ours(6, 6).double(), ref, rtol=1e-5, atol=1e-5)


def test_alibi_and_t5_state_dict_keys():
    # zeta / x-transformers register slopes and bias as non-persistent buffers.
    assert list(posbias.AlibiPositionalBias(4, 8).state_dict()) == []
    posbias.AlibiPositionalBias(4, 8).load_state_dict({}, strict=True)
    rpb = posbias.RelativePositionBias(scale=1.0, heads=4)
    assert list(rpb.state_dict()) == ["relative_attention_bias.weight"]
    rpb.load_state_dict({"relative_attention_bias.weight": torch.randn(32, 4)}, strict=True)


# ----------------------------------------------------------------------- casts

@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                  lambda m: m.to(dtype=torch.float16),
                                  lambda m: m.to("cpu", torch.bfloat16)])
def test_casts_keep_slopes_float32(cast):
    expected = posbias.alibi_slopes(8)
    for module in (posbias.AlibiPositionalBias(8), posbias.AlibiBias(8)):
        cast(module)
        assert module.slopes.dtype == torch.float32
        torch.testing.assert_close(module.slopes, expected if isinstance(
            module, posbias.AlibiPositionalBias) else torch.linspace(-0.05, -0.5, 8),
            rtol=0, atol=0)
    m = cast(posbias.AlibiPositionalBias(8))
    out = m(4, 4)
    assert out.dtype in (torch.bfloat16, torch.float16)
    torch.testing.assert_close(out.float(), R.alibi_bias(expected, 4, 4).to(out.dtype).float())


# ------------------------------------------------------------------------ repr

def test_repr_like_torch_modules():
    assert repr(posbias.AlibiPositionalBias(4, 8)) == "AlibiPositionalBias(heads=4, total_heads=8)"
    assert repr(posbias.AlibiBias(2, causal=False)) == "AlibiBias(n_heads=2, causal=False)"
    r = repr(posbias.DynamicPositionBias(64, 8))
    assert r.startswith("DynamicPositionBias(\n  dim=64, heads=8\n  (mlp): Sequential(\n"), r
    assert "(0): Linear(in_features=1, out_features=64, bias=True)" in r
    r = repr(posbias.RelativePositionBias(scale=0.5, heads=2))
    assert r.startswith("RelativePositionBias(\n  scale=0.5, causal=False, num_buckets=32, "
                        "max_distance=128, heads=2\n  (relative_attention_bias): Embedding(32, 2)")


# ---------------------------------------------------- misspelled keywords

@pytest.mark.parametrize("make", [
    lambda: posbias.AlibiPositionalBias(4, totl_heads=8),
    lambda: posbias.AlibiPositionalBias(heads=4, slope=[0.5] * 4),
    lambda: posbias.AlibiBias(4, casual=True),
    lambda: posbias.DynamicPositionBias(16, heads=4, dept=2),
    lambda: posbias.DynamicPositionBias(16, 4, log_distances=True),
    lambda: posbias.RelativePositionBias(1.0, num_bucket=16),
    lambda: posbias.alibi_slopes(8, maxbias=8.0),
    lambda: posbias.attention(*(torch.randn(1, 2, 3, 4),) * 3, casual=True),
    lambda: posbias.attention(*(torch.randn(1, 2, 3, 4),) * 3, slope=torch.ones(2)),
    lambda: posbias.expand_distance_table(torch.zeros(2, 5), 3, 3, dtyp=torch.float32),
])
def test_misspelled_keywords_raise_type_error(make):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        make()


# ------------------------------------------------------------------ devices

class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on cuda:0 (this machine has no CUDA)."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    @property
    def is_cpu(self):  # what the checks read first (a real CUDA tensor's is False)
        return False


def test_cuda_tensor_says_cpu_only():
    q = torch.randn(1, 2, 3, 4).as_subclass(FakeCuda)
    assert q.device.type == "cuda" and not q.is_cpu
    with pytest.raises(ValueError, match="q is on cuda:0.*posbias is CPU-only"):
        posbias.attention(q, q, q)
    cache = torch.randn(2, 4, 1, 4)
    with pytest.raises(ValueError, match="k_cache is on cuda:0.*posbias is CPU-only"):
        posbias.attention_with_kvcache(torch.randn(1, 1, 1, 4), cache.as_subclass(FakeCuda), cache,
                                       torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="posbias is CPU-only"):
        posbias.attention_lse(q, q, q)


def test_non_cpu_module_says_cpu_only():
    """A module moved off the CPU (meta here: the check is the device type)."""
    q = torch.randn(1, 2, 3, 4, device="meta")
    with pytest.raises(ValueError, match="posbias is CPU-only"):
        posbias.attention(q, q, q)
    with pytest.raises(ValueError, match="posbias is CPU-only"):
        posbias.DynamicPositionBias(16, 4).to("meta")(3, 3)
    with pytest.raises(ValueError, match="posbias is CPU-only"):
        posbias.RelativePositionBias(1.0, heads=2).to("meta")(3, 3)
