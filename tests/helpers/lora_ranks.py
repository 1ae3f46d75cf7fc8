"""One rank of a LoRA FSDPEngine run at DP=2 (tests/unit/impl/engine/test_lora_dp2.py).

    RANK=r WORLD_SIZE=w MASTER_PORT=p [TP=t] python -m helpers.lora_ranks OUT_DIR

With TP=t the engine also splits its layers (and adapters) over t ranks; the world is then
(w / t) data-parallel replicas, and the t ranks of a replica take the same rows.

The engine of helpers.fsdp_ranks with `lora_config()`'s adapters; each rank trains its share
of `make_batch()`:

    step 1, step 2                    → rank 0 writes params_step2.safetensors, save_hf → hf/,
                                        reference log-probs (adapters off) → ref_logprobs.safetensors
    recover_checkpoint.save(recover/), step 3 → params_step3.safetensors
    a fresh engine: recover_checkpoint.load, step 3 → params_step3_recovered.safetensors
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from helpers.fsdp_ranks import (
    TINY_SFT,
    _write,
    checkpoint_and_resume,
    engine_config,
    make_batch,
    run_steps,
    token_logprobs,
)
from helpers.gloo_ranks import join_gloo_group
from realhf.api.cli_args import LoRAConfig
from realhf.base.process_exit import exit_now
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig
from realhf.impl.model.lora import BaseModelView

LORA = LoRAConfig(r=4, alpha=8.0)


def lora_config(**overrides) -> FSDPEngineConfig:
    cfg = engine_config(**overrides)
    cfg.model.lora = copy.deepcopy(LORA)
    return cfg


def main(out: Path) -> None:
    from safetensors.torch import save_file

    rank, world_size = join_gloo_group(60)
    tp = int(os.environ.get("TP", "1"))
    dp_rank, dp_size = rank // tp, world_size // tp
    try:
        engine = FSDPEngine(lora_config(tp_size=tp))
        engine.initialize()
        stats = run_steps(engine, [0, 1], dp_rank, dp_size)
        _write(out, "params_step2.safetensors", engine)
        engine.save_hf(out / "hf", tokenizer_source=TINY_SFT)
        # Every rank computes its own rows' reference log-probs; here each takes the whole batch.
        ref = BaseModelView(engine).forward(make_batch(), token_logprobs)  # [N, T-1]
        if rank == 0:
            save_file({"ref": ref.contiguous()}, str(out / "ref_logprobs.safetensors"))
        stats += checkpoint_and_resume(out, engine, lora_config(tp_size=tp), dp_rank, dp_size)
        if rank == 0:
            (out / "stats.json").write_text(json.dumps(stats))
        dist.barrier()  # leave gloo together (see helpers.fsdp_ranks)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # as realhf's rank processes end (realhf.base.process_exit says why)
