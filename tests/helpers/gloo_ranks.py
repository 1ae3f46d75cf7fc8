"""Start the ranks of a gloo process group as real processes (`python -m <module> <out>`, one
per rank, RANK/WORLD_SIZE/MASTER_PORT in the environment) and wait for all of them; a rank that
fails or outlives the timeout fails the test with every rank's log tail."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from realhf.base.network import find_free_port

from helpers.paths import TESTS_DIR

RANK_TIMEOUT_S = 120


def launch_ranks(module: str, out: Path, world_size: int, timeout: float = RANK_TIMEOUT_S) -> None:
    port, procs = find_free_port(), []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
        with open(out / f"rank{rank}.log", "w") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, "-m", module, str(out)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
    try:
        for proc in procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{module}: rank {procs.index(proc)} of {world_size} still running after {timeout:g}s")
    finally:
        for proc in procs:  # a rank that failed leaves its peer waiting in a collective
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    codes = [p.returncode for p in procs]
    if any(codes):
        outputs = "\n".join(f"--- rank {r} (exit {c}) ---\n" + (out / f"rank{r}.log").read_text()[-4000:]
                            for r, c in enumerate(codes))
        pytest.fail(f"{module}: DP={world_size} ranks failed:\n{outputs}")
