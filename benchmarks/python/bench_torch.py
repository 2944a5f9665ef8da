"""posbias from Python, the PyTorch eager way and the C++ tool, in one run.

One JSON object per line and case (issue 18): posbias called from Python and
the PyTorch eager formulation (the bias materialised, as zeta and
x-transformers compute it; autograd for backward) timed interleaved call by
call (medians after a warm-up), and beside them the C++ tool's median of the
same case from the same run (`posbias-bench <suite> --only <case> --json`;
its own PyTorch peers are switched off). For the ratio to C++, posbias from
Python is timed again in rounds alternating with the C++ tool's runs
(posbias_alone_ms): a PyTorch eager call in between (seconds of 1 GiB
allocations without huge pages) leaves the allocator and the page cache in a
state that slowed the next posbias call up to 4x on the project's machine,
which says nothing about the Python front end. Fields: case, posbias_ms and
torch_ms (interleaved), speedup_vs_torch (torch / posbias; targets at least
10 or 5), cpp_case, cpp_ms, posbias_alone_ms, ratio_to_cpp (posbias_alone /
C++; targets at most 1.15 or 1.25), ratio_to_cpp_interleaved (posbias_ms /
C++, for the record), target, target_met, max_rel_diff (posbias against the
eager result), threads, openblas_coretype (null unless OpenBLAS runs with
OPENBLAS_CORETYPE: the script sets it where OpenBLAS falls back to a generic
core, see run_with_this_cpus_openblas). Forward + backward cases run out.backward(grad)
(autograd's backward of the module or op alone, no loss arithmetic).

Cases and targets (issue 18): AlibiPositionalBias(16, 16)(4096, 4096), a new
module each call (<= 1.15x C++); DynamicPositionBias(64, 8)(4096, 4096), a
new tensor (<= 1.25x C++); DPB forward + backward at 2048 (>= 10x PyTorch);
causal ALiBi attention h16 n2048 d64 (<= 1.15x C++) and its forward +
backward (>= 5x PyTorch); decode h32 j32768 d128 ALiBi (<= 1.15x C++; its
ratio_to_cpp is timed with k and v in transparent huge pages like the C++
tool's inputs, ratio_to_cpp_torch_pages with torch's own tensors: see
huge_page_copy).

    nice -n 10 /usr/bin/python3 benchmarks/python/bench_torch.py [--reps 7]
        [--cpp build/cli/posbias-bench] [--json out.jsonl] [--only attention]

Needs the package (pip-installed, or PYTHONPATH=python
POSBIAS_TORCH_OPS=build/torch/libposbias_torch_ops.so). The C++ program is
--cpp, else $POSBIAS_BENCH, else the first build*/cli/posbias-bench of the
repository; without one the cpp fields are null. --quick: small sizes, one
repetition, no C++ run unless --cpp is given (the ctest smoke run). Threads:
torch.set_num_threads(--threads, default every CPU), which posbias follows;
the C++ tool gets OMP_NUM_THREADS alike."""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time


def run_with_this_cpus_openblas():
    """Re-runs this script with OPENBLAS_CORETYPE where OpenBLAS (PyTorch's
    BLAS in Debian's python3-torch) fell back to a generic core for this CPU,
    as posbias-bench does for its sgemm and peers (benchmarks/openblas_core.h:
    OpenBLAS 0.3.21 took a KVM Xeon, family 6 model 207, for Prescott, and
    PyTorch's float32 matmul ran at 48 GFLOP/s there against 206 with its
    SkylakeX kernels). Must run before torch is imported."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return
    import ctypes
    try:
        name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except (OSError, AttributeError):
        return
    name.restype = ctypes.c_char_p
    core = (name() or b"").decode(errors="replace").lower()
    if core in ("haswell", "skylakex", "cooperlake", "sapphirerapids", "zen", "excavator",
                "skylake"):
        return
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return
    if {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags:
        want = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        want = "Haswell"
    else:
        return
    os.environ["OPENBLAS_CORETYPE"] = want
    try:
        os.execv(sys.executable, [sys.executable] + sys.argv)
    except OSError:
        del os.environ["OPENBLAS_CORETYPE"]


if __name__ == "__main__":
    run_with_this_cpus_openblas()

import torch  # noqa: E402 (after the OpenBLAS check above)
from torch import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import posbias
except ImportError:  # the source tree's package
    sys.path.insert(0, os.path.join(REPO, "python"))
    import posbias


def rel_diff(a, b):
    """max |a - b| / max |b| (0 when both are zero)."""
    a, b = a.double(), b.double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / den if den > 0 else (a - b).abs().max().item()


def interleaved_ms(fns, reps, warmup=1):
    """Median ms of each function of `fns` (name -> callable), timed call by
    call in turn (the order rotates each round), after `warmup` rounds."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(warmup + reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            dt = (time.perf_counter() - t0) * 1e3
            if r >= warmup:
                times[n].append(dt)
    return {n: statistics.median(t) for n, t in times.items()}


# ------------------------------------------------------------ the C++ tool

def find_cpp(explicit):
    if explicit:
        return explicit
    if os.environ.get("POSBIAS_BENCH"):
        return os.environ["POSBIAS_BENCH"]
    found = sorted(glob.glob(os.path.join(REPO, "build*", "cli", "posbias-bench")))
    return found[0] if found else None


def alternate_with_cpp(fn, cpp, suite, case, a, rounds=3):
    """(C++ median, posbias median): `rounds` rounds of one C++ tool run
    (its own warm-up and a.reps timed runs) then a.reps timed calls of fn;
    the C++ figure is the median of its rounds' medians. (None, None) when
    there is no C++ tool."""
    if not cpp:
        return None, None
    cpp_ms, ours = [], []
    for _ in range(rounds):
        m = cpp_median(cpp, suite, case, a.reps, a.quick)
        if m is None:
            return None, None
        cpp_ms.append(m)
        fn()  # warm-up after the tool
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ours.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(cpp_ms), statistics.median(ours)


def cpp_median(cpp, suite, case, reps, quick):
    """The C++ tool's median_ms of `case` (None when there is no tool or the
    case is missing), run now."""
    if not cpp:
        return None
    cmd = [cpp, suite, "--json", "--only", case, "--repetitions", str(max(reps, 3))]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ, POSBIAS_PEER_PYTHON="/bin/false",
               OMP_NUM_THREADS=str(torch.get_num_threads()))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in r.stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("case") == case and obj.get("median_ms"):
            return float(obj["median_ms"])
    print(f"bench_torch: {cpp} {suite} gave no case {case} (exit {r.returncode}): "
          f"{r.stderr.strip()[-300:]}", file=sys.stderr)
    return None


# ------------------------------------------------- the PyTorch eager way

def torch_alibi(slopes, total_heads, i, j):
    """x-transformers' AlibiPositionalBias build: -m |k - q|, [total, i, j]."""
    q = torch.arange(j - i, j)
    k = torch.arange(j)
    bias = -(k[None, None, :] - q[None, :, None]).abs().to(torch.float32) * slopes[:, None, None]
    pad = total_heads - slopes.numel()
    if pad:
        bias = torch.cat([bias, bias.new_zeros(pad, i, j)], dim=0)
    return bias


class TorchDPB(nn.Module):
    """zeta's DynamicPositionBias: the MLP on 0..j-1, gathered by |q - k|."""

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

def row(case, ms, diff, cpp_case=None, cpp=(None, None), max_ratio_to_cpp=None,
        min_speedup=None):
    cpp_ms, alone_ms = cpp
    r = dict(case=case, posbias_ms=ms["posbias"], torch_ms=ms["torch"], cpp_case=cpp_case,
             cpp_ms=cpp_ms, posbias_alone_ms=alone_ms, max_rel_diff=diff,
             threads=torch.get_num_threads(),
             openblas_coretype=os.environ.get("OPENBLAS_CORETYPE"))
    r["speedup_vs_torch"] = ms["torch"] / ms["posbias"] if ms["posbias"] > 0 else None
    r["ratio_to_cpp"] = alone_ms / cpp_ms if cpp_ms and alone_ms else None
    r["ratio_to_cpp_interleaved"] = ms["posbias"] / cpp_ms if cpp_ms else None
    if max_ratio_to_cpp is not None:
        r["target"] = f"posbias <= {max_ratio_to_cpp}x C++"
        r["target_met"] = None if cpp_ms is None else r["ratio_to_cpp"] <= max_ratio_to_cpp
    elif min_speedup is not None:
        r["target"] = f">= {min_speedup}x faster than PyTorch eager"
        r["target_met"] = r["speedup_vs_torch"] >= min_speedup
    return r


def bench_alibi(n, a):
    h = 16
    slopes = posbias.alibi_slopes(h)
    cpp_case = f"alibi_forward_h{h}_n{n}_f32"
    fns = {"posbias": lambda: posbias.AlibiPositionalBias(h, h)(n, n),  # a new module each call
           "torch": lambda: torch_alibi(slopes, h, n, n)}
    cpp = alternate_with_cpp(fns["posbias"], a.cpp, "alibi", cpp_case, a)
    diff = rel_diff(fns["posbias"](), fns["torch"]())
    return [row(f"alibi_module_h{h}_n{n}_new_module", interleaved_ms(fns, a.reps), diff,
                cpp_case, cpp, max_ratio_to_cpp=1.15)]


def bench_dpb(n, nb, a):
    torch.manual_seed(0)
    ours, ref = posbias.DynamicPositionBias(64, 8), TorchDPB(64, 8)
    ref.load_state_dict(ours.state_dict())
    cpp_case = f"dpb_forward_alloc_d64_h8_n{n}"

    def fwd(m):
        def run():
            with torch.no_grad():
                return m(n, n)
        return run

    fns = {"posbias": fwd(ours), "torch": fwd(ref)}
    cpp = alternate_with_cpp(fns["posbias"], a.cpp, "dpb", cpp_case, a)
    diff = rel_diff(fns["posbias"](), fns["torch"]())
    rows = [row(f"dpb_forward_d64_h8_n{n}_new_tensor", interleaved_ms(fns, a.reps), diff,
                cpp_case, cpp, max_ratio_to_cpp=1.25)]
    g = torch.randn(8, nb, nb)

    def fb(m):
        def run():
            m.zero_grad(set_to_none=True)
            m(nb, nb).backward(g)
        return run

    fns = {"posbias": fb(ours), "torch": fb(ref)}
    fns["posbias"]()
    fns["torch"]()
    gdiff = max(rel_diff(x.grad, y.grad) for x, y in zip(ours.parameters(), ref.parameters()))
    bwd_case = f"dpb_backward_d64_h8_n{nb}"  # the C++ backward alone, for reference
    rows.append(row(f"dpb_forward_backward_d64_h8_n{nb}", interleaved_ms(fns, a.reps), gdiff,
                    bwd_case, (cpp_median(a.cpp, "dpb", bwd_case, a.reps, a.quick), None),
                    min_speedup=10))
    return rows


def attention_inputs(b, h, i, j, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for n in (i, j, j)]


def bench_attention(n, a):
    h, d = 16, 64
    q, k, v = attention_inputs(1, h, n, n, d)
    slopes = posbias.alibi_slopes(h)
    cpp_case = f"attention_alibi_causal_h{h}_n{n}_d{d}"

    def fwd(fn):
        def run():
            with torch.no_grad():
                return fn(q, k, v)
        return run

    fns = {"posbias": fwd(lambda x, y, z: posbias.attention(x, y, z, slopes=slopes, causal=True)),
           "torch": fwd(lambda x, y, z: torch_attention(x, y, z, slopes, True))}
    cpp = alternate_with_cpp(fns["posbias"], a.cpp, "attention", cpp_case, a)
    diff = rel_diff(fns["posbias"](), fns["torch"]())
    rows = [row(f"attention_alibi_causal_h{h}_n{n}_d{d}_forward", interleaved_ms(fns, a.reps),
                diff, cpp_case, cpp, max_ratio_to_cpp=1.15)]
    go = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def fb(fn):
        def run():
            for t in leaves:
                t.grad = None
            fn(*leaves).backward(go)
            return [t.grad for t in leaves]
        return run

    fns = {"posbias": fb(lambda x, y, z: posbias.attention(x, y, z, slopes=slopes, causal=True)),
           "torch": fb(lambda x, y, z: torch_attention(x, y, z, slopes, True))}
    gd = max(rel_diff(x, y) for x, y in zip(fns["posbias"](), fns["torch"]()))
    rows.append(row(f"attention_alibi_causal_h{h}_n{n}_d{d}_forward_backward",
                    interleaved_ms(fns, a.reps), gd, min_speedup=5))
    return rows


def huge_page_copy(t):
    """A copy of t in posbias.empty's memory: 2 MiB aligned and advised as
    transparent huge pages, as the C++ tool's inputs are (posbias::Tensor
    allocates so). torch 1.13's CPU allocator never advises: with the kernel's
    THP mode 'madvise' its tensors sit in 4 KiB pages, and a decode streaming a
    1 GiB cache through them ran 15-20% slower here (TLB misses) than through
    the same values in huge pages: a property of the inputs' memory, not of
    the front end. A serving engine allocates its cache with posbias.empty."""
    out = posbias.empty(*t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


def bench_decode(n, a):
    h, d = 32, 128
    q, k, v = attention_inputs(1, h, 1, n, d, seed=1)
    slopes = posbias.alibi_slopes(h)
    cpp_case = f"decode_alibi_h{h}_n{n}_d{d}"

    def run(fn):
        def call():
            with torch.no_grad():
                return fn()
        return call

    kh, vh = huge_page_copy(k), huge_page_copy(v)
    fns = {"posbias": run(lambda: posbias.attention(q, k, v, slopes=slopes)),
           "torch": run(lambda: torch_attention(q, k, v, slopes, False))}
    huge_fn = run(lambda: posbias.attention(q, kh, vh, slopes=slopes))
    # The ratio to C++ on inputs in the same kind of memory as the tool's (huge
    # pages), and, for the record, on torch's own 4 KiB-page tensors.
    cpp = alternate_with_cpp(huge_fn, a.cpp, "attention", cpp_case, a)
    cpp_4k = alternate_with_cpp(fns["posbias"], a.cpp, "attention", cpp_case, a)
    diff = max(rel_diff(fns["posbias"](), fns["torch"]()), rel_diff(huge_fn(), fns["torch"]()))
    r = row(f"decode_alibi_h{h}_j{n}_d{d}", interleaved_ms(fns, a.reps), diff, cpp_case, cpp,
            max_ratio_to_cpp=1.15)
    r["inputs_for_ratio"] = "k, v in transparent huge pages, as the C++ tool's"
    r["posbias_alone_ms_torch_pages"] = cpp_4k[1]
    r["ratio_to_cpp_torch_pages"] = (cpp_4k[1] / cpp_4k[0]) if cpp_4k[0] and cpp_4k[1] else None
    return [r]


SUITES = ("alibi", "dpb", "attention", "decode")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="timed repetitions (median)")
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    p.add_argument("--json", help="also write the JSON lines to this file")
    p.add_argument("--only", choices=SUITES, action="append")
    p.add_argument("--cpp", help="the posbias-bench program (default: see the module doc)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.quick:
        a.reps = 1
    else:
        a.cpp = find_cpp(a.cpp)
    # The C++ tool's --quick sizes, so that the case names match.
    sizes = (dict(alibi=1024, dpb=1024, dpb_fb=512, attention=512, decode=4096) if a.quick else
             dict(alibi=4096, dpb=4096, dpb_fb=2048, attention=2048, decode=32768))
    only = a.only or SUITES
    runs = {"alibi": lambda: bench_alibi(sizes["alibi"], a),
            "dpb": lambda: bench_dpb(sizes["dpb"], sizes["dpb_fb"], a),
            "attention": lambda: bench_attention(sizes["attention"], a),
            "decode": lambda: bench_decode(sizes["decode"], a)}
    out = open(a.json, "w") if a.json else None
    for suite in SUITES:
        if suite not in only:
            continue
        for r in runs[suite]():
            line = json.dumps(r)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
