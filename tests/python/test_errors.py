"""Bad input from Python: clear exceptions naming the bad values, never a crash."""
import os
import subprocess
import sys

import pytest
import torch

posbias = pytest.importorskip("posbias")


def qkv(b=1, h=2, hk=2, i=3, j=4, d=8, dtype=torch.float32):
    return (torch.randn(b, h, i, d).to(dtype), torch.randn(b, hk, j, d).to(dtype),
            torch.randn(b, hk, j, d).to(dtype))


def test_attention_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError,
                       match="q must be float32, bfloat16, float16 or float64, got Long"):
        posbias.attention(q.long(), k, v)
    with pytest.raises(TypeError, match="q, k and v must have one dtype, got Float, Half, Float"):
        posbias.attention(q, k.half(), v)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        posbias.attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="slopes must be a floating tensor, got Long"):
        posbias.attention(q, k, v, slopes=torch.tensor([1, 2]))


def test_attention_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\(4-d\), got q \[2, 3, 8\]"):
        posbias.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"k and v must have the same shape .*k \[1, 2, 4, 8\], v \[1, 2, 5, 8\]"):
        posbias.attention(q, k, torch.randn(1, 2, 5, 8))
    with pytest.raises(ValueError, match="same head dimension d"):
        posbias.attention(q, torch.randn(1, 2, 4, 7), torch.randn(1, 2, 4, 7))
    with pytest.raises(ValueError, match="same batch size"):
        posbias.attention(q, torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8))
    q3 = torch.randn(1, 3, 3, 8)
    with pytest.raises(ValueError, match="query heads h = 3 must be a multiple of the key/value heads hk = 2"):
        posbias.attention(q3, k, v)
    with pytest.raises(ValueError, match="d must be >= 1, got 0"):
        z = torch.randn(1, 2, 3, 0)
        posbias.attention(z, torch.randn(1, 2, 4, 0), torch.randn(1, 2, 4, 0))


def test_attention_bias_arguments():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="unknown bias 'rope'"):
        posbias.attention(q, k, v, "rope")
    with pytest.raises(ValueError, match="needs slopes"):
        posbias.attention(q, k, v, "alibi")
    with pytest.raises(ValueError, match="does not use table"):
        posbias.attention(q, k, v, "alibi", slopes=torch.ones(2), table=torch.zeros(2, 7))
    with pytest.raises(ValueError, match="at most one of"):
        posbias.attention(q, k, v, slopes=torch.ones(2), dense=torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"ALiBi needs .*one set per sequence.*got 3"):
        posbias.attention(q, k, v, slopes=torch.ones(3))
    with pytest.raises(ValueError, match=r"slope 1 is not finite \(nan\)"):
        posbias.attention(q, k, v, slopes=torch.tensor([1.0, float("nan")]))
    # The core's centred-table rule (issue 16): n odd, long enough for the
    # longest visible distance.
    with pytest.raises(ValueError, match=r"h = 2 and n odd \(read at its centre \(n - 1\) / 2\), "
                       r"got float32 table \[2, 6\]"):
        posbias.attention(q, k, v, table=torch.zeros(2, 6))
    with pytest.raises(ValueError, match=r"\[h, n\] = \[2, 5\] is read at its centre \(n - 1\) / 2 "
                       r"= 2 and must cover the longest visible distance 3: n >= 7"):
        posbias.attention(q, k, v, table=torch.zeros(2, 5))
    # i > j without causal: allowed now when the centred table reaches the
    # rows before key 0 (the core's rule of issue 16), refused when it does not.
    with pytest.raises(ValueError, match=r"the longest visible distance 4: n >= 9"):
        posbias.attention(*qkv(i=5, j=3), table=torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"dense bias \[1, 2, 3, 5\] .* broadcastable to \[b, h, i, j\] = \[1, 2, 3, 4\]"):
        posbias.attention(q, k, v, dense=torch.zeros(1, 2, 3, 5))
    with pytest.raises(ValueError, match="scale must be finite"):
        posbias.attention(q, k, v, scale=float("inf"))
    with pytest.raises(TypeError, match="causal must be a bool"):
        posbias.attention(q, k, v, causal=1)
    with pytest.raises(TypeError, match="bias must be a str"):
        posbias.attention(q, k, v, torch.zeros(3, 4))


def test_attention_device():
    q, k, v = qkv()
    meta = torch.empty(1, 2, 3, 8, device="meta")
    with pytest.raises(ValueError, match="q is on meta; the posbias ops run on the CPU"):
        posbias.attention(meta, k, v)


def test_module_device():
    """posbias is CPU-only: a module moved to another device says so (meta
    stands in for CUDA, which this machine does not have)."""
    m = posbias.DynamicPositionBias(4, 2).to("meta")
    with pytest.raises(ValueError, match="is on meta; the posbias ops run on the CPU"):
        m(2, 3)
    t5 = posbias.RelativePositionBias(scale=1.0, heads=2).to("meta")
    with pytest.raises(ValueError, match="is on meta; the posbias ops run on the CPU"):
        t5.distance_table(3)


def test_op_level_errors_are_value_errors():
    """Called directly (no Python checks), the op refuses too: the core's
    std::invalid_argument arrives as ValueError with the core's message (it was
    a RuntimeError before the ops translated the core's errors)."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"ALiBi needs .*one set per sequence.*got 3"):
        torch.ops.posbias.attention(q, k, v, "alibi", torch.ones(3), None, None, None, False)
    with pytest.raises(ValueError, match="bias must be"):
        torch.ops.posbias.attention(q, k, v, "bogus", None, None, None, None, False)
    with pytest.raises(ValueError, match="heads"):
        torch.ops.posbias.alibi_slopes(0)
    with pytest.raises(ValueError, match=r"the table length n = 8 \(table \[2, 8\]\) must be odd"):
        torch.ops.posbias.expand_distance_table(torch.zeros(2, 8), 2, 3, None)
    with pytest.raises(ValueError, match="reduce_distance_table"):
        torch.ops.posbias.reduce_distance_table(torch.zeros(2, 3, 4), 5)
    # float64 tables and attention take the reference path (test_float64.py); integers are
    # refused.
    with pytest.raises(TypeError,
                       match="table must be float32, bfloat16, float16 or float64, got Int"):
        torch.ops.posbias.expand_distance_table(torch.zeros(2, 7, dtype=torch.int32), 2, 3, None)
    with pytest.raises(TypeError, match="q must be float32, bfloat16, float16 or float64, got Int"):
        q32 = torch.zeros(1, 1, 2, 4, dtype=torch.int32)
        torch.ops.posbias.attention(q32, q32, q32, "none", None, None, None, None, False)


def test_alibi_modules():
    with pytest.raises(ValueError, match="total_heads must be >= heads, got total_heads = 4, heads = 8"):
        posbias.AlibiPositionalBias(heads=8, total_heads=4)
    with pytest.raises(ValueError, match="heads must be >= 1, got 0"):
        posbias.AlibiPositionalBias(heads=0)
    with pytest.raises(TypeError, match="heads must be an int, got float"):
        posbias.AlibiPositionalBias(heads=2.5)
    m = posbias.AlibiPositionalBias(heads=2)
    with pytest.raises(ValueError, match="lengths must be >= 0, got i = -1, j = 3"):
        m(-1, 3)
    with pytest.raises(TypeError, match="j must be an int"):
        m(1, "3")
    with pytest.raises(TypeError, match="q_pos must be an integer tensor, got Float"):
        m.forward_custom_pos(torch.tensor([0.5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="k_pos must be 1-d, got 2-d"):
        m.forward_custom_pos(torch.tensor([0]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="AlibiBias: slopes must have n_heads = 3 entries, got 2"):
        posbias.AlibiBias(3, slopes=torch.tensor([-0.1, -0.2]))
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        posbias.AlibiBias(0)
    with pytest.raises(ValueError, match=r"head range \[5, 3\) must satisfy 0 <= h0 <= h1 <= total_heads = 8"):
        posbias.alibi_slopes_range(8, 5, 3)
    with pytest.raises(ValueError, match="heads must be >= 1"):
        posbias.alibi_slopes(0)
    # Checked by the core when the module is built (an empty build is a core call).
    with pytest.raises(ValueError, match=r"slope 1 is not finite \(nan\)"):
        posbias.AlibiPositionalBias(heads=2, slopes=[-0.5, float("nan")])
    with pytest.raises(ValueError, match="need at least one slope, got 0"):
        posbias.AlibiPositionalBias(heads=2, slopes=[])
    with pytest.raises(ValueError, match="max_bias must be finite, got inf"):
        posbias.alibi_slopes(4, max_bias=float("inf"))


def test_dpb_and_t5():
    m = posbias.DynamicPositionBias(8, 2)
    with pytest.raises(ValueError, match="needs 0 <= i <= j .* got i = 6, j = 5"):
        m(6, 5)
    with pytest.raises(ValueError, match="dim must be >= 1"):
        posbias.DynamicPositionBias(0, 2)
    with pytest.raises(RuntimeError, match="mlp.4.weight"):
        m.load_state_dict({"mlp.0.weight": torch.zeros(8, 1)})
    with pytest.raises(ValueError, match="j must be >= 1, got 0"):
        m.distance_table(0)
    with pytest.raises(ValueError, match=r"mlp.0.bias.*expected shape \[8\], got \[5\]"):
        torch.ops.posbias.dpb_distance_table(
            [torch.zeros(8, 1), torch.zeros(5), torch.zeros(8, 8), torch.zeros(8),
             torch.zeros(2, 8), torch.zeros(2)], 3)
    with pytest.raises(ValueError, match=r"num_buckets must be >= 4 \(two-sided"):
        posbias.RelativePositionBias(scale=1.0, num_buckets=2)
    with pytest.raises(ValueError, match="scale must be finite, got inf"):
        posbias.RelativePositionBias(scale=float("inf"))
    t5 = posbias.RelativePositionBias(scale=1.0, heads=2)
    with pytest.raises(ValueError, match="i <= j"):
        t5(3, 2)
    # The expansion's errors are the core's (its table is read at its centre).
    with pytest.raises(ValueError,
                       match=r"too short for i = 2, j = 5: .* n >= 2 max\(i, j\) - 1 = 9"):
        posbias.expand_distance_table(torch.zeros(2, 7), 2, 5)
    with pytest.raises(ValueError, match="n = 8 .* must be odd"):
        posbias.expand_distance_table(torch.zeros(2, 8), 2, 5)
    with pytest.raises(ValueError, match="i and j must be >= 0, got i = -1, j = 5"):
        posbias.expand_distance_table(torch.zeros(2, 9), -1, 5)
    with pytest.raises(TypeError, match="i must be an int"):
        posbias.expand_distance_table(torch.zeros(2, 9), 1.0, 5)
    with pytest.raises(TypeError, match="float32, bfloat16, float16 or float64, got Long"):
        posbias.expand_distance_table(torch.zeros(2, 9, dtype=torch.long), 1, 5)


def test_parallel_arguments():
    with pytest.raises(ValueError, match="rank 2 is not below world_size 2"):
        posbias.parallel.split_range(10, 2, 2)
    with pytest.raises(RuntimeError, match="not initialised"):
        posbias.parallel.gather_heads(torch.zeros(1, 1, 1, 1))
    q = torch.zeros(1, 2, 2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="forward-only"):
        posbias.parallel.cp_attention(q, q, q, q_start=0, k_start=0, total_keys=2)


def test_safetensors_errors(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="runs past the end"):
        posbias.safetensors.load_file(str(p))
    p.write_bytes(b"abc")
    with pytest.raises(ValueError, match="shorter than 8 bytes"):
        posbias.safetensors.load_file(str(p))
    good = tmp_path / "ok.safetensors"
    sd = {"a": torch.randn(3, 2), "b": torch.arange(5), "c": torch.randn(4).half()}
    posbias.safetensors.save_file(sd, str(good))
    back = posbias.safetensors.load_file(str(good))
    assert set(back) == set(sd) and all(torch.equal(back[n], sd[n]) for n in sd)


def test_missing_library_is_a_clear_import_error(tmp_path):
    """With POSBIAS_TORCH_OPS pointing nowhere and no library beside a copy of
    the package, the import fails naming both places."""
    import shutil
    pkg_src = os.path.dirname(posbias.__file__)
    pkg = tmp_path / "posbias"
    shutil.copytree(pkg_src, pkg, ignore=shutil.ignore_patterns("*.so*", "__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), POSBIAS_TORCH_OPS="/nonexistent/lib.so")
    r = subprocess.run([sys.executable, "-c", "import posbias"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "POSBIAS_TORCH_OPS=/nonexistent/lib.so (no such file)" in r.stderr
    assert str(pkg / "libposbias_torch_ops.so") in r.stderr
