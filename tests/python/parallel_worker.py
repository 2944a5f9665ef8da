"""One rank of the two-process torch.distributed test (test_parallel.py starts
two of these). Configured like any torch.distributed program through the
environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (init_method env://).

Every rank builds the same full inputs from a fixed seed, computes the
one-process result, runs its shard, gathers, and compares. Exit code 0 when
every case agrees; otherwise the failing cases are printed and the code is 1."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import posbias  # noqa: E402
from posbias import parallel  # noqa: E402

TOL = dict(atol=2e-5, rtol=2e-4)


def inputs(b, h, hk, i, j, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, i, d, generator=g), torch.randn(b, hk, j, d, generator=g),
            torch.randn(b, hk, j, d, generator=g))


def tensor_parallel_cases(rank, world, failures):
    torch.manual_seed(0)
    dpb = posbias.DynamicPositionBias(16, 6)
    for h, hk, causal, bias in [(6, 2, True, "alibi"), (6, 6, False, "alibi"),
                                (5, 5, True, "alibi"), (12, 4, True, "alibi"),
                                (6, 2, True, "table"), (6, 3, False, "table"),
                                (6, 2, True, "none")]:
        b, i, j, d = 2, 9, 11, 8
        q, k, v = inputs(b, h, hk, i, j, d, seed=h * 10 + hk)
        table = None
        if bias == "table":
            with torch.no_grad():
                table = dpb.distance_table(j) if h == 6 else None
        if bias == "alibi":
            full = posbias.attention(q, k, v, "alibi", slopes=posbias.alibi_slopes(h),
                                     causal=causal)
        elif bias == "table":
            full = posbias.attention(q, k, v, "table", table=table, causal=causal)
        else:
            full = posbias.attention(q, k, v, causal=causal)
        h0, h1 = parallel.head_range(h, rank, world)
        group = h // hk  # query heads per kv head: a rank's heads must cover whole groups
        if h0 % group or h1 % group:
            # Uneven GQA split: shard by kv groups instead.
            g0, g1 = parallel.head_range(hk, rank, world)
            h0, h1 = g0 * group, g1 * group
        k0, k1 = h0 // group, h1 // group
        out_local = parallel.tp_attention(q[:, h0:h1], k[:, k0:k1], v[:, k0:k1],
                                          total_heads=h, head_begin=h0, bias=bias, table=table,
                                          causal=causal)
        out = parallel.gather_heads(out_local)
        if not torch.allclose(out, full, **TOL):
            failures.append(f"tensor parallel h={h} hk={hk} causal={causal} bias={bias}: "
                            f"max diff {(out - full).abs().max().item():.3g}")


def context_parallel_cases(rank, world, failures):
    torch.manual_seed(1)
    dpb = posbias.DynamicPositionBias(16, 4)
    t5 = posbias.RelativePositionBias(scale=1.0, causal=False, num_buckets=16, max_distance=32,
                                      heads=4)
    for n_q, n_k, causal, bias in [(37, 37, True, "alibi"), (37, 37, False, "alibi"),
                                   (36, 36, True, "alibi"), (37, 37, True, "table"),
                                   (30, 30, False, "table"), (40, 40, True, "none"),
                                   (13, 40, True, "alibi"), (13, 40, False, "table"),
                                   (5, 41, True, "table"), (1, 25, True, "alibi")]:
        b, h, hk, d = 1, 4, 2, 8
        q, k, v = inputs(b, h, hk, n_q, n_k, d, seed=n_q * 100 + n_k)
        slopes = posbias.alibi_slopes(h) if bias == "alibi" else None
        table = None
        with torch.no_grad():
            if bias == "table":
                table = (dpb if causal else t5).distance_table(n_k)
            full = posbias.attention(q, k, v, bias, slopes=slopes, table=table, causal=causal)
        # Queries are the last n_q of the n_k positions (bottom-right): a query
        # block [r0, r1) sits at positions n_k - n_q + r0 ...
        r0, r1 = parallel.sequence_range(n_q, rank, world)
        c0, c1 = parallel.sequence_range(n_k, world - 1 - rank, world)  # keys in another order
        with torch.no_grad():
            out_local = parallel.cp_attention(q[:, :, r0:r1], k[:, :, c0:c1], v[:, :, c0:c1],
                                              q_start=n_k - n_q + r0, k_start=c0,
                                              total_keys=n_k, bias=bias, slopes=slopes,
                                              table=table, causal=causal)
        out = torch.cat(parallel._all_gather_padded(out_local, 2, None), dim=2)
        if not torch.allclose(out, full, **TOL):
            failures.append(f"context parallel i={n_q} j={n_k} causal={causal} bias={bias}: "
                            f"max diff {(out - full).abs().max().item():.3g}")


def main():
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    failures = []
    tensor_parallel_cases(rank, world, failures)
    context_parallel_cases(rank, world, failures)
    # Every rank learns whether any rank failed (so both exit alike).
    flag = torch.tensor([len(failures)], dtype=torch.int64)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    for f in failures:
        print(f"rank {rank}: {f}", flush=True)
    print(f"rank {rank}: {'ok' if int(flag) == 0 else 'FAILED'}", flush=True)
    return 0 if int(flag) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
