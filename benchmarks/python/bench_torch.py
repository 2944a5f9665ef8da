"""posbias from Python against plain PyTorch, measured in the same run.

Cases (issue 5): the ALiBi module at h 16, i = j = 4096; DynamicPositionBias
(dim 64, heads 8) forward at i = j = 4096 and forward + backward at 2048 (as
`posbias bench dpb`); the attention op at h 16, i = j = 2048, d 64, causal
ALiBi, forward and forward + backward. The PyTorch reference of each case is
the plain formulation written here from docs/spec.md (materialised bias, autograd).

Prints a table (medians in ms, ratio = PyTorch / posbias, > 1 means posbias is
faster) and the same as JSON (stdout, or --json FILE).

    nice -n 10 /usr/bin/python3 benchmarks/python/bench_torch.py [--reps 5] [--json out.json]

Needs the op library: PYTHONPATH=python POSBIAS_TORCH_OPS=build/.../libposbias_torch_ops.so
(or an installed package). --quick: small sizes, one repetition (a smoke run)."""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import posbias  # noqa: E402


def rel_diff(a, b):
    """max |a - b| / max |b| (0 when both are zero)."""
    den = b.abs().max().item()
    return (a - b).abs().max().item() / den if den > 0 else (a - b).abs().max().item()


def median_ms(fn, reps):
    fn()  # warm-up (allocator, threads, caches)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ------------------------------------------------------------------ references


def torch_alibi(slopes, total_heads, i, j):
    """x-transformers' AlibiPositionalBias build: -m |k - q| [total, i, j]."""
    q = torch.arange(j - i, j)
    k = torch.arange(j)
    bias = -(k[None, None, :] - q[None, :, None]).abs().to(torch.float32) * slopes[:, None, None]
    pad = total_heads - slopes.numel()
    if pad:
        bias = torch.cat([bias, bias.new_zeros(pad, i, j)], dim=0)
    return bias


class TorchDPB(nn.Module):
    """zeta's DynamicPositionBias: MLP on 0..j-1, gather by |q - k|."""

    def __init__(self, dim, heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim), nn.SiLU(),
                                 nn.Linear(dim, heads))

    def forward(self, i, j):
        idx = (torch.arange(j - i, j)[:, None] - torch.arange(j)[None, :]).abs()
        table = self.mlp(torch.arange(j, dtype=torch.float32)[:, None])
        return table[idx].permute(2, 0, 1)


def torch_attention(q, k, v, slopes, causal):
    i, j, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    s = s + torch_alibi(slopes, slopes.numel(), i, j)[None]
    if causal:
        qpos = torch.arange(j - i, j)[:, None]
        s = s.masked_fill(torch.arange(j)[None, :] > qpos, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# ------------------------------------------------------------------ cases


def bench_alibi(n, reps):
    h = 16
    slopes = posbias.alibi_slopes(h)

    def ours():
        m = posbias.AlibiPositionalBias(h, h)  # a fresh build, not the cache
        return m(n, n)

    def ref():
        return torch_alibi(slopes, h, n, n)

    diff = rel_diff(ours(), ref())
    return [dict(case=f"alibi module h{h} i=j={n}", posbias_ms=median_ms(ours, reps),
                 torch_ms=median_ms(ref, reps), max_rel_diff=diff)]


def bench_dpb(n, nb, reps):
    torch.manual_seed(0)
    ours_m = posbias.DynamicPositionBias(64, 8)
    ref_m = TorchDPB(64, 8)
    ref_m.load_state_dict(ours_m.state_dict())
    rows = []

    def fwd(m):
        def run():
            with torch.no_grad():
                return m(n, n)
        return run

    diff = rel_diff(fwd(ours_m)(), fwd(ref_m)())
    rows.append(dict(case=f"dpb dim64 h8 forward i=j={n}", posbias_ms=median_ms(fwd(ours_m), reps),
                     torch_ms=median_ms(fwd(ref_m), reps), max_rel_diff=diff))
    g = torch.randn(8, nb, nb)

    def fb(m):
        def run():
            m.zero_grad(set_to_none=True)
            (m(nb, nb) * g).sum().backward()
        return run

    fb(ours_m)()
    fb(ref_m)()
    gdiff = max(rel_diff(a.grad, b.grad) for a, b in zip(ours_m.parameters(),
                                                            ref_m.parameters()))
    rows.append(dict(case=f"dpb dim64 h8 forward+backward i=j={nb}",
                     posbias_ms=median_ms(fb(ours_m), reps), torch_ms=median_ms(fb(ref_m), reps),
                     max_rel_diff=gdiff))
    return rows


def bench_attention(n, reps):
    h, d = 16, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, n, d, generator=g)
    k = torch.randn(1, h, n, d, generator=g)
    v = torch.randn(1, h, n, d, generator=g)
    slopes = posbias.alibi_slopes(h)
    rows = []

    def ours():
        with torch.no_grad():
            return posbias.attention(q, k, v, slopes=slopes, causal=True)

    def ref():
        with torch.no_grad():
            return torch_attention(q, k, v, slopes, True)

    diff = rel_diff(ours(), ref())
    rows.append(dict(case=f"attention h{h} i=j={n} d{d} causal alibi forward",
                     posbias_ms=median_ms(ours, reps), torch_ms=median_ms(ref, reps),
                     max_rel_diff=diff))
    go = torch.randn(1, h, n, d, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def fb(fn):
        def run():
            for t in leaves:
                t.grad = None
            (fn(*leaves) * go).sum().backward()
            return [t.grad for t in leaves]
        return run

    ours_fb = fb(lambda a, b, c: posbias.attention(a, b, c, slopes=slopes, causal=True))
    ref_fb = fb(lambda a, b, c: torch_attention(a, b, c, slopes, True))
    gd = max(rel_diff(x, y) for x, y in zip(ours_fb(), ref_fb()))
    rows.append(dict(case=f"attention h{h} i=j={n} d{d} causal alibi forward+backward",
                     posbias_ms=median_ms(ours_fb, reps), torch_ms=median_ms(ref_fb, reps),
                     max_rel_diff=gd))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median)")
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    p.add_argument("--json", help="also write the JSON to this file")
    p.add_argument("--only", choices=["alibi", "dpb", "attention"], action="append")
    a = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    reps = 1 if a.quick else a.reps
    only = set(a.only or ["alibi", "dpb", "attention"])
    rows = []
    if "alibi" in only:
        rows += bench_alibi(256 if a.quick else 4096, reps)
    if "dpb" in only:
        rows += bench_dpb(256 if a.quick else 4096, 128 if a.quick else 2048, reps)
    if "attention" in only:
        rows += bench_attention(128 if a.quick else 2048, reps)
    for r in rows:
        r["ratio"] = r["torch_ms"] / r["posbias_ms"] if r["posbias_ms"] > 0 else float("inf")
    w = max(len(r["case"]) for r in rows)
    print(f"{'case':<{w}}  {'posbias ms':>11}  {'torch ms':>10}  {'torch/posbias':>13}  "
          f"{'max rel diff':>10}")
    for r in rows:
        print(f"{r['case']:<{w}}  {r['posbias_ms']:11.2f}  {r['torch_ms']:10.2f}  "
              f"{r['ratio']:12.2f}x  {r['max_rel_diff']:10.2e}")
    result = dict(threads=torch.get_num_threads(), reps=reps, torch=torch.__version__,
                  library=posbias.library_path, results=rows)
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
