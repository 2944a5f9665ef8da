"""Shared by the PyTorch peers: the ALiBi slope schedule of SPEC.md, written
the way the paper's reference code computes it."""
import math

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
