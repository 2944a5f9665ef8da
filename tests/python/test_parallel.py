"""Head (tensor) and sequence (context) parallel attention with torch.distributed:
two processes with the gloo backend on 127.0.0.1 (a free port), each checking
that the gathered result equals the one-process result (parallel_worker.py)."""
import os
import socket
import subprocess
import sys

import pytest

posbias = pytest.importorskip("posbias")

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(script, world):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, script)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    report = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o}"
                       for r, (p, o) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 for p in procs), report
    for r, o in enumerate(outputs):
        assert f"rank {r}: ok" in o, report


def test_two_processes_gloo():
    run_world("parallel_worker.py", 2)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_gradients_equal_one_process(world):
    """ring_attention forward and backward over `world` gloo processes against
    one process (ALiBi, a distance table and no bias; causal and not; GQA)."""
    run_world("ring_worker.py", world)
