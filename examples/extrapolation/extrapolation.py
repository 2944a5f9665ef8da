#!/usr/bin/python3
"""Train short, test long: a byte-level language model trained at length L, evaluated at
L, 2L, 4L and 8L, with ALiBi, DynamicPositionBias, T5 buckets, sinusoidal embeddings or no
positions (Press, Smith and Lewis, "Train Short, Test Longer", ICLR 2022).

  python3 extrapolation.py --op-library build/torch/libposbias_torch_ops.so
  python3 extrapolation.py --attention torch --schemes alibi,sinusoidal --steps 300
  python3 extrapolation.py --compare-speed 20
  python3 extrapolation.py --check-agreement

See docs/extrapolation.md for the results and how they were produced. Exit status: 0 on
success, 1 when an --expect bound or the --check-agreement tolerance fails, 2 on bad input
(a missing corpus, an unknown option value, a length that does not fit in memory).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import model  # noqa: E402
import svgplot  # noqa: E402

PROG = "extrapolation"


class UsageError(Exception):
    """Bad input: reported as one `extrapolation: error: ...` line, exit status 2."""


# ----------------------------------------------------------------------------- set-up


def load_posbias_ops(op_library):
    """Make torch.ops.posbias available: from --op-library / $POSBIAS_TORCH_OPS, else through
    the `posbias` Python package (python/ on PYTHONPATH), which loads the library itself."""
    path = op_library or os.environ.get("POSBIAS_TORCH_OPS")
    if path:
        if not os.path.isfile(path):
            raise UsageError(f"op library {path!r} does not exist (build it with "
                             f"cmake --build BUILD --target posbias_torch_ops)")
        torch.ops.load_library(path)
    else:
        try:
            import posbias  # noqa: F401
        except ImportError as e:
            raise UsageError(
                "--attention posbias needs the posbias op library: pass --op-library "
                "BUILD/torch/libposbias_torch_ops.so (or set POSBIAS_TORCH_OPS), put python/ "
                f"on PYTHONPATH, or use --attention torch ({e})") from e
    try:
        torch.ops.posbias.attention
    except (AttributeError, RuntimeError) as e:
        raise UsageError(f"the posbias op library is loaded but has no posbias::attention "
                         f"op ({e})") from e


def parse_list(text, what, allowed=None, kind=str):
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UsageError(f"{what} is empty")
    out = []
    for item in items:
        if allowed is not None and item not in allowed:
            raise UsageError(f"unknown {what} {item!r} (choose from {', '.join(allowed)})")
        try:
            out.append(kind(item))
        except ValueError:
            raise UsageError(f"{what}: {item!r} is not a {kind.__name__}") from None
    if len(set(out)) != len(out):
        raise UsageError(f"{what} repeats an entry: {text!r}")
    return out


def parse_expect(text):
    """SCHEME:MIN:MAX, bounds on ppl(longest) / ppl(L) over all tokens ('' = unbounded)."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in model.SCHEMES:
        raise UsageError(f"--expect {text!r}: expected SCHEME:MIN:MAX, e.g. alibi::1.05 or "
                         f"sinusoidal:1.5:")
    try:
        lo = float(parts[1]) if parts[1] else -math.inf
        hi = float(parts[2]) if parts[2] else math.inf
    except ValueError:
        raise UsageError(f"--expect {text!r}: bounds must be numbers") from None
    return parts[0], lo, hi


def available_memory_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(args, eval_lengths):
    """Refuse, before any training, a run whose estimated activations exceed the limit."""
    if args.memory_limit_mb is not None:
        limit, source = args.memory_limit_mb * 2**20, f"--memory-limit-mb {args.memory_limit_mb}"
    else:
        avail = available_memory_bytes()
        if avail is None:
            return
        limit, source = avail // 2, f"half of MemAvailable ({avail / 2**30:.1f} GiB)"
    needs = [("training", args.seq_len, args.batch,
              model.estimate_activation_bytes(args.batch, args.seq_len, args.layers, args.width,
                                              args.heads, args.attention, True))]
    for n in eval_lengths:
        b = eval_batch(args, n)
        needs.append((f"evaluation at length {n}", n, b,
                      model.estimate_activation_bytes(b, n, args.layers, args.width, args.heads,
                                                      args.attention, False)))
    for what, n, b, need in needs:
        if need > limit:
            raise UsageError(
                f"{what} (batch {b} x {n} tokens, {args.attention} attention) needs about "
                f"{need / 2**30:.2f} GiB of activations, more than the limit of "
                f"{limit / 2**30:.2f} GiB ({source}); use shorter lengths (--seq-len, "
                f"--eval-mults), a smaller --batch / --eval-tokens, or --attention posbias")


def eval_batch(args, n):
    return max(1, args.eval_tokens // n)


def lr_at(step, args):
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def new_model(args, scheme):
    torch.manual_seed(args.seed)
    return model.ByteLM(scheme, layers=args.layers, width=args.width, heads=args.heads,
                        dpb_dim=args.dpb_dim)


def new_optimizer(net, args):
    return torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95),
                             weight_decay=args.weight_decay)


# ----------------------------------------------------------------------------- train / evaluate


def train(net, train_data, offsets, args, attend, log):
    opt = new_optimizer(net, args)
    net.train()
    losses = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        x, y = corpus.batch_at(train_data, offsets[step], args.seq_len)
        loss = F.cross_entropy(net(x, attend).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise RuntimeError(f"training diverged at step {step} (loss {losses[-1]})")
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            recent = losses[-args.log_every:]
            log(f"    step {step + 1:5d}  loss {sum(recent) / len(recent):.4f}  "
                f"lr {lr_at(step, args):.2e}")
    return losses


@torch.no_grad()
def evaluate(net, heldout, ends, n, seq_len, args, attend):
    """Perplexity at length n over all tokens of the windows [end - n, end), and over their last
    seq_len tokens (the same tokens at every n)."""
    net.eval()
    ends_t = torch.tensor(ends)
    total_all, total_last, count_all, count_last = 0.0, 0.0, 0, 0
    b = eval_batch(args, n)
    for k in range(0, len(ends), b):
        starts = ends_t[k:k + b] - (n + 1)
        x, y = corpus.batch_at(heldout, starts, n)
        nll = F.cross_entropy(net(x, attend).reshape(-1, 256), y.reshape(-1),
                              reduction="none").view(y.shape).double()
        total_all += nll.sum().item()
        count_all += nll.numel()
        total_last += nll[:, -seq_len:].sum().item()
        count_last += nll[:, -seq_len:].numel()
    return math.exp(total_all / count_all), math.exp(total_last / count_last), count_all


# ----------------------------------------------------------------------------- modes


def run_extrapolation(args, data_split, log):
    train_data, heldout = data_split
    eval_lengths = [m * args.seq_len for m in args.eval_mults]
    ends = corpus.evaluation_ends(len(heldout), max(eval_lengths), args.eval_windows)
    offsets = corpus.training_offsets(len(train_data), args.seq_len, args.batch, args.steps,
                                      args.seed)
    attend = model.ATTENTION_FUNCTIONS[args.attention]
    log(f"training {len(args.schemes)} scheme(s) x {args.steps} steps, batch {args.batch} x "
        f"L = {args.seq_len}, {args.attention} attention, seed {args.seed}; evaluating at "
        f"{eval_lengths} on {len(ends)} windows per length")
    results = {"config": config_dict(args, len(ends)), "schemes": {}}
    run_start = time.perf_counter()
    for scheme in args.schemes:
        net = new_model(args, scheme)
        params = sum(p.numel() for p in net.parameters())
        log(f"  {scheme}: {params} parameters")
        t0 = time.perf_counter()
        losses = train(net, train_data, offsets, args, attend, log)
        t_train = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = []
        for mult, n in zip(args.eval_mults, eval_lengths):
            ppl_all, ppl_last, tokens = evaluate(net, heldout, ends, n, args.seq_len, args,
                                                 attend)
            rows.append({"mult": mult, "length": n, "ppl_all": ppl_all, "ppl_last": ppl_last,
                         "tokens": tokens})
        t_eval = time.perf_counter() - t0
        log(f"    trained in {t_train:.1f} s, evaluated in {t_eval:.1f} s; perplexity (all / "
            f"last L): " + ", ".join(f"{r['mult']}L {r['ppl_all']:.3f} / {r['ppl_last']:.3f}"
                                      for r in rows))
        results["schemes"][scheme] = {
            "parameters": params, "train_seconds": t_train, "eval_seconds": t_eval,
            "final_train_loss": sum(losses[-50:]) / len(losses[-50:]), "eval": rows}
        results["total_seconds"] = time.perf_counter() - run_start
        if args.json:  # after every scheme, so that a long run's finished part is kept
            write_json(results, args.json)
    return results


def write_json(results, path):
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


def config_dict(args, windows):
    return {k: getattr(args, k) for k in (
        "attention", "schemes", "seq_len", "steps", "batch", "lr", "warmup", "weight_decay",
        "seed", "layers", "width", "heads", "dpb_dim", "eval_mults", "eval_tokens", "threads")
    } | {"eval_windows": windows, "corpus_dir": args.corpus_dir_used,
         "torch": torch.__version__}


def print_table(results, out):
    mults = [r["mult"] for r in next(iter(results["schemes"].values()))["eval"]]
    head = " | ".join(f"{m}L" for m in mults)
    out.write(f"| scheme | {head} | {mults[-1]}L / L | train s |\n")
    out.write("|---" * (len(mults) + 3) + "|\n")
    for scheme, res in results["schemes"].items():
        cells = " | ".join(f"{r['ppl_all']:.3f} ({r['ppl_last']:.3f})" for r in res["eval"])
        ratio = res["eval"][-1]["ppl_all"] / res["eval"][0]["ppl_all"]
        out.write(f"| {scheme} | {cells} | {ratio:.3f} | {res['train_seconds']:.0f} |\n")
    out.write("(perplexity over all tokens of each window, in brackets over its last L "
              "tokens)\n")


def check_expectations(results, expects, log):
    ok = True
    for scheme, lo, hi in expects:
        res = results["schemes"].get(scheme)
        if res is None:
            log(f"FAIL --expect {scheme}: the scheme was not run")
            ok = False
            continue
        first, last = res["eval"][0], res["eval"][-1]
        ratio = last["ppl_all"] / first["ppl_all"]
        good = lo <= ratio <= hi
        ok &= good
        log(f"{'ok  ' if good else 'FAIL'} {scheme}: perplexity at {last['mult']}L / at "
            f"{first['mult']}L = {last['ppl_all']:.3f} / {first['ppl_all']:.3f} = {ratio:.3f}, "
            f"expected in [{lo}, {hi}]")
    return ok


def compare_speed(args, data_split, log):
    """Training steps with the posbias op against the plain PyTorch attention, interleaved step
    by step (so both see the same machine load), same model weights and batches: medians of the
    forward (to the loss), backward and whole-step times."""
    train_data, _ = data_split
    steps = args.compare_speed
    warmup = 3
    offsets = corpus.training_offsets(len(train_data), args.seq_len, args.batch, steps + warmup,
                                      args.seed)
    report = {"config": config_dict(args, 0), "steps": steps, "schemes": {}}
    for scheme in args.schemes:
        runs = {}
        for impl in model.ATTENTIONS:
            net = new_model(args, scheme)
            runs[impl] = {"net": net, "opt": new_optimizer(net, args),
                          "fwd": [], "bwd": [], "step": []}
        for step in range(steps + warmup):
            x, y = corpus.batch_at(train_data, offsets[step], args.seq_len)
            for impl, run in runs.items():
                attend = model.ATTENTION_FUNCTIONS[impl]
                t0 = time.perf_counter()
                loss = F.cross_entropy(run["net"](x, attend).reshape(-1, 256), y.reshape(-1))
                t1 = time.perf_counter()
                run["opt"].zero_grad(set_to_none=True)
                loss.backward()
                t2 = time.perf_counter()
                run["opt"].step()
                t3 = time.perf_counter()
                if step >= warmup:
                    run["fwd"].append(t1 - t0)
                    run["bwd"].append(t2 - t1)
                    run["step"].append(t3 - t0)
        # An evaluation batch at the longest length (no grad), where the plain attention's
        # [b, h, n, n] tensors are largest.
        n = max(args.eval_mults) * args.seq_len
        tokens = torch.randint(0, 256, (eval_batch(args, n), n),
                               generator=torch.Generator().manual_seed(args.seed))
        with torch.no_grad():
            for rep in range(4):
                for impl, run in runs.items():
                    t0 = time.perf_counter()
                    run["net"](tokens, model.ATTENTION_FUNCTIONS[impl])
                    if rep:
                        run.setdefault("eval", []).append(time.perf_counter() - t0)
        med = {impl: {k: statistics.median(run[k]) for k in ("fwd", "bwd", "step", "eval")}
               for impl, run in runs.items()}
        report["schemes"][scheme] = med
        log(f"  {scheme}: median ms over {steps} steps (batch {args.batch} x {args.seq_len}); "
            f"evaluation forward: batch {tokens.shape[0]} x {n}, median of 3:")
        for k, name in (("fwd", "forward"), ("bwd", "backward"), ("step", "whole step"),
                        ("eval", "eval fwd")):
            p, t = med["posbias"][k] * 1e3, med["torch"][k] * 1e3
            log(f"    {name:10s} posbias {p:8.1f}  torch {t:8.1f}  torch / posbias {t / p:5.2f}")
    return report


def check_agreement(args, log):
    """Every scheme's logits (and one backward's gradients) with the posbias op against the
    plain PyTorch attention, same weights and input, at L and at the longest length."""
    torch.manual_seed(args.seed + 1)
    worst = 0.0
    ok = True
    for scheme in args.schemes:
        net = new_model(args, scheme)
        for n in (args.seq_len, max(args.eval_mults) * args.seq_len):
            tokens = torch.randint(0, 256, (2, n))
            out = {}
            grads = {}
            for impl in model.ATTENTIONS:
                net.zero_grad(set_to_none=True)
                logits = net(tokens, model.ATTENTION_FUNCTIONS[impl])
                logits.square().mean().backward()
                out[impl] = logits.detach()
                grads[impl] = {k: p.grad.clone() for k, p in net.named_parameters()
                               if p.grad is not None}
            diff = (out["posbias"] - out["torch"]).abs().max().item()
            # Relative to the largest gradient entry of the model: some gradients are exactly
            # 0 in exact arithmetic (the DPB output bias shifts every score of a head alike)
            # and only rounding noise in either path.
            largest = max(g.abs().max().item() for g in grads["torch"].values())
            gdiff = max((grads["posbias"][k] - g).abs().max().item()
                        for k, g in grads["torch"].items()) / largest
            good = diff <= args.agreement_tol and gdiff <= 1e-3
            ok &= good
            worst = max(worst, diff)
            log(f"  {'ok  ' if good else 'FAIL'} {scheme:10s} n {n:5d}: max |logits posbias - "
                f"torch| = {diff:.2e}, max gradient difference = {gdiff:.2e} of the largest")
    log(f"worst logit difference {worst:.2e} (tolerance {args.agreement_tol:g})")
    return check_position_tables(args, log) and ok


def check_position_tables(args, log):
    """The example builds its slopes and tables in PyTorch (so both attention paths see the same
    ones); they must equal the op library's own alibi_slopes, t5_distance_table and
    dpb_distance_table."""
    ops = torch.ops.posbias
    ok = True
    n = max(args.eval_mults) * args.seq_len
    with torch.no_grad():
        checks = [("alibi slopes", model.alibi_slopes(args.heads), ops.alibi_slopes(args.heads))]
        if "t5" in args.schemes:
            t5 = new_model(args, "t5").position
            t5.embedding.weight.normal_()  # a spread of values, not the small init
            checks.append(("t5 table", t5(n)["table"],
                           ops.t5_distance_table(t5.embedding.weight, n, True, t5.num_buckets,
                                                 t5.max_distance, 1.0)))
        if "dpb" in args.schemes:
            dpb = new_model(args, "dpb").position
            checks.append(("dpb table", dpb(n)["table"],
                           ops.dpb_distance_table(list(dpb.mlp.parameters()), n, "zeta")))
    for name, mine, theirs in checks:
        diff = (mine - theirs).abs().max().item() if mine.shape == theirs.shape else math.inf
        good = diff <= 1e-5 * max(1.0, theirs.abs().max().item())
        ok &= good
        log(f"  {'ok  ' if good else 'FAIL'} {name} {list(mine.shape)} against the op "
            f"library's: max difference {diff:.2e}")
    return ok


# ----------------------------------------------------------------------------- main


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--attention", default="posbias", choices=model.ATTENTIONS,
                   help="posbias: the fused op; torch: matmul, materialised bias, softmax")
    p.add_argument("--op-library", default=None,
                   help="path of libposbias_torch_ops.so (default: $POSBIAS_TORCH_OPS, else the "
                        "posbias Python package)")
    p.add_argument("--schemes", default=",".join(model.SCHEMES),
                   help="comma-separated position schemes")
    p.add_argument("--seq-len", type=int, default=64, help="training length L")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0, help="model init and batch order")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dpb-dim", type=int, default=32, help="DynamicPositionBias MLP width")
    p.add_argument("--eval-mults", default="1,2,4,8",
                   help="evaluation lengths as multiples of L (the first is the reference)")
    p.add_argument("--eval-windows", type=int, default=256,
                   help="windows per evaluation length (same window ends at every length)")
    p.add_argument("--eval-tokens", type=int, default=8192,
                   help="tokens per evaluation batch")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--corpus-dir", default=None,
                   help="folder of *.txt files (default: the newest /usr/share/vim/vim*/doc)")
    p.add_argument("--memory-limit-mb", type=int, default=None,
                   help="activation memory limit (default: half of MemAvailable)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--svg", default=None, help="write the perplexity plot (SVG) here")
    p.add_argument("--expect", action="append", default=[], metavar="SCHEME:MIN:MAX",
                   help="require MIN <= ppl(longest) / ppl(L) <= MAX (exit 1 otherwise)")
    p.add_argument("--compare-speed", type=int, default=0, metavar="N",
                   help="instead of the experiment: time N training steps of each attention")
    p.add_argument("--check-agreement", action="store_true",
                   help="instead of the experiment: compare the posbias and torch paths")
    p.add_argument("--agreement-tol", type=float, default=1e-5)
    return p


def validate(args):
    args.schemes = parse_list(args.schemes, "position scheme", model.SCHEMES)
    args.eval_mults = parse_list(args.eval_mults, "evaluation multiple", kind=int)
    positive = {"--seq-len": args.seq_len, "--steps": args.steps, "--batch": args.batch,
                "--layers": args.layers, "--width": args.width, "--heads": args.heads,
                "--dpb-dim": args.dpb_dim, "--eval-windows": args.eval_windows,
                "--eval-tokens": args.eval_tokens, "--threads": args.threads,
                "--log-every": args.log_every}
    for name, value in positive.items():
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if any(m < 1 for m in args.eval_mults):
        raise UsageError(f"--eval-mults must be positive, got {args.eval_mults}")
    if args.width % args.heads:
        raise UsageError(f"--width {args.width} is not a multiple of --heads {args.heads}")
    if args.warmup < 0 or args.compare_speed < 0:
        raise UsageError("--warmup and --compare-speed must not be negative")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr must be a positive number, got {args.lr}")
    if args.memory_limit_mb is not None and args.memory_limit_mb < 1:
        raise UsageError(f"--memory-limit-mb must be at least 1, got {args.memory_limit_mb}")
    args.expect = [parse_expect(e) for e in args.expect]


def main(argv=None):
    args = build_parser().parse_args(argv)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    try:
        validate(args)
        torch.set_num_threads(args.threads)
        if args.attention == "posbias" or args.compare_speed or args.check_agreement:
            load_posbias_ops(args.op_library)
        if args.check_agreement:
            args.corpus_dir_used = None
            return 0 if check_agreement(args, log) else 1
        if args.compare_speed:
            args.attention = "posbias"  # the estimate for the fused path; torch is checked too
        eval_lengths = [m * args.seq_len for m in args.eval_mults]
        for attention in ({"torch", "posbias"} if args.compare_speed else {args.attention}):
            saved, args.attention = args.attention, attention
            check_memory(args, [] if args.compare_speed else eval_lengths)
            args.attention = saved
        corpus_dir = corpus.find_corpus_dir(args.corpus_dir)
        args.corpus_dir_used = corpus_dir
        data, files = corpus.load_corpus(corpus_dir)
        split = corpus.split_corpus(data)
        log(f"corpus: {len(files)} files in {corpus_dir}, {len(data)} bytes; training on the "
            f"first {len(split[0])}, evaluating on the last {len(split[1])}")
    except (UsageError, corpus.CorpusError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2

    if args.compare_speed:
        report = compare_speed(args, split, log)
        if args.json:
            write_json(report, args.json)
        return 0

    results = run_extrapolation(args, split, log)
    print_table(results, sys.stdout)
    log(f"total time {results['total_seconds']:.1f} s")
    if args.svg:
        svgplot.write_plot(results, args.svg)
    return 0 if check_expectations(results, args.expect, log) else 1


if __name__ == "__main__":
    sys.exit(main())
