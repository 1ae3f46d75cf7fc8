"""One rank of a pipeline-parallel FSDPEngine run (tests/unit/impl/engine/test_pipeline_parallel.py).

    RANK=r WORLD_SIZE=w PP=p TP=t MASTER_PORT=port python -m helpers.pp_ranks OUT_DIR

The world is pp x dp x tp, pp outermost (dp = w / (p t)): rank r is stage r // (dp t),
data-parallel rank (r // t) % dp and tensor-parallel rank r % t. Every stage and tp rank of one
replica is handed the same rows (`rank_rows` of its dp rank), as a model worker's peers would be.
With the data and loss of helpers.fsdp_ranks:

    actor: forward               → logprobs{rank}.safetensors (its dp rank's rows of step 1)
    actor: step 1, step 2        → params_step2.safetensors, hf/ (save_hf), hf_tensors.safetensors,
                                   n_params.json (the engine's count on every rank)
    load_hf(hf/), recover/, step 3 → params_step3.safetensors
    a fresh engine, recovered    → params_step3_recovered.safetensors (continues as without)
    critic: initial, 2 steps     → critic_init.safetensors, critic_step2.safetensors (one micro-batch
                                   per step: the GPipe path; the loss is the same sum)
    critic: a NaN loss step      → critic_nan{rank}.json (skipped, parameters unchanged: every rank)

Parameters are gathered stage by stage with the engine's own `hf_tensors` generator, so every
file holds the whole model under its unsplit names.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from helpers.fsdp_ranks import (
    TINY_SFT,
    checkpoint_and_resume,
    critic_config,
    engine_config,
    make_batch,
    rank_rows,
    run_critic_steps,
    run_steps,
    token_logprobs,
)
from helpers.gloo_ranks import join_gloo_group
from realhf.base.process_exit import exit_now
from realhf.impl.engine import pipeline_calls
from realhf.impl.engine.fsdp_engine import FSDPEngine


def _write(out: Path, name: str, engine: FSDPEngine) -> None:
    params = {n: t.detach().cpu().clone().contiguous() for n, t in pipeline_calls.full_tensors(engine, skip_tied=False)}
    if engine.rank == 0:
        save_file(params, str(out / name))


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard (comparing DTensors would be a collective of their own)."""
    return p.detach().to_local() if isinstance(p, DTensor) else p.detach()


def main(out: Path) -> None:
    rank, world_size = join_gloo_group(60)
    pp, tp = int(os.environ["PP"]), int(os.environ["TP"])
    dp_size = world_size // (pp * tp)
    dp_rank = (rank // tp) % dp_size
    layout = dict(pp_size=pp, tp_size=tp)
    try:
        engine = FSDPEngine(engine_config(**layout))
        engine.initialize()
        logprobs = engine.forward(make_batch().select(rank_rows(0, dp_rank, dp_size)), token_logprobs)
        save_file({"logprobs": logprobs}, str(out / f"logprobs{rank}.safetensors"))  # every rank's copy
        stats = run_steps(engine, [0, 1], dp_rank, dp_size)
        _write(out, "params_step2.safetensors", engine)
        engine.save_hf(out / "hf", tokenizer_source=TINY_SFT)
        engine.load_hf(out / "hf")  # the same weights back (a tied head: stored once, on two stages)
        streamed = {name: t.cpu().clone() for name, t in engine.hf_tensors()}  # rank 0 gets them
        if rank == 0:
            save_file(streamed, str(out / "hf_tensors.safetensors"))
        (out / f"n_params{rank}.json").write_text(json.dumps([engine.n_params, engine.n_trainable]))
        stats += checkpoint_and_resume(out, engine, engine_config(**layout), dp_rank, dp_size, write=_write)

        # The whole batch as one micro-batch: fewer micro-batches than stages (GPipe), the same steps.
        critic = FSDPEngine(critic_config(micro_batch_tokens=0, **layout))
        critic.initialize()
        _write(out, "critic_init.safetensors", critic)
        critic_stats = run_critic_steps(critic, [0, 1], dp_rank, dp_size)
        _write(out, "critic_step2.safetensors", critic)
        # A NaN loss, computed on the last stage only: every rank must skip the step.
        before = [_local(p).clone() for p in critic.model.parameters()]
        nan_stats = critic.train_batch(
            make_batch().select(rank_rows(0, dp_rank, dp_size)),
            lambda output, mb, rows: output.float().sum() * float("nan"),
            lambda mb: float(mb.loss_mask.sum()),
        )
        unchanged = all(torch.equal(a, _local(b)) for a, b in zip(before, critic.model.parameters()))
        (out / f"critic_nan{rank}.json").write_text(
            json.dumps({"skipped": nan_stats["skipped"], "unchanged": unchanged})
        )
        critic.destroy()
        if rank == 0:
            (out / "stats.json").write_text(json.dumps(stats))
            (out / "critic_stats.json").write_text(json.dumps(critic_stats))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # as realhf's rank processes end (realhf.base.process_exit says why)
