"""posbias.attention / attention_lse against the reference (materialised bias,
masked softmax, float64), over many shapes and every bias kind; gradients for
q, k, v, table and dense."""
import math

import pytest
import torch

import reference as R

posbias = pytest.importorskip("posbias")

OUT_TOL = dict(atol=1e-5, rtol=1e-4)


def close(a, b, atol=1e-5, rtol=1e-4):
    torch.testing.assert_close(a.detach().to(torch.float64),
                               torch.as_tensor(b).detach().to(torch.float64),
                               atol=atol, rtol=rtol, equal_nan=True)


def make(b, h, hk, i, j, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, i, d, generator=g).to(dtype)
    k = torch.randn(b, hk, j, d, generator=g).to(dtype)
    v = torch.randn(b, hk, j, d, generator=g).to(dtype)
    return q, k, v


def ref_bias(kind, h, i, j, slopes=None, table=None, dense=None):
    if kind == "none":
        return None
    if kind == "alibi":
        return R.alibi_bias(slopes, i, j)[None]
    if kind == "table":
        return R.table_to_bias(table.to(torch.float64), i, j)[None]
    return dense.to(torch.float64)


def bias_args(kind, b, h, i, j, seed=1):
    g = torch.Generator().manual_seed(seed)
    if kind == "alibi":
        return {"slopes": posbias.alibi_slopes(h)}
    if kind == "table":
        return {"table": torch.randn(h, 2 * j - 1, generator=g)}
    if kind == "dense":
        return {"dense": torch.randn(b, h, i, j, generator=g)}
    return {}


SHAPES = [  # b, h, hk, i, j, d
    (1, 1, 1, 1, 1, 1), (1, 2, 2, 5, 5, 4), (2, 4, 2, 7, 7, 8), (1, 4, 1, 3, 11, 16),
    (1, 8, 8, 1, 33, 64), (2, 3, 3, 17, 17, 5), (1, 6, 2, 64, 64, 32), (1, 2, 1, 130, 130, 8),
    (1, 2, 2, 70, 200, 16), (1, 12, 4, 9, 40, 24),
]


@pytest.mark.parametrize("kind", ["none", "alibi", "table", "dense"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_matches_reference(kind, causal, shape):
    b, h, hk, i, j, d = shape
    q, k, v = make(b, h, hk, i, j, d, seed=sum(shape))
    kw = bias_args(kind, b, h, i, j)
    out = posbias.attention(q, k, v, kind, causal=causal, **kw)
    assert out.shape == (b, h, i, d) and out.dtype == torch.float32
    ref = R.attention(q, k, v, ref_bias(kind, h, i, j, **kw), causal=causal)
    close(out, ref, **OUT_TOL)
    # The bias kind is inferred from the tensor given.
    close(posbias.attention(q, k, v, causal=causal, **kw), out, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["none", "alibi", "table", "dense"])
@pytest.mark.parametrize("causal", [False, True])
def test_lse(kind, causal):
    b, h, hk, i, j, d = 2, 4, 2, 9, 13, 8
    q, k, v = make(b, h, hk, i, j, d, seed=3)
    kw = bias_args(kind, b, h, i, j)
    out, lse = posbias.attention_lse(q, k, v, kind, causal=causal, scale=0.3, **kw)
    ref, ref_lse = R.attention(q, k, v, ref_bias(kind, h, i, j, **kw), causal=causal,
                               scale=0.3, return_lse=True)
    close(out, ref, **OUT_TOL)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, i)
    close(lse, ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kind", ["none", "alibi", "dense"])
def test_more_queries_than_keys(kind):
    """i > j: query positions go negative; causal rows before the first key
    output zeros (lse -inf)."""
    b, h, hk, i, j, d = 1, 2, 2, 9, 4, 8
    q, k, v = make(b, h, hk, i, j, d, seed=4)
    kw = bias_args(kind, b, h, i, j)
    for causal in (False, True):
        out, lse = posbias.attention_lse(q, k, v, kind, causal=causal, **kw)
        ref, ref_lse = R.attention(q, k, v, ref_bias(kind, h, i, j, **kw), causal=causal,
                                   return_lse=True)
        close(out, ref, **OUT_TOL)
        close(lse, ref_lse, atol=1e-4, rtol=1e-5)
        if causal:
            assert torch.equal(out[:, :, :i - j], torch.zeros_like(out[:, :, :i - j]))
            assert bool(torch.isneginf(lse[:, :, :i - j]).all())


def test_all_masked_dense_row_gives_zeros():
    q, k, v = make(1, 2, 2, 4, 6, 8, seed=5)
    dense = torch.zeros(1, 1, 4, 6)
    dense[..., 2, :] = float("-inf")
    out = posbias.attention(q, k, v, dense=dense)
    assert torch.equal(out[:, :, 2], torch.zeros(1, 2, 8))
    ref = R.attention(q, k, v, dense)
    close(out, ref, **OUT_TOL)


@pytest.mark.parametrize("dense_shape", [(1, 1, 1, 7), (4, 7), (2, 1, 5, 7), (1, 3, 1, 1), (7,)])
def test_dense_broadcast(dense_shape):
    q, k, v = make(2, 3, 3, 5, 7, 4, seed=6)
    dense = torch.randn(dense_shape) if dense_shape != (4, 7) else None
    if dense is None:
        pytest.raises(ValueError, posbias.attention, q, k, v, dense=torch.randn(4, 7))
        return
    close(posbias.attention(q, k, v, dense=dense), R.attention(q, k, v, dense), **OUT_TOL)


def test_non_contiguous_inputs():
    """A [b, len, h, d] buffer passed as x.transpose(1, 2)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 10, 4, 8, generator=g)
    y = torch.randn(2, 12, 2, 8, generator=g)
    q, k, v = x.transpose(1, 2), y.transpose(1, 2), (y * 2).transpose(1, 2)
    assert not q.is_contiguous()
    s = posbias.alibi_slopes(4)
    out = posbias.attention(q, k, v, slopes=s, causal=True)
    close(out, R.attention(q, k, v, R.alibi_bias(s, 10, 12)[None], causal=True), **OUT_TOL)
    table = torch.randn(4, 50)[:, ::2]  # strided table, n = 25 > 2j - 1, read at its centre
    close(posbias.attention(q, k, v, table=table, causal=True),
          R.attention(q, k, v, R.centred_table_to_bias(table.double(), 10, 12)[None], causal=True),
          **OUT_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["none", "alibi", "table"])
def test_16_bit(dtype, kind):
    b, h, hk, i, j, d = 1, 4, 2, 33, 40, 16
    q, k, v = make(b, h, hk, i, j, d, dtype=dtype, seed=8)
    kw = bias_args(kind, b, h, i, j)
    out = posbias.attention(q, k, v, kind, causal=True, **kw)
    assert out.dtype == dtype
    ref = R.attention(q, k, v, ref_bias(kind, h, i, j, **kw), causal=True)
    eps = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    close(out, ref, atol=1e-4, rtol=eps)  # one rounding of the output


def test_default_scale_and_custom_scale():
    q, k, v = make(1, 2, 2, 5, 5, 9, seed=9)
    close(posbias.attention(q, k, v), posbias.attention(q, k, v, scale=1 / math.sqrt(9)),
          atol=1e-7, rtol=1e-6)
    close(posbias.attention(q, k, v, scale=2.5), R.attention(q, k, v, scale=2.5), **OUT_TOL)


def test_module_tables_feed_attention():
    """DynamicPositionBias / RelativePositionBias tables in the fused op equal
    the materialised [heads, i, j] biases added to the scores."""
    torch.manual_seed(10)
    dpb = posbias.DynamicPositionBias(16, 4)
    t5 = posbias.RelativePositionBias(scale=1.0, causal=True, num_buckets=16, max_distance=32,
                                      heads=4)
    q, k, v = make(1, 4, 4, 6, 20, 8, seed=10)
    for mod in (dpb, t5):
        with torch.no_grad():
            out = posbias.attention(q, k, v, table=mod.distance_table(20), causal=True)
            ref = R.attention(q, k, v, mod(6, 20)[None], causal=True)
        close(out, ref, **OUT_TOL)


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("kind", ["none", "alibi", "table", "dense"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 5, 5, 4), (2, 4, 2, 3, 7, 8), (1, 2, 1, 16, 16, 8)])
def test_gradients_match_reference_autograd(kind, causal, shape):
    b, h, hk, i, j, d = shape
    q, k, v = make(b, h, hk, i, j, d, seed=11)
    kw = bias_args(kind, b, h, i, j)
    leaves = [q, k, v] + ([kw[x] for x in ("table", "dense") if x in kw])
    for t in leaves:
        t.requires_grad_()
    g = torch.randn(b, h, i, d, generator=torch.Generator().manual_seed(12))
    (posbias.attention(q, k, v, kind, causal=causal, **kw) * g).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rq, rk, rv = ref_leaves[:3]
    rkw = {}
    if kind in ("table", "dense"):
        rkw[kind] = ref_leaves[3]
    if kind == "alibi":
        rkw["slopes"] = kw["slopes"]
    (R.attention(rq, rk, rv, ref_bias(kind, h, i, j, **rkw), causal=causal) *
     g.double()).sum().backward()
    for t, r in zip(leaves, ref_leaves):
        close(t.grad, r.grad, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("kind", ["none", "alibi", "table"])
def test_gradcheck(kind):
    """torch.autograd.gradcheck of the op with respect to q, k, v and the table.
    This is the finite-difference check of the float32 path (float64 takes the
    core's double reference path, gradchecked in test_float64.py): eps 1e-2 on
    O(1) inputs, tolerance atol 2e-3 + rtol 2e-2 (float32 rounding of the
    difference quotient is about 1e-7 / 1e-2 = 1e-5; the central difference's
    third-order term about eps^2 = 1e-4). The tight check of the same gradients is
    test_gradients_match_reference_autograd (float64 reference, 1e-4)."""
    assert posbias.attention(*(torch.zeros(1, 1, 1, 1, dtype=torch.float64),) * 3).dtype == \
        torch.float64
    b, h, hk, i, j, d = 1, 2, 1, 3, 4, 3
    q, k, v = (t.requires_grad_() for t in make(b, h, hk, i, j, d, seed=13))
    inputs = [q, k, v]
    if kind == "table":
        inputs.append(torch.randn(h, 2 * j - 1, requires_grad=True))
    slopes = posbias.alibi_slopes(h) if kind == "alibi" else None

    def f(*xs):
        return posbias.attention(xs[0], xs[1], xs[2], kind, slopes=slopes,
                                 table=xs[3] if kind == "table" else None, causal=True)

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-2, atol=2e-3, rtol=2e-2)
