#!/usr/bin/python3
"""Merge the JSON results of extrapolation.py runs (e.g. schemes run as separate processes
with the same settings) into one, print the Markdown table and write the SVG plot.

  report.py --json merged.json --svg docs/extrapolation.svg run1.json run2.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import extrapolation  # noqa: E402
import svgplot  # noqa: E402

# Settings that must agree between merged runs (the schemes and run times may differ).
SAME = ("seq_len", "steps", "batch", "lr", "warmup", "weight_decay", "seed", "layers", "width",
        "heads", "dpb_dim", "eval_mults", "eval_windows")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+")
    p.add_argument("--json", default=None)
    p.add_argument("--svg", default=None)
    args = p.parse_args()
    merged = None
    for path in args.inputs:
        with open(path) as f:
            res = json.load(f)
        if merged is None:
            merged = res
            merged["config"]["schemes"] = list(res["schemes"])
            continue
        for key in SAME:
            if res["config"][key] != merged["config"][key]:
                print(f"report: error: {path}: {key} = {res['config'][key]!r}, the first run "
                      f"has {merged['config'][key]!r}", file=sys.stderr)
                return 2
        for scheme, value in res["schemes"].items():
            merged["schemes"][scheme] = value
            merged["config"]["schemes"].append(scheme)
        merged["total_seconds"] = merged.get("total_seconds", 0) + res.get("total_seconds", 0)
    extrapolation.print_table(merged, sys.stdout)
    if args.json:
        extrapolation.write_json(merged, args.json)
    if args.svg:
        svgplot.write_plot(merged, args.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
