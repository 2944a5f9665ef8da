"""Every case of the golden vectors (tests/data/golden/golden.json) through the
Python package and ops. Tolerance (golden README): |a - b| <= 1e-6 + 1e-5 |b|,
attention outputs 1e-5 + 1e-4 |b|. A kind this checker does not know fails."""
import json
import os

import pytest
import torch

from conftest import golden_path

posbias = pytest.importorskip("posbias")

with open(golden_path()) as _f:
    GOLDEN = json.load(_f)
CASES = GOLDEN["cases"]
KNOWN = {"alibi_slopes", "ggml_slopes", "alibi_positional_bias", "alibi_bias",
         "dynamic_position_bias", "dynamic_position_bias_file", "t5_bucket", "attention"}


def arr(x):
    return torch.tensor(x["data"], dtype=torch.float32).reshape(x["shape"])


def check(got, shape, data, atol=1e-6, rtol=1e-5):
    assert list(got.shape) == list(shape), (list(got.shape), shape)
    exp = torch.tensor(data, dtype=torch.float64).reshape(shape)
    got = got.detach().to(torch.float64)
    bad = (got - exp).abs() > atol + rtol * exp.abs()
    assert not bool(bad.any()), f"{int(bad.sum())} entries off; first at " \
        f"{bad.nonzero()[0].tolist()}: {got[bad][0].item()} vs {exp[bad][0].item()}"


def test_every_kind_is_known():
    kinds = {c["kind"] for c in CASES}
    assert kinds <= KNOWN, f"unknown golden kinds: {sorted(kinds - KNOWN)}"
    assert len(CASES) >= 60


def ids(kind):
    return [f"{kind}-{n}" for n, c in enumerate(CASES) if c["kind"] == kind]


def cases(kind):
    return [c for c in CASES if c["kind"] == kind]


@pytest.mark.parametrize("case", cases("alibi_slopes"), ids=ids("alibi_slopes"))
def test_alibi_slopes(case):
    check(posbias.alibi_slopes(case["heads"]), [case["heads"]], case["slopes"])


@pytest.mark.parametrize("case", cases("ggml_slopes"), ids=ids("ggml_slopes"))
def test_ggml_slopes(case):
    check(posbias.alibi_slopes(case["heads"], case["max_bias"]), [case["heads"]],
          case["slopes"])


@pytest.mark.parametrize("case", cases("alibi_positional_bias"),
                         ids=ids("alibi_positional_bias"))
def test_alibi_positional_bias(case):
    m = posbias.AlibiPositionalBias(case["heads"], case["total_heads"],
                                    slopes=case.get("slopes"))
    for call in case["calls"]:  # in order: the cache is exercised
        check(m(call["i"], call["j"]), call["shape"], call["data"])


@pytest.mark.parametrize("case", cases("alibi_bias"), ids=ids("alibi_bias"))
def test_alibi_bias(case):
    slopes = None if case["slopes"] is None else torch.tensor(case["slopes"])
    m = posbias.AlibiBias(case["n_heads"], causal=case["causal"], slopes=slopes)
    check(m.build(case["q_len"], case["k_len"]), case["shape"], case["data"])


def _zeta_module(case_params, dim, heads):
    m = posbias.DynamicPositionBias(dim, heads)
    m.load_state_dict({k: arr(v) for k, v in case_params.items()})
    return m


@pytest.mark.parametrize("case", cases("dynamic_position_bias"),
                         ids=ids("dynamic_position_bias"))
def test_dynamic_position_bias(case):
    if case["variant"] == "zeta":
        m = _zeta_module(case["params"], case["dim"], case["heads"])
        for call in case["calls"]:
            check(m(call["i"], call["j"]), call["shape"], call["data"])
        g = case["grad"]
        m.zero_grad()
        out = m(g["i"], g["j"])
        (out * arr(g["grad_output"])).sum().backward()
        for name, p in m.named_parameters():
            exp = g["param_grads"][name]
            check(p.grad, exp["shape"], exp["data"], atol=1e-5, rtol=1e-4)
        return
    assert case["variant"] == "x-transformers"
    # The op with the x-transformers variant, expanded with the package.
    params = []
    for layer in case["layers"]:
        if layer["type"] in ("linear", "layernorm"):
            params += [arr(layer["weight"]), arr(layer["bias"])]
    eps = [layer["eps"] for layer in case["layers"] if layer["type"] == "layernorm"]
    for call in case["calls"]:
        i, j = call["i"], call["j"]
        table = torch.ops.posbias.dpb_distance_table(params, j, "x-transformers",
                                                     case["log_distance"], case["norm"],
                                                     eps[0] if eps else 1e-5)
        check(posbias.expand_distance_table(table, i, j), call["shape"], call["data"])


@pytest.mark.parametrize("case", cases("dynamic_position_bias_file"),
                         ids=ids("dynamic_position_bias_file"))
def test_dynamic_position_bias_file(case):
    path = os.path.join(os.path.dirname(golden_path()), case["file"])
    m = posbias.DynamicPositionBias(case["dim"], case["heads"])
    m.load_state_dict(posbias.safetensors.load_file(path))
    for call in case["calls"]:
        check(m(call["i"], call["j"]), call["shape"], call["data"])


@pytest.mark.parametrize("case", cases("t5_bucket"), ids=ids("t5_bucket"))
def test_t5_bucket(case):
    """Buckets through the op: an identity-like embedding E[b][0] = b makes the
    table entry the bucket itself (scale 1)."""
    nb = case["num_buckets"]
    emb = torch.arange(nb, dtype=torch.float32)[:, None]
    for rel, bucket in zip(case["rel"], case["buckets"]):
        # Entry e of a j-table holds c - q_r = (j - 1) - e; use j large enough.
        j = abs(rel) + 1
        e = (j - 1) - rel
        table = torch.ops.posbias.t5_distance_table(emb, j, case["causal"], nb,
                                                    case["max_distance"], 1.0)
        assert int(table[0, e].item()) == bucket, (rel, bucket, table[0, e].item())


@pytest.mark.parametrize("case", cases("attention"), ids=ids("attention"))
def test_attention(case):
    q, k, v = arr(case["q"]), arr(case["k"]), arr(case["v"])
    b = case["bias"]
    kw = {}
    if b["type"] == "alibi":
        kw["slopes"] = torch.tensor(b["slopes"], dtype=torch.float32)
    elif b["type"] == "distance_table":
        kw["table"] = arr(b["table"])
    else:
        assert b["type"] == "none", b["type"]
    out = posbias.attention(q, k, v, scale=case["scale"], causal=case["causal"], **kw)
    check(out, case["out"]["shape"], case["out"]["data"], atol=1e-5, rtol=1e-4)
