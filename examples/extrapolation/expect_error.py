#!/usr/bin/python3
"""Test helper: run a command and require exit status 2 with exactly one stderr line that
starts with 'extrapolation: error:' and matches a regular expression.

  expect_error.py REGEX -- COMMAND...
"""
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print("usage: expect_error.py REGEX -- COMMAND...", file=sys.stderr)
        return 2
    pattern, command = sys.argv[1], sys.argv[3:]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = proc.stderr.splitlines()
    problems = []
    if proc.returncode != 2:
        problems.append(f"exit status {proc.returncode}, expected 2")
    if len(lines) != 1 or not lines[0].startswith("extrapolation: error: "):
        problems.append(f"expected one 'extrapolation: error: ...' line on stderr, got "
                        f"{len(lines)} lines")
    elif not re.search(pattern, lines[0]):
        problems.append(f"stderr does not match {pattern!r}")
    print(f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
