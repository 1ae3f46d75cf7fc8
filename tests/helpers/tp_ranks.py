"""One rank of a tensor-parallel FSDPEngine run (tests/unit/impl/engine/test_tensor_parallel.py).

    RANK=r WORLD_SIZE=w TP=t MASTER_PORT=p [RESUME_FROM=DIR] python -m helpers.tp_ranks OUT_DIR

The world is dp x tp (dp = w / t); rank r is data-parallel rank r // t and tensor-parallel rank
r % t, and the t ranks of one replica are handed the same rows (`rank_rows` of their dp rank),
as a model worker's tensor-parallel peers are. With the data and loss of helpers.fsdp_ranks:

    actor: step 1, step 2        → params_step2.safetensors, hf/ (save_hf), hf_tensors.safetensors
    recover/, step 3             → params_step3.safetensors
    a fresh engine, recovered    → params_step3_recovered.safetensors (continues as without)
    critic: initial, 2 steps     → critic_init.safetensors, critic_step2.safetensors

With RESUME_FROM (a recovery checkpoint written at another layout, e.g. by helpers.fsdp_ranks at
DP=2 after its two steps), only: load it, then step 3 → resumed_step3.safetensors.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file

from helpers.fsdp_ranks import (
    TINY_SFT,
    checkpoint_and_resume,
    critic_config,
    engine_config,
    full_params,
    run_critic_steps,
    run_steps,
)
from helpers.gloo_ranks import join_gloo_group
from realhf.base.process_exit import exit_now
from realhf.impl.engine.fsdp_engine import FSDPEngine
from realhf.impl.model import recover_checkpoint


def _write(out: Path, name: str, engine: FSDPEngine) -> None:
    params = full_params(engine)
    if engine.rank == 0:
        save_file({k: v.clone() for k, v in params.items()}, str(out / name))


def main(out: Path) -> None:
    rank, world_size = join_gloo_group(60)
    tp = int(os.environ["TP"])
    dp_rank, dp_size = rank // tp, world_size // tp
    try:
        if os.environ.get("RESUME_FROM"):
            engine = FSDPEngine(engine_config(tp_size=tp))
            engine.initialize()
            recover_checkpoint.load(Path(os.environ["RESUME_FROM"]), {"actor": engine}, rank, engine.device)
            stats = run_steps(engine, [0], dp_rank, dp_size)
            _write(out, "resumed_step3.safetensors", engine)
            if rank == 0:
                (out / "stats.json").write_text(json.dumps(stats))
            engine.destroy()
            dist.barrier()
            return
        engine = FSDPEngine(engine_config(tp_size=tp))
        engine.initialize()
        stats = run_steps(engine, [0, 1], dp_rank, dp_size)
        _write(out, "params_step2.safetensors", engine)
        engine.save_hf(out / "hf", tokenizer_source=TINY_SFT)
        streamed = {name: t.clone() for name, t in engine.hf_tensors()}  # every rank runs it; rank 0 gets them
        if rank == 0:
            save_file(streamed, str(out / "hf_tensors.safetensors"))
        stats += checkpoint_and_resume(out, engine, engine_config(tp_size=tp), dp_rank, dp_size)

        critic = FSDPEngine(critic_config(tp_size=tp))
        critic.initialize()
        _write(out, "critic_init.safetensors", critic)
        critic_stats = run_critic_steps(critic, [0, 1], dp_rank, dp_size)
        _write(out, "critic_step2.safetensors", critic)
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
