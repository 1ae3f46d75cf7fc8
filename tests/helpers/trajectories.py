"""Synthetic prompt groups for trainer tests: tokenised tiny-math answers with real behaviour
log-probs (computed by the starting model at T=1, as a generation server would return them).

In each group, half the samples are the reference solution (reward +1) and half the same
solution with a wrong final answer (reward −1), so GRPO advantages are ±1 and training has a
clear direction.
"""

from __future__ import annotations

import json
import os
import re
from typing import List, Sequence

import torch

from helpers.paths import TINY_MATH

TINY_SFT = os.path.join(TINY_MATH, "sft")
TRAIN_JSONL = os.path.join(TINY_MATH, "data", "train.jsonl")


def load_rows(n: int, offset: int = 0) -> List[dict]:
    rows = []
    with open(TRAIN_JSONL) as f:
        for i, line in enumerate(f):
            if i >= offset:
                rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def _wrong(solution: str) -> str:
    answer = int(re.search(r"#### (\d+)", solution).group(1))
    return re.sub(r"#### \d+", f"#### {answer + 1}", solution)


@torch.no_grad()
def _behaviour_logprobs(model, prompt: List[int], output: List[int]) -> List[float]:
    ids = torch.tensor([prompt + output])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    token_logp = logp.gather(-1, targets[:, None])[:, 0]
    return token_logp[len(prompt) - 1 :].tolist()


def make_groups(model, tokenizer, rows: Sequence[dict], group_size: int, version: int = 0) -> List[dict]:
    """One trajectory message (`Trajectory.to_msg()` form) per row, tokens stamped with `version`."""
    from realhf.api.trajectory import Sample, Trajectory

    eos = tokenizer.eos_token_id
    msgs = []
    for row in rows:
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        samples = []
        for i in range(group_size):
            correct = i % 2 == 0
            text = row["solutions"][0] if correct else _wrong(row["solutions"][0])
            output = tokenizer.encode(text, add_special_tokens=False) + [eos]
            samples.append(
                Sample(
                    output_ids=output,
                    logprobs=_behaviour_logprobs(model, prompt, output),
                    versions=[version] * len(output),
                    reward=1.0 if correct else -1.0,
                )
            )
        msgs.append(Trajectory(qid=f"{row['query_id']}-v{version}", prompt_ids=prompt, samples=samples).to_msg())
    return msgs


def load_tiny():
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(TINY_SFT).eval(), AutoTokenizer.from_pretrained(TINY_SFT)


def pack(msgs: Sequence[dict]):
    """The trainer's batch of `msgs` (make_groups' output), as the stream hands it over."""
    from realhf.api.trajectory import Trajectory
    from realhf.impl.model.batching import pack_trajectories

    return pack_trajectories([Trajectory.from_msg(m) for m in msgs], pad_id=0)


def trainer_config(**ppo):
    """A DP=1 CPU trainer's config on the tiny SFT model: the actor at lr 1e-3, a critic with its
    own optimizer (and no path: it loads the actor's), `ppo` as given."""
    from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
    from realhf.api.worker_configs import ModelWorkerConfig

    return ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=TINY_SFT, optimizer=OptimizerConfig(lr=1e-3)),
        critic=ModelTrainEvalConfig(optimizer=OptimizerConfig(lr=2e-3)),
        ppo=PPOHyperparameters(**ppo),
        device="cpu",
        seed=5,
    )


def flat_params(engine) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in engine.model.parameters()])
