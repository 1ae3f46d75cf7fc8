"""One rank of an FSDPEngine run for the engine tests, and the data and loss every run shares.

    RANK=r WORLD_SIZE=w MASTER_PORT=p python -m helpers.fsdp_ranks OUT_DIR

Each rank joins a gloo group on 127.0.0.1:p and trains its share of `make_batch()` (samples are
dealt out per minibatch: rank r of w takes the r-th contiguous w-th of each minibatch, so the
ranks of one step together hold exactly the minibatch DP=1 trains on):

    actor: step 1, step 2             → rank 0 writes params_step2.safetensors, save_hf → hf/
    recover_checkpoint.save(recover/), step 3 → params_step3.safetensors
    a fresh engine: recover_checkpoint.load, step 3 → params_step3_recovered.safetensors
    critic (value head): initialised  → critic_init.safetensors
    critic: step 1, step 2            → critic_step2.safetensors

`run_steps` / `run_critic_steps` are also what the tests call in-process for the DP=1 reference;
`open_engines` is how in-process tests hold engines.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

import torch
import torch.distributed as dist

from helpers.gloo_ranks import join_gloo_group
from helpers.paths import TINY_MATH
from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig
from realhf.api.train_batch import TrainBatch
from realhf.base.process_exit import exit_now
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig
from realhf.impl.model import recover_checkpoint
from realhf.impl.model.utils import ppo_functional as F
from realhf.system.trainer.actor import token_values

TINY_SFT = os.path.join(TINY_MATH, "sft")
N_ROWS, N_STEPS = 16, 2  # two minibatches of 8 samples: one per optimizer step


def engine_config(**overrides) -> FSDPEngineConfig:
    # Cosine LR over 4 steps: every step has its own LR, so a lost schedule state shows.
    # Adam moves a weight whose gradient g is near 0 by ≈ lr·g/eps, so with the default eps (1e-8)
    # float summation-order noise in g (~1e-10 between DP=1 and DP=2) moves a few weights by
    # ~1e-5; eps = 1e-6 keeps that noise ~100x below the 1e-5 tolerance.
    optimizer = OptimizerConfig(lr=1e-3, eps=1e-6, lr_scheduler_type="cosine", min_lr_ratio=0.1, gradient_clipping=0.5)
    # 24 padded tokens per micro-batch: in each step one rank of two has a micro-batch more than
    # the other (which runs a padding forward), for the actor (prompts shared by the rows of a
    # group: realhf.impl.engine.shared_prompt, under FSDP at DP=2) and for the critic (plain).
    fields = dict(
        model=ModelTrainEvalConfig(path=TINY_SFT, optimizer=optimizer),
        total_steps=4,
        device="cpu",
        micro_batch_tokens=24,
        shared_prompt=True,
    )
    return FSDPEngineConfig(**{**fields, **overrides})


def critic_config(**overrides) -> FSDPEngineConfig:
    """The actor's config with a value head (seeded: every rank builds the same head)."""
    return engine_config(value_head=True, seed=3, **overrides)


@contextmanager
def open_engines(*configs: FSDPEngineConfig) -> Iterator[List[FSDPEngine]]:
    """Initialised engines, destroyed in reverse order on exit. In a process without a group the
    first engine creates (and owns) a one-rank gloo group, so it must be the last destroyed."""
    engines: List[FSDPEngine] = []
    try:
        for config in configs:
            engines.append(FSDPEngine(config))
            engines[-1].initialize()
        yield engines
    finally:
        for engine in reversed(engines):
            engine.destroy()


def make_batch() -> TrainBatch:
    """16 right-padded samples in groups of 4 sharing a prompt of 3-6 tokens, 1-12 output tokens
    each (so the ranks' token counts differ), rewards ±1 as the advantage of every output token."""
    g = torch.Generator().manual_seed(0)
    group_ids = torch.arange(N_ROWS) // 4  # [N]
    prompts = [torch.randint(4, 258, (int(n),), generator=g) for n in torch.randint(3, 7, (N_ROWS // 4,), generator=g)]
    prompt_lens = torch.tensor([len(prompts[k]) for k in group_ids.tolist()])  # [N]
    output_lens = torch.randint(1, 13, (N_ROWS,), generator=g)  # [N]
    width = int((prompt_lens + output_lens).max())
    input_ids = torch.zeros((N_ROWS, width), dtype=torch.long)  # [N, T]
    attention_mask = torch.zeros((N_ROWS, width), dtype=torch.long)  # [N, T]
    loss_mask = torch.zeros((N_ROWS, width - 1), dtype=torch.bool)  # [N, T-1]
    for i, (p, o) in enumerate(zip(prompt_lens.tolist(), output_lens.tolist())):
        input_ids[i, :p] = prompts[int(group_ids[i])]
        input_ids[i, p : p + o] = torch.randint(4, 258, (o,), generator=g)
        attention_mask[i, : p + o] = 1
        loss_mask[i, p - 1 : p - 1 + o] = True
    rewards = torch.where(torch.rand(N_ROWS, generator=g) > 0.5, 1.0, -1.0)  # [N]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=torch.zeros(loss_mask.shape),
        rewards=rewards,
        group_ids=group_ids,
        prompt_lens=prompt_lens,
    )


def rank_rows(step: int, rank: int, world_size: int) -> torch.Tensor:
    minibatch = torch.arange(N_ROWS).chunk(N_STEPS)[step]
    return minibatch.tensor_split(world_size)[rank]


def token_logprobs(logits: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """log π(token t+1 | ≤ t) of each prediction; 0 on padding."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [n, t-1, V]
    logp = logp.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)  # [n, t-1]
    return torch.where(mb.attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))


def train_step(engine: FSDPEngine, batch: TrainBatch) -> Dict[str, float]:
    """One PPO step: the old log-probs are this engine's own (ratio 1 before the step, moved by
    a fixed offset so the clip is active on some tokens); advantages are the rewards."""
    offset = 0.3 * torch.sin(batch.input_ids[:, 1:].float())  # [N, T-1] a function of the token alone
    old = engine.forward(batch, token_logprobs) + offset  # [N, T-1]
    advantages = batch.rewards[:, None].expand_as(batch.loss_mask)  # [N, T-1]

    def ppo_loss(logits: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
        w = mb.loss_mask.shape[1]
        loss, _ = F.actor_loss_fn(
            token_logprobs(logits, mb),
            old[rows, :w].to(logits.device),
            advantages[rows, :w].to(logits.device),
            eps_clip=0.2,
            loss_mask=mb.loss_mask,
            reduce="sum",
        )
        return loss

    return engine.train_batch(batch, ppo_loss, lambda mb: float(mb.loss_mask.sum()))


def run_steps(engine: FSDPEngine, steps: List[int], rank: int, world_size: int) -> List[Dict[str, float]]:
    batch = make_batch()
    return [train_step(engine, batch.select(rank_rows(step % N_STEPS, rank, world_size))) for step in steps]


def critic_train_step(engine: FSDPEngine, batch: TrainBatch) -> Dict[str, float]:
    """One clipped-value-loss step toward returns = the sample's reward on every output token,
    clipped around the engine's own values before the step (ε 0.2: some tokens clip)."""
    old_values = engine.forward(batch, token_values)  # [N, T-1]
    returns = batch.rewards[:, None].expand_as(batch.loss_mask)  # [N, T-1]

    def value_loss(output: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
        w, dev = mb.loss_mask.shape[1], output.device
        loss, _ = F.value_loss_fn(
            token_values(output, mb),
            old_values[rows, :w].to(dev),
            returns[rows, :w].to(dev),
            eps_clip=0.2,
            mask=mb.loss_mask,
        )
        return loss

    return engine.train_batch(batch, value_loss, lambda mb: float(mb.loss_mask.sum()))


def run_critic_steps(engine: FSDPEngine, steps: List[int], rank: int, world_size: int) -> List[Dict[str, float]]:
    batch = make_batch()
    return [critic_train_step(engine, batch.select(rank_rows(step % N_STEPS, rank, world_size))) for step in steps]


def full_params(engine: FSDPEngine) -> Dict[str, torch.Tensor]:
    """Every parameter, gathered (a collective; the full tensors are on rank 0)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def dp1_steps(config: FSDPEngineConfig):
    """(parameters, stats) after steps [0, 1] on one unwrapped rank in this process: what a DP=2
    run of the same config must match."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = FSDPEngine(config)
    try:
        engine.initialize()
        stats = run_steps(engine, [0, 1], rank=0, world_size=1)
        return full_params(engine), stats
    finally:
        engine.destroy()
        torch.set_num_threads(threads)


def dp1_critic_steps():
    """(initial parameters, parameters, stats) of the critic's steps [0, 1] on one unwrapped rank
    in this process: what a split or data-parallel critic run must match."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with open_engines(critic_config()) as (critic,):
            initial = full_params(critic)
            stats = run_critic_steps(critic, [0, 1], rank=0, world_size=1)
            return initial, full_params(critic), stats
    finally:
        torch.set_num_threads(threads)


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over tensors of the same names (the names must match)."""
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _write(out: Path, name: str, engine: FSDPEngine) -> None:
    from safetensors.torch import save_file

    params = full_params(engine)
    if engine.rank == 0:
        # A tied weight is one tensor under two names; safetensors stores each name's own copy.
        save_file({k: v.clone() for k, v in params.items()}, str(out / name))


def checkpoint_and_resume(
    out: Path, engine: FSDPEngine, config: FSDPEngineConfig, dp_rank: int, dp_size: int, write=None
):
    """After two steps: a recovery checkpoint (recover/), step 3 (params_step3.safetensors), then a
    fresh engine of `config` restored from it takes step 3 again (params_step3_recovered.safetensors).
    Destroys `engine`; returns the two steps' stats. `write(out, name, engine)`: how parameters are
    written (default `_write`)."""
    write = write or _write
    rank, world_size = engine.rank, engine.world_size
    recover_checkpoint.save(out / "recover", {"actor": engine}, rank, world_size, engine.device, extra={"version": 2})
    stats = run_steps(engine, [0], dp_rank, dp_size)
    write(out, "params_step3.safetensors", engine)
    engine.destroy()
    fresh = FSDPEngine(config)
    fresh.initialize()
    recover_checkpoint.load(out / "recover", {"actor": fresh}, rank, fresh.device)
    stats += run_steps(fresh, [0], dp_rank, dp_size)
    write(out, "params_step3_recovered.safetensors", fresh)
    fresh.destroy()
    return stats


def main(out: Path) -> None:
    rank, world_size = join_gloo_group(60)
    try:
        engine = FSDPEngine(engine_config())
        engine.initialize()
        stats = run_steps(engine, [0, 1], rank, world_size)
        _write(out, "params_step2.safetensors", engine)
        engine.save_hf(out / "hf", tokenizer_source=TINY_SFT)
        stats += checkpoint_and_resume(out, engine, engine_config(), rank, world_size)

        critic = FSDPEngine(critic_config())
        critic.initialize()
        _write(out, "critic_init.safetensors", critic)
        critic_stats = run_critic_steps(critic, [0, 1], rank, world_size)
        _write(out, "critic_step2.safetensors", critic)
        critic.destroy()
        if rank == 0:
            (out / "stats.json").write_text(json.dumps(stats))
            (out / "critic_stats.json").write_text(json.dumps(critic_stats))
        # Both ranks leave gloo together: a rank that tears down while its peer still talks to it
        # can abort (seen once in the engine benchmark: "terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # as realhf's rank processes end (realhf.base.process_exit says why)
