"""PyTorch peer for `posbias bench alibi`: the AlibiPositionalBias forward as
x-transformers / zeta compute it (arange, abs, multiply by the slopes, pad the
zero heads), written here from SPEC.md. Prints one JSON line with the median.

Usage: python3 peer_alibi.py --heads 16 --total-heads 16 -n 4096 --reps 5
"""
import argparse
import json
import os
import statistics
import time

import torch

from peer_common import alibi_slopes


def forward(m, total_heads, i, j, dtype):
    q = torch.arange(j - i, j)
    k = torch.arange(j)
    bias = -torch.abs(k[None, None, :] - q[None, :, None])
    bias = bias * m[:, None, None]
    bias = torch.nn.functional.pad(bias, (0, 0, 0, 0, 0, total_heads - m.shape[0]))
    return bias.to(dtype)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--total-heads", type=int, default=0)
    p.add_argument("-n", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    # Debian's torch starts with one thread here; use every core, as posbias does.
    torch.set_num_threads(os.cpu_count() or 1)
    total = a.total_heads or a.heads
    dtype = getattr(torch, a.dtype)
    m = alibi_slopes(a.heads)
    forward(m, total, a.n, a.n, dtype)  # warm-up
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        out = forward(m, total, a.n, a.n, dtype)
        times.append((time.perf_counter() - t0) * 1e3)
        del out
    print(json.dumps({"median_ms": statistics.median(times), "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
