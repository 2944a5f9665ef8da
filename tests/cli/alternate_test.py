"""ctest scripts.alternate: scripts/alternate.py (the before/after timing
helper) reports the median of the per-round ratios, reverses the order every
other round, and refuses bad arguments (exit 2) and commands that fail or
print no time (exit 1).

Usage: alternate_test.py SOURCE_DIR"""
import os
import subprocess
import sys
import tempfile


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def main():
    script = os.path.join(sys.argv[1], "scripts", "alternate.py")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "order")
        # Round times: a 2, 2, 2, 4 ms; b 1, 3, 1, 1 ms (from a counter per
        # command), so b's ratios are 0.5, 1.5, 0.5, 0.25: median 0.5, 3/4
        # faster; a's median time 2.
        def cmd(label, times):
            counter = os.path.join(tmp, label)
            return (f"{label}|n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}; "
                    f"echo {label} >> {log}; set -- {' '.join(times)}; shift $n; "
                    f"echo \"$1 ms each\"")
        r = run(script, "4", cmd("a", ["2", "2", "2", "4"]), cmd("b", ["1", "3", "1", "1"]))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[-2] == "a: median 2 ms, median ratio to a 1.000 (0/4 faster)", lines
        assert lines[-1] == "b: median 1 ms, median ratio to a 0.500 (3/4 faster)", lines
        with open(log) as f:
            assert f.read().split() == ["a", "b", "b", "a", "a", "b", "b", "a"]

        for args, message in ((["1", "a|x"], "need ROUNDS"),
                              (["two", "a|x", "b|y"], "ROUNDS must be an integer, got 'two'"),
                              (["0", "a|x", "b|y"], "ROUNDS must be at least 1, got 0"),
                              (["1", "a|x", "noseparator"], "expected \"label|command\""),
                              (["1", "a|x", "a|y"], "label 'a' given twice")):
            r = run(script, *args)
            assert r.returncode == 2 and message in r.stderr, (args, r.returncode, r.stderr)

        r = run(script, "1", "a|exit 3", "b|echo 1 ms each")
        assert r.returncode == 1 and "a: exit code 3" in r.stderr, r.stderr
        r = run(script, "1", "a|echo 1 ms each", "b|echo done")
        assert r.returncode == 1 and "b: exit code 0, no 'X ms each'" in r.stderr, r.stderr
    print("alternate.py: ratios, order and errors as documented")


if __name__ == "__main__":
    main()
