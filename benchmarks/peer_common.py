"""Shared by the PyTorch peers: the ALiBi slope schedule of docs/spec.md, written
the way the paper's reference code computes it, and the timing helper."""
import math
import statistics
import time

import torch


def alibi_slopes(heads):
    def pow2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    c = 2 ** math.floor(math.log2(heads))
    s = pow2(c)
    if c != heads:
        s += pow2(2 * c)[0::2][: heads - c]
    return torch.tensor(s, dtype=torch.float32)


def median_ms(fn, reps, setup=None):
    """Median milliseconds of fn(setup()) over reps calls after one warm-up;
    setup (untimed) runs before each call; without it fn gets None."""
    def once():
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg)
        return (time.perf_counter() - t0) * 1e3

    once()
    return statistics.median(once() for _ in range(reps))
