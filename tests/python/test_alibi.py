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
