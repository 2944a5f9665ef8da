"""PyTorch peer for `posbias bench attention`: attention with a materialised
ALiBi bias the way x-transformers computes it (scores = q k^T * scale + bias,
causal mask, softmax, product with v), written here from docs/spec.md. Prints one
JSON line with the median milliseconds.

Usage: python3 peer_attention.py --heads 16 -n 2048 -d 64 --causal --reps 3
"""
import argparse
import json
import os
import statistics
import time

import torch

from peer_common import alibi_slopes


def attention(q, k, v, slopes, causal):
    i, j = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    qpos = torch.arange(j - i, j)
    kpos = torch.arange(j)
    bias = -(kpos[None, :] - qpos[:, None]).abs() * slopes[:, None, None]
    scores = q @ k.transpose(-1, -2) * scale + bias
    if causal:
        mask = kpos[None, :] > qpos[:, None]
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("-n", type=int, default=2048)
    p.add_argument("-d", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    # Debian's torch starts with one thread here; use every core, as posbias does.
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    q = torch.randn(1, a.heads, a.n, a.d)
    k = torch.randn(1, a.heads, a.n, a.d)
    v = torch.randn(1, a.heads, a.n, a.d)
    m = alibi_slopes(a.heads)
    with torch.no_grad():
        attention(q, k, v, m, a.causal)
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            attention(q, k, v, m, a.causal)
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"median_ms": statistics.median(times), "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
