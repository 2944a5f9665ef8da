"""One rank of the ring-attention test (test_parallel.py starts WORLD_SIZE of
these; gloo, env://). Every rank builds the same full inputs, runs the
one-process posbias.attention forward and backward, then its shard through
parallel.ring_attention (queries rows [r0, r1), keys a block in another
order), backpropagates the matching shard of the same output gradient, and
compares out, dq, dk, dv (gathered) and the slopes / table gradients (summed
over ranks) with the one-process ones. Exit code 0 when all agree."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import posbias  # noqa: E402
from posbias import parallel  # noqa: E402

TOL = dict(atol=5e-5, rtol=5e-4)


def gather_rows(t, dim):
    return torch.cat(parallel._all_gather_padded(t.contiguous(), dim, None), dim=dim)


def case(rank, world, n_q, n_k, causal, bias, hk, failures):
    b, h, d = 2, 4, 8
    g = torch.Generator().manual_seed(n_q * 1000 + n_k * 10 + int(causal))
    q = torch.randn(b, h, n_q, d, generator=g)
    k = torch.randn(b, hk, n_k, d, generator=g)
    v = torch.randn(b, hk, n_k, d, generator=g)
    go = torch.randn(b, h, n_q, d, generator=g)
    slopes = (posbias.alibi_slopes(h) * 4).requires_grad_() if bias == "alibi" else None
    table = None
    if bias == "table":
        torch.manual_seed(7)
        dpb = posbias.DynamicPositionBias(16, h)
        with torch.no_grad():
            table = dpb.distance_table(n_k).clone().requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    full = posbias.attention(*leaves, bias, slopes=slopes, table=table, causal=causal)
    (full * go).sum().backward()
    ref = [t.grad for t in leaves]
    ref_bias = (slopes if bias == "alibi" else table)
    ref_bias_grad = ref_bias.grad.clone() if ref_bias is not None else None
    if ref_bias is not None:
        ref_bias.grad = None

    r0, r1 = parallel.sequence_range(n_q, rank, world)
    c0, c1 = parallel.sequence_range(n_k, world - 1 - rank, world)  # keys in another order
    ql = q[:, :, r0:r1].clone().requires_grad_()
    kl = k[:, :, c0:c1].clone().requires_grad_()
    vl = v[:, :, c0:c1].clone().requires_grad_()
    out = parallel.ring_attention(ql, kl, vl, q_start=n_k - n_q + r0, k_start=c0, total_keys=n_k,
                                  bias=bias, slopes=slopes, table=table, causal=causal)
    (out * go[:, :, r0:r1]).sum().backward()
    name = f"world={world} i={n_q} j={n_k} hk={hk} causal={causal} bias={bias}"
    checks = [("out", gather_rows(out.detach(), 2), full.detach()),
              ("dq", gather_rows(ql.grad, 2), ref[0])]
    # Key blocks were taken in reverse rank order: gather, then undo it.
    dk = parallel._all_gather_padded(kl.grad.contiguous(), 2, None)[::-1]
    dv = parallel._all_gather_padded(vl.grad.contiguous(), 2, None)[::-1]
    checks += [("dk", torch.cat(dk, 2), ref[1]), ("dv", torch.cat(dv, 2), ref[2])]
    if ref_bias is not None:
        gb = ref_bias.grad.clone()
        dist.all_reduce(gb)
        checks.append(("d" + ("slopes" if bias == "alibi" else "table"), gb, ref_bias_grad))
    for what, got, want in checks:
        if not torch.allclose(got, want, **TOL):
            failures.append(f"{name}: {what} max diff {(got - want).abs().max().item():.3g}")


def main():
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    failures = []
    for n_q, n_k, causal, bias, hk in [(37, 37, True, "alibi", 2), (37, 37, True, "table", 4),
                                       (36, 36, False, "alibi", 4), (30, 30, False, "table", 2),
                                       (13, 40, True, "alibi", 2), (13, 40, True, "table", 2),
                                       (40, 40, True, "none", 1), (5, 41, True, "table", 4)]:
        case(rank, world, n_q, n_k, causal, bias, hk, failures)
    flag = torch.tensor([len(failures)], dtype=torch.int64)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    for f in failures:
        print(f"rank {rank}: {f}", flush=True)
    print(f"rank {rank}: {'ok' if int(flag) == 0 else 'FAILED'}", flush=True)
    return 0 if int(flag) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
