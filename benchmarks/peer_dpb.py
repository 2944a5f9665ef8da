"""PyTorch peer for `posbias bench dpb`: zeta's DynamicPositionBias forward
(MLP on the j distances, gather by |q - k|, rearrange to [heads, i, j]) and
its autograd backward, written here from SPEC.md. Prints one JSON line.

Usage: python3 peer_dpb.py --dim 64 --heads 8 -n 4096 --backward-n 2048 --reps 3
"""
import argparse
import json
import os
import statistics
import time

import torch
from torch import nn


class DynamicPositionBias(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim), nn.SiLU(),
                                 nn.Linear(dim, heads))

    def forward(self, i, j):
        q = torch.arange(j - i, j)
        k = torch.arange(j)
        idx = (q[:, None] - k[None, :]).abs()
        table = self.mlp(torch.arange(j, dtype=torch.float32)[:, None])  # [j, heads]
        return table[idx].permute(2, 0, 1)  # [heads, i, j], as einops' rearrange


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("-n", type=int, default=4096)
    p.add_argument("--backward-n", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    # Debian's torch starts with one thread here; use every core, as posbias does.
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    m = DynamicPositionBias(a.dim, a.heads)

    def fwd():
        with torch.no_grad():
            return m(a.n, a.n)

    def table():
        with torch.no_grad():
            return m.mlp(torch.arange(a.n, dtype=torch.float32)[:, None])

    nb = a.backward_n
    grad = torch.randn(a.heads, nb, nb)

    def bwd():
        m.zero_grad(set_to_none=True)
        out = m(nb, nb)
        out.backward(grad)

    print(json.dumps({"forward_ms": median_ms(fwd, a.reps), "table_ms": median_ms(table, a.reps),
                      "backward_ms": median_ms(bwd, a.reps), "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
