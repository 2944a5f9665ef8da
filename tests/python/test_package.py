"""The package itself: one version, typed, documented, and torch's thread count
for the core's kernels (issue 18, items 1 and 2)."""
import inspect
import os
import subprocess
import sys
import threading

import torch

import posbias

PUBLIC_CALLABLES = ("AlibiBias", "AlibiPositionalBias", "DynamicPositionBias",
                    "RelativePositionBias", "alibi_distance_table", "alibi_slopes",
                    "alibi_slopes_range", "attention", "attention_lse", "expand_distance_table")


def test_one_version():
    assert posbias.__version__ == torch.ops.posbias.version()
    expected = os.environ.get("POSBIAS_CMAKE_VERSION")  # set by ctest
    if expected:
        assert posbias.__version__ == expected


def test_typed_and_documented():
    pkg = os.path.dirname(posbias.__file__)
    assert os.path.isfile(os.path.join(pkg, "py.typed"))
    for name in PUBLIC_CALLABLES:
        obj = getattr(posbias, name)
        assert obj.__doc__ and len(obj.__doc__) > 40, name
        fn = obj.__init__ if inspect.isclass(obj) else obj
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != "self"]
        assert any(p.annotation is not inspect.Parameter.empty for p in params), name
    text = subprocess.run([sys.executable, "-c", "import posbias; help(posbias.attention)"],
                          capture_output=True, text=True, env=dict(os.environ, PAGER="cat"),
                          timeout=120).stdout
    assert "Fused attention with a positional bias" in text
    assert "causal: bool = False" in text


def _in_new_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_ops_follow_torch_set_num_threads():
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1, 3):
            torch.set_num_threads(n)
            # This thread and a fresh one (whose OpenMP default is every CPU).
            assert torch.ops.posbias._num_threads() == n
            assert _in_new_thread(torch.ops.posbias._num_threads) == n
            # A real op from a fresh thread, then the count it ran with.
            _in_new_thread(lambda: posbias.AlibiPositionalBias(4)(64, 64))
            assert _in_new_thread(torch.ops.posbias._num_threads) == n
    finally:
        torch.set_num_threads(before)


def test_default_is_torchs():
    code = ("import threading, torch, posbias; r = [];"
            "t = threading.Thread(target=lambda: r.append(torch.ops.posbias._num_threads()));"
            "t.start(); t.join(); print(torch.get_num_threads(), r[0])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    torch_default, ours = out.stdout.split()
    assert torch_default == ours
