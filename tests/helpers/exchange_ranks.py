"""One rank of a group exchange (tests/unit/system/trainer/test_group_exchange.py).

    RANK=r WORLD_SIZE=w MASTER_PORT=p python -m helpers.exchange_ranks OUT_DIR

Rank r holds `held(r)` synthetic groups (qid `r/i`, sizes and lengths that differ per group);
every rank runs `exchange` under `ASSIGNMENT` and writes the qids and token arrays it ends with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from helpers.gloo_ranks import join_gloo_group
from realhf.api.trajectory import Sample, Trajectory
from realhf.base.process_exit import exit_now
from realhf.system.trainer.group_exchange import exchange

HELD = [3, 0, 2]  # rank 1 arrives with nothing
# rank 0 keeps one group and receives rank 2's second; rank 1 gets two of rank 0's; rank 2 keeps its first
ASSIGNMENT = [[(0, 1), (2, 1)], [(0, 0), (0, 2)], [(2, 0)]]


def group(rank: int, i: int) -> Trajectory:
    rng = np.random.default_rng(100 * rank + i)
    samples = []
    for _ in range(1 + (rank + i) % 3):
        n = int(rng.integers(1, 9))
        samples.append(
            Sample(
                output_ids=rng.integers(4, 200, n).astype(np.int32),
                logprobs=-rng.random(n).astype(np.float32),
                versions=np.full(n, i, dtype=np.int32),
                reward=float(rng.choice([-1.0, 1.0])),
            )
        )
    return Trajectory(qid=f"{rank}/{i}", prompt_ids=rng.integers(4, 200, 3 + i).astype(np.int32), samples=samples)


def describe(t: Trajectory) -> dict:
    return {
        "qid": t.qid,
        "prompt": t.prompt_ids.tolist(),
        "samples": [[s.output_ids.tolist(), s.logprobs.tolist(), s.versions.tolist(), s.reward] for s in t.samples],
    }


def main(out: Path) -> None:
    import torch.distributed as dist

    rank, _ = join_gloo_group(30)
    try:
        mine = exchange([group(rank, i) for i in range(HELD[rank])], ASSIGNMENT, rank)
        (out / f"rank{rank}.json").write_text(json.dumps([describe(t) for t in mine]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # as realhf's rank processes end (realhf.base.process_exit says why)
