"""ALiBi: slopes, AlibiPositionalBias and AlibiBias against the reference."""
import threading

import pytest
import torch

import reference as R

posbias = pytest.importorskip("posbias")

HEADS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128]


def close(a, b, atol=1e-6, rtol=1e-5):
    a = a.to(torch.float64)
    b = torch.as_tensor(b).to(torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.mark.parametrize("heads", HEADS)
def test_slopes(heads):
    s = posbias.alibi_slopes(heads)
    assert s.dtype == torch.float32 and s.shape == (heads,)
    close(s, R.alibi_slopes(heads), atol=0, rtol=1e-7)
    assert posbias.AlibiPositionalBias._get_slopes(heads) == pytest.approx(
        R.alibi_slopes(heads).tolist(), rel=1e-7)


@pytest.mark.parametrize("heads", [1, 3, 8, 12, 24])
@pytest.mark.parametrize("max_bias", [8.0, 4.0, 1.0, 16.0, 0.0, -1.0])
def test_max_bias_slopes(heads, max_bias):
    close(posbias.alibi_slopes(heads, max_bias), R.max_bias_slopes(heads, max_bias),
          atol=0, rtol=1e-6)


def test_max_bias_8_is_the_standard_schedule():
    for h in HEADS:
        close(posbias.alibi_slopes(h, 8.0), posbias.alibi_slopes(h), atol=0, rtol=1e-6)


@pytest.mark.parametrize("total", [1, 6, 12, 16, 40])
def test_slopes_range_is_a_slice_of_the_full_schedule(total):
    full = R.alibi_slopes(total)
    for world in (1, 2, 3, 4):
        for rank in range(world):
            h0, h1 = posbias.parallel.head_range(total, rank, world)
            got = posbias.alibi_slopes_range(total, h0, h1)
            close(got, full[h0:h1], atol=0, rtol=1e-7)
    close(posbias.alibi_slopes_range(total, 0, total, 4.0), R.max_bias_slopes(total, 4.0),
          atol=0, rtol=1e-6)


SHAPES = [(0, 0), (0, 5), (1, 1), (1, 7), (3, 3), (5, 9), (8, 15), (10, 10), (7, 3), (33, 65),
          (64, 64), (1, 1000)]


@pytest.mark.parametrize("heads,total", [(1, 1), (4, 8), (6, 6), (12, 16), (3, 5)])
@pytest.mark.parametrize("i,j", SHAPES)
def test_positional_bias_fresh(heads, total, i, j):
    m = posbias.AlibiPositionalBias(heads=heads, total_heads=total)
    out = m(i, j)
    assert out.dtype == torch.float32
    close(out, R.alibi_bias(R.alibi_slopes(heads), i, j, total))


def test_positional_bias_default_total_heads_and_custom_slopes():
    m = posbias.AlibiPositionalBias(heads=6)
    assert m(4, 6).shape == (6, 4, 6)
    m = posbias.AlibiPositionalBias(heads=99, total_heads=4, slopes=[0.5, 0.25, 0.125])
    assert m.heads == 3
    close(m(3, 4), R.alibi_bias([0.5, 0.25, 0.125], 3, 4, 4))


def test_cache_bottom_right_after_prefill_and_decode():
    """Decode after prefill: the cached [*, 16, 16] block must give the
    bottom-right rows (zeta's top-left block would be wrong)."""
    m = posbias.AlibiPositionalBias(heads=4, total_heads=8)
    calls = [(16, 16), (1, 16), (1, 9), (4, 12), (16, 16), (5, 5), (8, 15), (20, 18),
             (3, 20), (20, 20), (2, 7)]
    for i, j in calls:
        close(m(i, j), R.alibi_bias(R.alibi_slopes(4), i, j, 8))


def test_cache_is_reused_and_results_stay_valid():
    m = posbias.AlibiPositionalBias(heads=2, total_heads=3)
    big = m(10, 10)
    small = m(1, 10)
    assert small.data_ptr() == big[:, 9:, :].data_ptr()  # a view of the cache
    keep = small.clone()
    larger = m(30, 30)  # replaces the cache
    assert m.bias.shape == (3, 30, 30)
    assert torch.equal(small, keep)  # the handed-out view still holds its values
    close(larger, R.alibi_bias(R.alibi_slopes(2), 30, 30, 3))


def test_concurrent_calls():
    m = posbias.AlibiPositionalBias(heads=4, total_heads=6)
    errors = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(30):
                i = int(torch.randint(0, 20, (1,), generator=g))
                j = int(torch.randint(i, 40, (1,), generator=g))
                got = m(i, j)
                ref = R.alibi_bias(R.alibi_slopes(4), i, j, 6)
                if not torch.allclose(got.double(), ref, atol=1e-6, rtol=1e-5):
                    errors.append((i, j))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_get_bias_and_custom_positions():
    m = posbias.AlibiPositionalBias(heads=3, total_heads=4)
    for i, j in [(1, 1), (3, 7), (5, 5), (0, 3)]:
        close(m.get_bias(i, j), R.alibi_get_bias(i, j))
    q = torch.tensor([5, 6, 7, 100])
    k = torch.tensor([0, 3, 7, 50, 101, 6])
    close(m.forward_custom_pos(q, k), R.alibi_bias_custom_pos(R.alibi_slopes(3), q, k, 4))
    # Contiguous positions reproduce forward().
    close(m.forward_custom_pos(torch.arange(4, 9), torch.arange(9)), m(5, 9))
    # Any integer dtype and strides; the module's dtype (rounded once from
    # float32, as the core does); the op directly, through the core.
    q32 = torch.tensor([[5, 0], [6, 0], [7, 0], [100, 0]], dtype=torch.int32)[:, 0]
    close(m.forward_custom_pos(q32, k.to(torch.int16)), m.forward_custom_pos(q, k))
    mb = posbias.AlibiPositionalBias(heads=3, total_heads=4).to(torch.bfloat16)
    got = mb.forward_custom_pos(q, k)
    assert got.dtype == torch.bfloat16
    close(got, R.alibi_bias_custom_pos(R.alibi_slopes(3), q, k, 4), atol=0, rtol=2.0**-8)
    op = torch.ops.posbias.alibi_bias_custom_pos(R.alibi_slopes(3), -1, q, k, None)
    assert op.shape == (3, 4, 6)
    close(op, R.alibi_bias_custom_pos(R.alibi_slopes(3), q, k, 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_module_keeps_float32_slopes(dtype):
    m = posbias.AlibiPositionalBias(heads=12, total_heads=12).to(dtype)
    assert m.slopes.dtype == torch.float32
    assert torch.equal(m.slopes, R.alibi_slopes(12))  # not rounded through 16 bits
    out = m(3, 2500)
    assert out.dtype == dtype
    # Computed in float32, rounded once (fp16 holds the distances only up to 2048).
    ref = R.alibi_bias(R.alibi_slopes(12), 3, 2500).to(torch.float32).to(dtype)
    assert torch.equal(out, ref)
    m.float()
    assert m(2, 3).dtype == torch.float32 and m.slopes.dtype == torch.float32
    assert torch.equal(m.slopes, R.alibi_slopes(12))
    b = posbias.AlibiBias(3, slopes=torch.tensor([-0.1, -0.3, -0.7])).half()
    assert b.slopes.dtype == torch.float32 and b.build(2, 2).dtype == torch.float16
    assert torch.equal(b.slopes, torch.tensor([-0.1, -0.3, -0.7]))


def test_state_dict_has_no_buffers():
    m = posbias.AlibiPositionalBias(heads=4, total_heads=8)
    m(4, 4)
    assert list(m.state_dict().keys()) == []


# ------------------------------------------------------------------ AlibiBias


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len", [(0, 0), (1, 1), (3, 3), (3, 5), (4, 2), (17, 9)])
def test_alibi_bias_builder(n, causal, q_len, k_len):
    m = posbias.AlibiBias(n, causal=causal)
    out = m.build(q_len, k_len)
    assert out.shape == (1, n, q_len, k_len)
    close(out, R.seed_alibi_bias(n, causal, None, q_len, k_len))
    close(m(q_len, k_len), out)


def test_alibi_bias_seed_worked_example():
    scores = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.5, 2.5], [3.0, 2.5, 1.2]])
    m = posbias.AlibiBias(1, causal=False, slopes=torch.tensor([-0.2]))
    got = scores + m.build(3, 3)[0, 0]
    close(got, [[1.0, 1.8, 2.6], [1.8, 1.5, 2.3], [2.6, 2.3, 1.2]])


def test_alibi_bias_cache_keyed_by_dtype():
    m = posbias.AlibiBias(2, causal=True)
    a = m.build(3, 4)
    b = m.build(3, 4, dtype=torch.float16)
    assert a.dtype == torch.float32 and b.dtype == torch.float16
    assert m.build(3, 4) is not b
    assert torch.equal(m.build(3, 4), a)
    assert m.build(3, 4) is m.build(3, 4)  # repeated lengths hit the cache


def test_alibi_bias_through_the_core_op():
    """build is the op alibi_bias_build (the core's AlibiBias::build): the same
    tensor as calling the op, float32 computed and rounded once per dtype,
    float64 computed in double (the reference path, issue 18), on the
    requested device."""
    slopes = torch.tensor([-0.1, -0.3, -0.7])
    for causal in (True, False):
        m = posbias.AlibiBias(3, causal=causal, slopes=slopes)
        want = torch.ops.posbias.alibi_bias_build(slopes, 3, causal, 5, 7, None)
        assert torch.equal(m.build(5, 7), want)
        ref = R.seed_alibi_bias(3, causal, slopes, 5, 7).to(torch.float32)
        assert torch.equal(want, ref)  # one float32 product, exactly the reference's
        for dtype in (torch.bfloat16, torch.float16):
            got = m.build(5, 7, dtype=dtype)
            assert got.dtype == dtype and torch.equal(got, ref.to(dtype))
        got = m.build(5, 7, dtype=torch.float64)
        assert got.dtype == torch.float64
        assert torch.equal(got, R.seed_alibi_bias(3, causal, slopes, 5, 7))  # double products
        assert m.build(5, 7, device="cpu").device.type == "cpu"
    # The seed's default slopes are torch.linspace itself, bit for bit.
    m = posbias.AlibiBias(12)
    assert torch.equal(m.slopes, torch.linspace(-0.05, -0.5, steps=12))
    # Not trainable: no gradient reaches the slopes.
    s = torch.tensor([-0.25, -0.5], requires_grad=True)
    assert not torch.ops.posbias.alibi_bias_build(s, 2, True, 3, 3, None).requires_grad
    assert not posbias.AlibiBias(2, slopes=s).build(3, 3).requires_grad


def test_alibi_bias_module_surface():
    m = posbias.AlibiBias(4, causal=False)
    assert repr(m) == "AlibiBias(n_heads=4, causal=False)"
    assert list(m.state_dict().keys()) == []
    assert m.build(0, 3).shape == (1, 4, 0, 3)
    with pytest.raises(ValueError, match=r"AlibiBias::build: lengths must be >= 0, got i = -1, j = 2"):
        m.build(-1, 2)
    with pytest.raises(TypeError, match="q_len must be an int"):
        m.build(1.5, 2)
    with pytest.raises(TypeError, match="dtype must be floating"):
        m.build(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"AlibiBias: slope 1 is not finite \(inf\)"):
        posbias.AlibiBias(2, slopes=[-0.5, float("inf")])
    with pytest.raises(TypeError, match="slopes must be a floating tensor"):
        posbias.AlibiBias(2, slopes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="AlibiBias: n_heads must be >= 1, got -2"):
        posbias.AlibiBias(-2)


# ------------------------------------------------------- alibi_distance_table


@pytest.mark.parametrize("heads", [1, 3, 8, 12])
@pytest.mark.parametrize("j", [1, 2, 5, 33])
def test_alibi_distance_table(heads, j):
    slopes = posbias.alibi_slopes(heads)
    table = posbias.alibi_distance_table(slopes, j)
    assert table.dtype == torch.float32 and table.shape == (heads, 2 * j - 1)
    # One float32 product of the slope and the exact distance: the float64
    # reference rounded once.
    assert torch.equal(table, R.alibi_distance_table(slopes, j).to(torch.float32))
    # Past keys only (signed=False): -m max(d, 0), d = e - (j - 1).
    past = torch.ops.posbias.alibi_distance_table(slopes, j, False)
    d = (torch.arange(2 * j - 1) - (j - 1)).clamp_min(0).to(torch.float64)
    assert torch.equal(past, (-slopes.to(torch.float64)[:, None] * d[None]).to(torch.float32))
    # Expanded, it is the ALiBi bias.
    for i in range(j + 1):
        assert torch.equal(posbias.expand_distance_table(table, i, j),
                           torch.ops.posbias.alibi_bias(slopes, i, j, -1, None))


def test_alibi_distance_table_is_a_core_call():
    # Not differentiable, as before: the result never requires grad.
    s = torch.tensor([0.5, 0.25], requires_grad=True)
    assert not posbias.alibi_distance_table(s, 4).requires_grad
    assert torch.equal(posbias.alibi_distance_table(s.to(torch.bfloat16), 2),
                       torch.tensor([[-0.5, 0.0, -0.5], [-0.25, 0.0, -0.25]]))
    with pytest.raises(ValueError, match="alibi_distance_table: j must be >= 1, got 0"):
        posbias.alibi_distance_table(s, 0)
    with pytest.raises(ValueError, match="alibi_distance_table: need at least one slope, got 0"):
        posbias.alibi_distance_table(torch.zeros(0), 3)
    with pytest.raises(ValueError, match=r"alibi_distance_table: slope 0 is not finite \(nan\)"):
        posbias.alibi_distance_table(torch.tensor([float("nan")]), 3)
    with pytest.raises(ValueError, match="2j - 1 overflows int64"):
        posbias.alibi_distance_table(s, 2**63 - 1)
    with pytest.raises(ValueError, match="slopes must be 1-d"):
        posbias.alibi_distance_table(torch.ones(2, 2), 3)
    with pytest.raises(TypeError, match="slopes must be a floating tensor"):
        posbias.alibi_distance_table(torch.ones(2, dtype=torch.int32), 3)
