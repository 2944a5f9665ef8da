"""Plain PyTorch reference of ../../shared/SPEC.md, written for the tests from the
specification alone (no posbias code): ALiBi slopes and biases, AlibiBias (the
"ALiBi" seed's top-left builder), DynamicPositionBias (zeta and x-transformers),
T5 buckets, and attention with a materialised bias and a masked softmax.

Everything is computed in float64 unless a function says otherwise, so the
reference is more accurate than what it checks.
"""
import math

import torch


# ---------------------------------------------------------------- positions


def query_positions(i, j):
    """Bottom-right alignment: the query in row r sits at j - i + r."""
    return torch.arange(j - i, j, dtype=torch.int64)


def key_positions(j):
    return torch.arange(j, dtype=torch.int64)


def signed_distance(i, j):
    """[i, j] int64: q_r - c."""
    return query_positions(i, j)[:, None] - key_positions(j)[None, :]


# ---------------------------------------------------------------- slopes


def alibi_slopes(n):
    """SPEC: c = 2^floor(log2 n); power of two: 2^(-8 (h+1) / n); else the first
    c of the c-head schedule, then the odd entries of the 2c-head schedule."""
    assert n >= 1
    c = 2 ** int(math.floor(math.log2(n)))
    out = []
    for h in range(n):
        if h < c:
            out.append(2.0 ** (-8.0 * (h + 1) / c))
        else:
            out.append(2.0 ** (-4.0 * (2 * (h - c) + 1) / c))
    return torch.tensor(out, dtype=torch.float64).to(torch.float32)


def max_bias_slopes(n, max_bias):
    """ggml soft_max_ext / MPT: m0^(h+1) for h < nl2, else m1^(2 (h - nl2) + 1);
    slope 1 for max_bias <= 0."""
    if max_bias <= 0:
        return torch.ones(n, dtype=torch.float32)
    nl2 = 2 ** int(math.floor(math.log2(n)))
    m0 = 2.0 ** (-max_bias / nl2)
    m1 = 2.0 ** (-(max_bias / 2.0) / nl2)
    out = [m0 ** (h + 1) if h < nl2 else m1 ** (2 * (h - nl2) + 1) for h in range(n)]
    return torch.tensor(out, dtype=torch.float64).to(torch.float32)


# ---------------------------------------------------------------- ALiBi biases


def alibi_bias(slopes, i, j, total_heads=None):
    """[max(total_heads, h), i, j] float64: -m_h |c - q_r|, zero heads appended."""
    slopes = torch.as_tensor(slopes, dtype=torch.float64)
    h = slopes.numel()
    total = h if total_heads is None else max(total_heads, h)
    dist = signed_distance(i, j).abs().to(torch.float64)
    out = torch.zeros(total, i, j, dtype=torch.float64)
    out[:h] = -slopes[:, None, None] * dist[None]
    return out


def alibi_bias_custom_pos(slopes, q_pos, k_pos, total_heads=None):
    slopes = torch.as_tensor(slopes, dtype=torch.float64)
    h = slopes.numel()
    total = h if total_heads is None else max(total_heads, h)
    dist = (torch.as_tensor(k_pos, dtype=torch.int64)[None, :] -
            torch.as_tensor(q_pos, dtype=torch.int64)[:, None]).abs().to(torch.float64)
    out = torch.zeros(total, dist.shape[0], dist.shape[1], dtype=torch.float64)
    out[:h] = -slopes[:, None, None] * dist[None]
    return out


def alibi_get_bias(i, j):
    """[1, i, j]: -|c - q_r|."""
    return -signed_distance(i, j).abs().to(torch.float64)[None]


def seed_alibi_bias(n_heads, causal, slopes, q_len, k_len):
    """The "ALiBi" seed's builder: [1, n, q, k], top-left positions q = r, k = c;
    causal max(r - c, 0), else |r - c|; default slopes linspace(-0.05, -0.5)."""
    if slopes is None:
        slopes = torch.linspace(-0.05, -0.5, steps=n_heads, dtype=torch.float32)
    slopes = torch.as_tensor(slopes, dtype=torch.float32).to(torch.float64)
    d = torch.arange(q_len)[:, None] - torch.arange(k_len)[None, :]
    d = d.clamp_min(0) if causal else d.abs()
    return (slopes[:, None, None] * d.to(torch.float64)[None])[None]


# ---------------------------------------------------------------- DPB


def zeta_dpb_table(params, j, dtype=torch.float64):
    """zeta's MLP on the distances 0..j-1: [j, heads]. params: state dict."""
    p = {k: v.to(dtype) for k, v in params.items()}
    x = torch.arange(j, dtype=dtype)[:, None]
    x = torch.nn.functional.silu(x @ p["mlp.0.weight"].t() + p["mlp.0.bias"])
    x = torch.nn.functional.silu(x @ p["mlp.2.weight"].t() + p["mlp.2.bias"])
    return x @ p["mlp.4.weight"].t() + p["mlp.4.bias"]


def zeta_dpb_bias(params, i, j, dtype=torch.float64):
    """[heads, i, j]: T[|q_r - c|][h]."""
    assert 0 <= i <= j
    t = zeta_dpb_table(params, j, dtype)
    return t[signed_distance(i, j).abs()].permute(2, 0, 1)


def xt_dpb_bias(layers, log_distance, i, j):
    """x-transformers variant: signed distances -(j-1)..(j-1) through the layer
    list (linear / layernorm / silu), index (q_r - c) + (j - 1)."""
    assert 0 <= i <= j
    x = torch.arange(-(j - 1), j, dtype=torch.float64)[:, None]
    if log_distance:
        x = torch.sign(x) * torch.log(x.abs() + 1)
    for layer in layers:
        if layer["type"] == "linear":
            x = x @ layer["weight"].t() + layer["bias"]
        elif layer["type"] == "layernorm":
            x = torch.nn.functional.layer_norm(x, (x.shape[-1],), layer["weight"],
                                               layer["bias"], layer["eps"])
        elif layer["type"] == "silu":
            x = torch.nn.functional.silu(x)
        else:
            raise ValueError(layer["type"])
    # x: [2j - 1, heads] in the order of distances -(j-1) .. (j-1)
    idx = signed_distance(i, j) + (j - 1)
    return x[idx].permute(2, 0, 1)


# ---------------------------------------------------------------- T5


def t5_bucket(rel, causal, num_buckets, max_distance):
    n = -rel
    if not causal:
        nb = num_buckets // 2
        ret = nb if n < 0 else 0
        n = abs(n)
    else:
        nb = num_buckets
        ret = 0
        n = max(n, 0)
    max_exact = nb // 2
    if n < max_exact:
        return ret + n
    v = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) *
                        (nb - max_exact))
    return ret + min(v, nb - 1)


def t5_bias(embedding, i, j, causal, num_buckets, max_distance, scale):
    """[heads, i, j]: E[bucket(c - q_r)][h] * scale."""
    rel = -signed_distance(i, j)
    b = torch.tensor([[t5_bucket(int(x), causal, num_buckets, max_distance) for x in row]
                      for row in rel.tolist()], dtype=torch.int64).reshape(i, j)
    e = torch.as_tensor(embedding, dtype=torch.float64)
    return e[b].permute(2, 0, 1) * scale


def t5_distance_table(embedding, j, causal, num_buckets, max_distance, scale):
    """[heads, 2j - 1]: entry e = (q_r - c) + (j - 1), i.e. c - q_r = (j - 1) - e."""
    e = torch.as_tensor(embedding, dtype=torch.float64)
    b = torch.tensor([t5_bucket((j - 1) - x, causal, num_buckets, max_distance)
                      for x in range(2 * j - 1)], dtype=torch.int64)
    return e[b].t() * scale


# ---------------------------------------------------------------- tables


def table_to_bias(table, i, j):
    """Expand a distance table [h, >= 2j - 1] to [h, i, j] (differentiable)."""
    idx = signed_distance(i, j) + (j - 1)
    return table[:, idx]


def centred_table_to_bias(table, i, j):
    """Expand a distance table [h, n], n odd, read at its centre (n - 1) / 2:
    bias[h][r][c] = table[h][(n - 1) / 2 + (q_r - c)] (differentiable)."""
    idx = signed_distance(i, j) + (table.shape[1] - 1) // 2
    return table[:, idx]


def alibi_distance_table(slopes, j):
    slopes = torch.as_tensor(slopes, dtype=torch.float64)
    e = torch.arange(2 * j - 1, dtype=torch.float64) - (j - 1)
    return -slopes[:, None] * e.abs()[None]


# ---------------------------------------------------------------- attention


def attention(q, k, v, bias=None, causal=False, scale=None, return_lse=False):
    """softmax(scale q k^T + bias, mask) v with a materialised bias, in float64
    (or q's dtype when it is float64 already: differentiable).

    bias: None or a tensor broadcastable to [b, h, i, j]. GQA: query head x reads
    kv head x // (h // hk). A row without a visible key outputs zeros (lse -inf);
    so does a row whose visible scores are all -inf."""
    b, h, i, d = q.shape
    hk, j = k.shape[1], k.shape[2]
    assert h % hk == 0
    rep = h // hk
    dt = torch.float64
    qq, kk, vv = q.to(dt), k.to(dt), v.to(dt)
    kk = kk.repeat_interleave(rep, dim=1)
    vv = vv.repeat_interleave(rep, dim=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    s = scale * (qq @ kk.transpose(-1, -2))
    if bias is not None:
        s = s + torch.as_tensor(bias).to(dt)
    if causal:
        visible = signed_distance(i, j) >= 0  # c <= q_r
        s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    finite = torch.isfinite(m)
    m = torch.where(finite, m, torch.zeros_like(m))
    p = torch.exp(s - m)
    den = p.sum(dim=-1, keepdim=True)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    out = (p / safe) @ vv
    out = torch.where(den > 0, out, torch.zeros_like(out))
    if not return_lse:
        return out
    lse = torch.where(den[..., 0] > 0, (m + torch.log(safe))[..., 0],
                      torch.full_like(den[..., 0], float("-inf")))
    return out, lse
