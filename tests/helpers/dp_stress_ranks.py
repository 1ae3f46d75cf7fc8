"""One rank of the data-parallel stress run (tests/unit/impl/engine/test_dp_stress.py).

    RANK=r WORLD_SIZE=w MASTER_PORT=p [STRESS_TP=t] python -m helpers.dp_stress_ranks OUT_DIR

With STRESS_TP=t every engine also splits its layers over t tensor-parallel ranks: the batch is
dealt to w / t data-parallel replicas, and the t ranks of a replica take the same rows.

Every rank builds the same engines (an actor with shared prompts, a critic, a LoRA actor, a
frozen reference) and walks through `N_CASES` random cases. A case is one global batch of
prompt groups (1–4 rows each: a group of one row shares nothing, so shared and plain groups
mix; prompts and answers of random lengths), dealt to the ranks group by group at random (a
rank may get nothing), with a random `micro_batch_tokens`, and one engine: a PPO step of an
actor (its forward, then `train_batch`), a value-loss step of the critic, or a forward of the
frozen reference. At WORLD_SIZE=1 the same cases run on the whole batch: the reference.

Each rank writes `rank<r>.json`: per case, its rows' forward outputs (by global row), the step's
loss, gradient norm and loss weight, and the case's seconds. Rank 0 also writes the trained
engine's parameters after the case (`params/<case>.safetensors`) at WORLD_SIZE=1, and compares
with them (`param_diff`, max |Δ|) at WORLD_SIZE > 1, reading the reference from $STRESS_REF.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.distributed as dist

from helpers.fsdp_ranks import TINY_SFT, critic_train_step, full_params, token_logprobs, train_step
from helpers.gloo_ranks import join_gloo_group
from realhf.api.cli_args import LoRAConfig, ModelTrainEvalConfig, OptimizerConfig
from realhf.api.train_batch import TrainBatch
from realhf.base.process_exit import exit_now
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig

N_CASES = int(os.environ.get("STRESS_CASES", "200"))
KINDS = ("actor", "critic", "lora", "ref")
MICRO_BATCH_TOKENS = (0, 8, 16, 24, 40, 1024)


def config(**overrides) -> FSDPEngineConfig:
    # A constant LR and eps 1e-6 (helpers.fsdp_ranks explains): every case's step is comparable
    # across DP sizes, however many cases ran before it.
    optimizer = OptimizerConfig(lr=1e-4, eps=1e-6, gradient_clipping=0.5)
    # micro_batch_tokens: each case sets its own (engine.config.micro_batch_tokens below).
    fields = dict(
        model=ModelTrainEvalConfig(path=TINY_SFT, optimizer=optimizer),
        device="cpu",
        shared_prompt=True,
        micro_batch_tokens=0,
    )
    return FSDPEngineConfig(**{**fields, **overrides})


def case(index: int, world: int):
    """(engine kind, micro_batch_tokens, the global batch, the global rows of each rank)."""
    rng, deal = random.Random(index), random.Random(f"{index}/{world}")  # the batch is the same at every DP size
    kind = KINDS[index % len(KINDS)]
    n_groups = rng.randint(1, 6)
    sizes = [rng.choice((1, 1, 2, 3, 4)) for _ in range(n_groups)]
    owner = [deal.randrange(world) for _ in range(n_groups)]
    if world > 1 and deal.random() < 0.3:  # one rank left empty
        empty = deal.randrange(world)
        owner = [o if o != empty else (o + 1) % world for o in owner]
    rows, group_ids, prompt_lens, rank_rows = [], [], [], [[] for _ in range(world)]
    for g, (size, o) in enumerate(zip(sizes, owner)):
        prompt = [rng.randrange(4, 200) for _ in range(rng.randint(1, 8))]
        for _ in range(size):
            rank_rows[o].append(len(rows))
            rows.append((prompt, [rng.randrange(4, 200) for _ in range(rng.randint(1, 14))]))
            group_ids.append(g)
            prompt_lens.append(len(prompt))
    width = max(len(p) + len(a) for p, a in rows)
    n = len(rows)
    input_ids = torch.zeros((n, width), dtype=torch.long)  # [N, T]
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # [N, T]
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)  # [N, T-1]
    for i, (p, a) in enumerate(rows):
        input_ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        attention_mask[i, : len(p) + len(a)] = 1
        loss_mask[i, len(p) - 1 : len(p) - 1 + len(a)] = True
    rewards = torch.tensor([rng.choice((-1.0, 1.0)) for _ in range(n)])  # [N]
    batch = TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=torch.zeros(loss_mask.shape),
        rewards=rewards,
        group_ids=torch.tensor(group_ids),
        prompt_lens=torch.tensor(prompt_lens),
    )
    return kind, MICRO_BATCH_TOKENS[index // len(KINDS) % len(MICRO_BATCH_TOKENS)], batch, rank_rows


def trained_params(engine: FSDPEngine) -> Dict[str, torch.Tensor]:
    params = full_params(engine)
    if engine.lora_scaling:
        trained = {name for name, p in engine.model.named_parameters() if p.requires_grad}
        params = {k: v for k, v in params.items() if k in trained}
    return params


def main(out: Path) -> None:
    from safetensors.torch import load_file, save_file

    rank, world = join_gloo_group(30)
    tp = int(os.environ.get("STRESS_TP", "1"))
    dp_rank, dp = rank // tp, world // tp
    ref_dir = Path(os.environ["STRESS_REF"]) if world > 1 else None
    params_dir = out / "params"
    params_dir.mkdir(exist_ok=True)
    lora = config(name="lora", tp_size=tp)
    lora.model.lora = copy.deepcopy(LoRAConfig(r=4, alpha=8.0))
    engines = {
        "actor": config(tp_size=tp),
        "critic": config(value_head=True, seed=3, name="critic", tp_size=tp),
        "lora": lora,
        "ref": config(trainable=False, name="ref", tp_size=tp),
    }
    for kind, cfg in engines.items():
        engines[kind] = FSDPEngine(cfg)
        engines[kind].initialize()
    results: List[dict] = []
    try:
        for index in range(N_CASES):
            kind, mbt, batch, rank_rows = case(index, dp)
            engine = engines[kind]
            engine.config.micro_batch_tokens = mbt
            rows = torch.tensor(rank_rows[dp_rank], dtype=torch.long)
            local = batch.select(rows)
            t0 = time.monotonic()
            result = {"case": index, "kind": kind, "rows": rows.tolist(), "n_rows": batch.n_seqs, "tp_rank": rank % tp}
            if kind == "ref":
                result["forward"] = engine.forward(local, token_logprobs).tolist()
            else:
                step = (critic_train_step if kind == "critic" else train_step)(engine, local)
                result.update({k: step[k] for k in ("loss", "grad_norm", "loss_weight")})
                params = trained_params(engine)
                if rank == 0:
                    path = (ref_dir or out) / "params" / f"{index}.safetensors"
                    if ref_dir is None:
                        save_file({k: v.clone() for k, v in params.items()}, str(path))
                    else:
                        ref = load_file(str(path))
                        result["param_diff"] = max(float((params[k] - ref[k]).abs().max()) for k in ref)
            result["seconds"] = time.monotonic() - t0
            results.append(result)
        (out / f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # as realhf's rank processes end (realhf.base.process_exit says why)
