"""The order in which a run's rollout workers draw prompts, and the qids its steps trained: what
the no-replay / no-skip tests compare."""

import json
import os
from typing import List

from helpers.paths import REPO
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_jsonl_prompts, shard

TRAIN_JSONL = os.path.join(REPO, "assets/tiny-math/data/train.jsonl")


def draw_order(index: int, n: int, n_workers: int, seed: int) -> List[str]:
    """The first `n` qids rollout worker `index` of `n_workers` draws with the run's `seed`."""
    sampler = PromptSampler(shard(load_jsonl_prompts(TRAIN_JSONL), index, n_workers), seed=seed + index)
    out = []
    for _ in range(n):
        row = sampler.next()
        out.append(f"{row.query_id}@{sampler.epoch}")
    return out


def trained_qids(log_dir) -> List[dict]:
    """The `{step, qids}` lines of the run's trained_qids.jsonl."""
    lines = (log_dir / "trained_qids.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]
