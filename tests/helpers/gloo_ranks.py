"""Start the ranks of a gloo process group as real processes (`python -m <module> <out>`, one
per rank, RANK/WORLD_SIZE/MASTER_PORT in the environment) and wait for all of them; a rank that
fails or outlives the timeout fails the test with every rank's log tail. In the rank process,
`join_gloo_group` joins the group the environment describes."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from helpers.paths import TESTS_DIR
from realhf.base.network import find_free_port

RANK_TIMEOUT_S = 120


def launch_ranks(
    module: str, out: Path, world_size: int, timeout: float = RANK_TIMEOUT_S, extra_env: Optional[Dict[str, str]] = None
) -> None:
    port, procs = find_free_port(), []
    for rank in range(world_size):
        env = dict(
            os.environ,
            **(extra_env or {}),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]),
        )
        with open(out / f"rank{rank}.log", "w") as log:  # the child keeps its own descriptor
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", module, str(out)], stdout=log, stderr=subprocess.STDOUT, env=env
                )
            )
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
        outputs = "\n".join(
            f"--- rank {r} (exit {c}) ---\n" + (out / f"rank{r}.log").read_text()[-4000:] for r, c in enumerate(codes)
        )
        pytest.fail(f"{module}: DP={world_size} ranks failed:\n{outputs}")


def join_gloo_group(timeout_s: float) -> Tuple[int, int]:
    """In a rank started by `launch_ranks`: one torch thread, the gloo group joined; (rank, world)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return rank, world_size
