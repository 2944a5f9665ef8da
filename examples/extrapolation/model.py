"""A byte-level decoder-only transformer with five position schemes and two attention paths.

Position schemes (one module shared by all layers, as in x-transformers):
  alibi       ALiBi slopes (Press et al.), bias "alibi" of the attention op.
  dpb         DynamicPositionBias (zeta): an MLP over the distances 0..n-1, read through a
              per-head distance table [h, 2n - 1] (bias "table"); trained through the table.
  t5          T5 relative buckets (causal, 32 buckets, max distance 128), an embedding
              [buckets, h] gathered into a distance table (bias "table").
  sinusoidal  Vaswani et al.'s sinusoidal embeddings added to the byte embeddings; no bias.
  none        causal attention without any position information (NoPE).

Attention paths, computing the same function:
  posbias     torch.ops.posbias.attention (the fused CPU kernel; never builds [b, h, n, n]).
  torch       plain PyTorch: q k^T, materialised bias [h, n, n], causal mask, float32 softmax,
              times v.
"""

import math

import torch
from torch import nn

SCHEMES = ("alibi", "dpb", "t5", "sinusoidal", "none")
ATTENTIONS = ("posbias", "torch")


# ----------------------------------------------------------------------------- attention paths


def torch_attention(q, k, v, bias="none", slopes=None, table=None, causal=True):
    """The plain PyTorch attention: out = softmax(q k^T / sqrt(d) + bias, causal mask) v.

    q [b, h, i, d], k and v [b, h, j, d]; queries are the last i of the j positions
    (docs/spec.md), so query row r sits at q_r = j - i + r and the distance to key c is q_r - c.
    """
    i, j, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    rel = (torch.arange(i)[:, None] + (j - i)) - torch.arange(j)[None, :]  # q_r - c, [i, j]
    if bias == "alibi":
        scores = scores - slopes[:, None, None] * rel.abs().to(scores.dtype)
    elif bias == "table":
        scores = scores + table[:, rel + (j - 1)]
    elif bias != "none":
        raise ValueError(f"unknown bias kind {bias!r}")
    if causal:
        scores = scores.masked_fill(rel < 0, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.matmul(probs, v)


def posbias_attention(q, k, v, bias="none", slopes=None, table=None, causal=True):
    """The fused posbias attention op (same arguments and result as torch_attention). q, k and
    v are strided views of the qkv projection; the op reads them in place."""
    return torch.ops.posbias.attention(q, k, v, bias=bias, slopes=slopes, table=table,
                                       causal=causal)


ATTENTION_FUNCTIONS = {"torch": torch_attention, "posbias": posbias_attention}


# ----------------------------------------------------------------------------- position schemes


def alibi_slopes(heads):
    """ALiBi slopes (docs/spec.md): 2^(-8 (h+1) / n) for a power of two n, else the interleaved
    schedule. Computed here in double; the posbias op's alibi_slopes gives the same float32."""
    def power_of_two(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    c = 2 ** int(math.floor(math.log2(heads)))
    if c == heads:
        out = power_of_two(heads)
    else:
        out = power_of_two(c) + power_of_two(2 * c)[0::2][: heads - c]
    return torch.tensor(out, dtype=torch.float32)


def mirror_index(n):
    """|m - (n - 1)| for m in 0..2n-2: the distance that table column m stands for."""
    return (torch.arange(2 * n - 1) - (n - 1)).abs()


def t5_bucket(rel, num_buckets=32, max_distance=128):
    """T5's causal bucket of the relative position rel = c - q_r (x-transformers)."""
    n = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    safe = n.clamp(min=max_exact).float()  # log only where n >= max_exact
    large = max_exact + (torch.log(safe / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


class AlibiScheme(nn.Module):
    def __init__(self, heads):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(heads), persistent=False)

    def forward(self, n):
        return {"bias": "alibi", "slopes": self.slopes}


class DpbScheme(nn.Module):
    """DynamicPositionBias(dim, heads) of zeta / docs/spec.md: MLP(distance) -> per-head bias."""

    def __init__(self, dim, heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim), nn.SiLU(),
                                 nn.Linear(dim, heads))

    def forward(self, n):
        dist = torch.arange(n, dtype=torch.float32)[:, None]
        per_distance = self.mlp(dist)                           # [n, heads]
        table = per_distance[mirror_index(n)].t().contiguous()  # [heads, 2n - 1]
        return {"bias": "table", "table": table}


class T5Scheme(nn.Module):
    """T5 relative position buckets (causal), an embedding [buckets, heads], scale 1."""

    def __init__(self, heads, num_buckets=32, max_distance=128):
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embedding = nn.Embedding(num_buckets, heads)
        # Small init: buckets never reached in training (distances > L) stay near 0.
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, n):
        rel = (n - 1) - torch.arange(2 * n - 1)  # c - q_r for table column m
        buckets = t5_bucket(rel, self.num_buckets, self.max_distance)
        table = self.embedding(buckets).t().contiguous()  # [heads, 2n - 1]
        return {"bias": "table", "table": table}


class NoBias(nn.Module):
    def forward(self, n):
        return {"bias": "none"}


def sinusoidal_embedding(n, width):
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    emb = torch.zeros(n, width)
    emb[:, 0::2] = torch.sin(pos * freq)
    emb[:, 1::2] = torch.cos(pos * freq)
    return emb


# ----------------------------------------------------------------------------- the model


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x, position, attend):
        b, n, width = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        o = attend(qkv[0], qkv[1], qkv[2], causal=True, **position)  # [b, h, n, d]
        return self.out(o.transpose(1, 2).reshape(b, n, width))


class Block(nn.Module):
    def __init__(self, width, heads, mlp_ratio=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(),
                                 nn.Linear(mlp_ratio * width, width))

    def forward(self, x, position, attend):
        x = x + self.attn(self.norm1(x), position, attend)
        return x + self.mlp(self.norm2(x))


class ByteLM(nn.Module):
    """Pre-norm decoder: byte embedding (+ sinusoidal), layers, final norm, linear head."""

    def __init__(self, scheme, layers=3, width=128, heads=8, dpb_dim=32):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"unknown position scheme {scheme!r}")
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.scheme = scheme
        self.width = width
        # The shared parts first, so that every scheme starts from the same weights for them
        # (same seed); the scheme's own parameters are drawn last.
        self.embed = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        if scheme == "alibi":
            self.position = AlibiScheme(heads)
        elif scheme == "dpb":
            self.position = DpbScheme(dpb_dim, heads)
        elif scheme == "t5":
            self.position = T5Scheme(heads)
        else:
            self.position = NoBias()

    def forward(self, tokens, attend):
        n = tokens.shape[1]
        x = self.embed(tokens)
        if self.scheme == "sinusoidal":
            x = x + sinusoidal_embedding(n, self.width)
        position = self.position(n)
        for block in self.blocks:
            x = block(x, position, attend)
        return self.head(self.norm(x))


def estimate_activation_bytes(batch, n, layers, width, heads, attention, training):
    """A conservative estimate of the float32 activation memory of one forward (+ backward).

    Training keeps every layer's saved tensors: about 14 [b, n, width] tensors per layer (norms,
    q/k/v, attention output, projections, the 4x MLP before and after GELU) plus, for the plain
    PyTorch attention, scores, masked scores and probabilities [b, h, n, n] and the bias
    [h, n, n]; the fused op keeps O(b h n d). Evaluation (no grad) holds about one layer at a
    time. Logits and log-probabilities add 2 [b, n, 256]."""
    token_vectors = batch * n * width
    square = batch * heads * n * n if attention == "torch" else 0
    per_layer = 14 * token_vectors + 3 * square + heads * n * n
    live_layers = layers if training else 1
    total = live_layers * per_layer + 2 * batch * n * 256 + 2 * token_vectors
    if training:
        total *= 2  # gradients of the saved tensors during backward
    return 4 * total
