"""PyTorch peer for `posbias bench alibi`: the AlibiPositionalBias forward as
x-transformers / zeta compute it (arange, abs, multiply by the slopes, pad the
zero heads), written here from docs/spec.md. Prints one JSON line (ms):

  module_ms  the module's forward: a new [total_heads, i, j] tensor each call
             (compare with posbias's allocating forward())
  into_ms    the same values written into a reused, pre-faulted buffer of the
             output dtype: -|k - q| built once outside the timer (like a cached
             buffer), each call one broadcast multiply by the slopes with out=
             for float32; for bfloat16 / float16, per head a multiply into a
             reused float32 [i, j] scratch and a copy_ into the buffer (twice as
             fast here as one multiply with a half-precision out=, which makes
             a float32 temporary of the whole output). Compare with posbias's
             alibi_bias_into.

Usage: python3 peer_alibi.py --heads 16 --total-heads 16 -n 4096 --reps 5 [--dtype float32]
"""
import argparse
import json
import os

import torch

from peer_common import alibi_slopes, median_ms


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

    # into: the zero heads (total > heads) are written once, as they never
    # change; the warm-up call faults the buffer in.
    pos = torch.arange(a.n)
    neg_distance = -(pos[None, :] - pos[:, None]).abs().to(torch.float32)  # [i, j]
    buf = torch.zeros(total, a.n, a.n, dtype=dtype)
    slopes = m[:, None, None]

    scratch = torch.empty(a.n, a.n) if dtype != torch.float32 else None

    def into():
        if scratch is None:
            torch.mul(neg_distance[None], slopes, out=buf[: a.heads])
        else:
            for h in range(a.heads):
                torch.mul(neg_distance, m[h], out=scratch)
                buf[h].copy_(scratch)

    into()
    if not torch.equal(buf, forward(m, total, a.n, a.n, dtype)):
        raise SystemExit("peer_alibi.py: the into variant differs from the module")
    figures = {
        "module_ms": median_ms(lambda _: forward(m, total, a.n, a.n, dtype), a.reps),
        "into_ms": median_ms(lambda _: into(), a.reps),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
