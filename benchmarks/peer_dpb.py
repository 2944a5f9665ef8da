"""PyTorch peer for `posbias bench dpb`: zeta's DynamicPositionBias forward
(MLP on the j distances, gather by |q - k|, rearrange to [heads, i, j]) and
its autograd backward, written here from docs/spec.md. Prints one JSON line (ms):

  forward_module_ms    the module's forward: a new [heads, i, j] tensor each
                       call (compare with posbias's allocating forward())
  forward_into_ms      the MLP on the j distances, then the gather of the same
                       [heads, i, j] values into a reused, pre-faulted buffer
                       (index built once, outside the timer): compare with
                       posbias's forward_into
  table_ms             the MLP alone on the j distances
  backward_ms          out.backward(grad) alone; the forward that builds the
                       graph runs untimed before each call
  forward_backward_ms  forward + backward together (what a training step pays)

Usage: python3 peer_dpb.py --dim 64 --heads 8 -n 4096 --backward-n 2048 --reps 3
"""
import argparse
import json
import os

import torch
from torch import nn

from peer_common import median_ms


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

    def forward_module(_):
        with torch.no_grad():
            return m(a.n, a.n)

    # forward_into: what posbias's forward_into does, the PyTorch way. The
    # index of |q - k| is built once (like a cached buffer); each call runs
    # the MLP and gathers into the same [heads, i, j] buffer, faulted in by
    # the warm-up call.
    distances = torch.arange(a.n, dtype=torch.float32)[:, None]
    pos = torch.arange(a.n)
    idx = (pos[:, None] - pos[None, :]).abs().reshape(-1)
    buf = torch.empty(a.heads, a.n, a.n)

    def forward_into(_):
        with torch.no_grad():
            table_t = m.mlp(distances).t().contiguous()  # [heads, j]
            torch.index_select(table_t, 1, idx, out=buf.view(a.heads, -1))

    def table(_):
        with torch.no_grad():
            return m.mlp(torch.arange(a.n, dtype=torch.float32)[:, None])

    nb = a.backward_n
    grad = torch.randn(a.heads, nb, nb)

    def build_graph():
        m.zero_grad(set_to_none=True)
        return m(nb, nb)

    def backward_only(out):
        out.backward(grad)

    def forward_backward(_):
        build_graph().backward(grad)

    figures = {
        "forward_module_ms": median_ms(forward_module, a.reps),
        "forward_into_ms": median_ms(forward_into, a.reps),
        "table_ms": median_ms(table, a.reps),
        "backward_ms": median_ms(backward_only, a.reps, setup=build_graph),
        "forward_backward_ms": median_ms(forward_backward, a.reps),
    }
    figures.update({"threads": torch.get_num_threads(), "torch": torch.__version__})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
