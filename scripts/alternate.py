#!/usr/bin/env python3
"""Before/after timing on a shared, noisy machine: runs commands in turn,
round after round (the order reversed every other round, so neither always
runs first), and reports each command's median time and the median of its
per-round ratios to the first command's.

    python3 scripts/alternate.py ROUNDS "label|command" "label|command" ...

Each command prints its time as "X ms each" (as posbias-attention-loop
does). A command's time within a round is compared with the first
command's in the same round, so a slow minute slows both sides of that
round's ratio; "k/n faster" counts the rounds in which it beat the first
command. Scratch builds of two revisions: scripts/scratch-build.sh. Example:

    python3 scripts/alternate.py 8 \\
      "before|/work/A/build/cli/posbias-attention-loop decode_gqa --seconds 2" \\
      "after|/work/B/build/cli/posbias-attention-loop decode_gqa --seconds 2"

Exits 2 on bad arguments, 1 when a command fails or prints no time.
"""
import re
import statistics
import subprocess
import sys

TIME = re.compile(r"([0-9]+(?:\.[0-9]+)?) ms each")


def parse_args(argv):
    if len(argv) < 4:
        raise ValueError("need ROUNDS and at least two \"label|command\" arguments")
    try:
        rounds = int(argv[1])
    except ValueError:
        raise ValueError(f"ROUNDS must be an integer, got {argv[1]!r}") from None
    if rounds < 1:
        raise ValueError(f"ROUNDS must be at least 1, got {rounds}")
    commands = []
    for arg in argv[2:]:
        label, sep, command = arg.partition("|")
        if not sep or not label or not command:
            raise ValueError(f"expected \"label|command\", got {arg!r}")
        if any(label == known for known, _ in commands):
            raise ValueError(f"label {label!r} given twice")
        commands.append((label, command))
    return rounds, commands


def run(label, command):
    result = subprocess.run(command, shell=True, capture_output=True, text=True)
    found = TIME.search(result.stdout)
    if result.returncode != 0 or found is None:
        sys.stderr.write(result.stdout + result.stderr)
        missing = "" if found else ", no 'X ms each' in its output"
        raise RuntimeError(f"{label}: exit code {result.returncode}{missing}")
    return float(found.group(1))


def main(argv):
    try:
        rounds, commands = parse_args(argv)
    except ValueError as e:
        print(f"alternate.py: {e}\n{__doc__}", file=sys.stderr)
        return 2
    times = {label: [] for label, _ in commands}
    try:
        for r in range(rounds):
            order = commands if r % 2 == 0 else commands[::-1]
            for label, command in order:
                times[label].append(run(label, command))
            print(f"round {r + 1}: " + ", ".join(f"{label} {times[label][-1]:.4g} ms"
                                                 for label, _ in commands), flush=True)
    except RuntimeError as e:
        print(f"alternate.py: {e}", file=sys.stderr)
        return 1
    base = commands[0][0]
    for label, _ in commands:
        ratios = [a / b for a, b in zip(times[label], times[base])]
        faster = sum(1 for x in ratios if x < 1.0)
        print(f"{label}: median {statistics.median(times[label]):.4g} ms, "
              f"median ratio to {base} {statistics.median(ratios):.3f} "
              f"({faster}/{rounds} faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
