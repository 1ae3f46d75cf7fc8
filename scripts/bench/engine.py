"""The trainer engine (issue 13): the default run's trainer step on FSDPEngine at DP=1, left
unwrapped (the engine's DP=1 default) vs FSDP2-wrapped over a one-rank mesh
(`shard_single_rank=True`), and the engine at DP=2 against DP=1.

    python -m scripts.bench.engine [--short] [--repeats 5] [--rounds 3]

The batch is the trainer benchmark's (scripts/bench/trainer.py `make_batch`): 16 prompts × 8
answers sampled at T = 1 from `assets/tiny-math/sft`. A step is what the model worker does on
its engines (scripts/bench/trainer.py `Trainer.step`): PPOActor.compute_logprobs with the
deferral (the first minibatch's proximal log-probs come from its train forward), the frozen
reference engine's log-probs, then PPOActor.train_step. The PPO hyper-parameters are the default
run's (training/configs/async-ppo.yaml): 2 minibatches, the decoupled loss with
behav_imp_weight_cap 5, GRPO advantages, kl_ctl 0.1 as a loss term, micro-batches of ≤ 1024
padded tokens, AdamW at lr 1e-4, clipping 1.0.

DP=1, in this process, one thread, alternating the two ways per repeat (each keeps its own
actor, reference and optimizer; one untimed warm-up step each, from the same weights, whose
updates are compared):

    unwrapped       FSDPEngine at DP=1 as the trainer runs it: the plain HF model
    fsdp            the same with `shard_single_rank=True` (fully_shard over a one-rank mesh)

The old path (an HF model with a hand-written gradient all-reduce) is gone; its last comparison,
commit 7fdb5cc, measured the engine at 1.02x its step time.

DP=2 vs DP=1: the engine in separate processes (gloo on 127.0.0.1), each rank training on its
half of every minibatch of the same global batch; DP=1 and DP=2 launches alternate `--rounds`
times. On a 2-core machine shared with other work the two ranks compete for the cores, so the
speed-up is expected to be small or below 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from scripts.bench.common import PYTHON, REPO, emit, load_average, log, print_tables

RANK_TIMEOUT_S = 300  # one DP launch: imports, model load, warm-up and the timed steps
WAYS = {"unwrapped": False, "fsdp": True}  # name -> shard_single_rank


# ---- the default run's trainer step ---------------------------------------------------------------
def default_config():
    """The model worker's config of the default run on the tiny model."""
    from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters
    from scripts.bench.trainer import worker_config

    ppo = PPOHyperparameters(
        ppo_n_minibatches=2,
        eps_clip=0.2,
        use_decoupled_loss=True,
        behav_imp_weight_cap=5.0,
        adv_estimator="grpo",
        kl_ctl=0.1,
        micro_batch_tokens=1024,
    )
    return worker_config(ppo, OptimizerConfig(lr=1e-4, gradient_clipping=1.0))


def _full_params(model) -> Dict:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


def _max_abs_diff(a: Dict, b: Dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---- the batch ------------------------------------------------------------------------------------
def save_batch(batch, path: Path) -> None:
    import dataclasses

    import torch
    from safetensors.torch import save_file

    save_file(
        {
            f.name: getattr(batch, f.name).contiguous()
            for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)
        },
        str(path),
    )


def load_batch(path: Path):
    from safetensors.torch import load_file

    from realhf.api.train_batch import TrainBatch

    return TrainBatch(**load_file(str(path)))


def rank_batch(batch, ppo, rank: int, world_size: int):
    """Rank `rank`'s share: the rank-th contiguous part of every minibatch, so that the ranks of
    one optimizer step together hold the minibatch DP=1 trains on (groups of 8 stay whole)."""
    import torch

    from realhf.impl.model.batching import minibatch_rows

    parts = [rows.tensor_split(world_size)[rank] for rows in minibatch_rows(batch, ppo.ppo_n_minibatches)]
    return batch.select(torch.cat(parts))


# ---- DP=1: unwrapped vs FSDP-wrapped, in this process ----------------------------------------------
def bench_dp1(batch, repeats: int) -> Dict:
    import torch.distributed as dist

    from scripts.bench.trainer import Trainer

    cfg = default_config()
    # One one-rank group for every engine (an engine that made its own would tear it down).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        trainers = {name: Trainer(cfg, shard_single_rank=shard) for name, shard in WAYS.items()}
        # Warm-up step from identical weights: the same update both ways shows the same work is timed.
        for t in trainers.values():
            t.step(batch)
        ref = _full_params(trainers["unwrapped"].engines["actor"].model)
        diffs = {name: _max_abs_diff(ref, _full_params(t.engines["actor"].model)) for name, t in trainers.items()}
        sharded = {name: t.engines["actor"].sharded for name, t in trainers.items()}
        times: Dict[str, List[float]] = {name: [] for name in trainers}
        for i in range(repeats):
            for name, t in trainers.items():
                times[name].append(t.step(batch))
            log(f"DP=1 repeat {i + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()))
        for t in trainers.values():
            t.destroy()
    finally:
        dist.destroy_process_group()
    ways = []
    for name, t in times.items():
        pair_ratios = [x / u for x, u in zip(t, times["unwrapped"])]  # each against the unwrapped step just before it
        ways.append(
            {
                "way": name,
                "sharded": sharded[name],
                "best_s": round(min(t), 4),
                "median_s": round(statistics.median(t), 4),
                "over_unwrapped": round(statistics.median(pair_ratios), 3),
                "max_param_diff": diffs[name],
            }
        )
    return {"ways": ways}


# ---- DP=2 vs DP=1: engine ranks in their own processes --------------------------------------------
def worker(out: Path, repeats: int) -> None:
    """One rank (env RANK, WORLD_SIZE, MASTER_PORT): warm-up + `repeats` timed trainer steps on its
    share of out/batch.safetensors; rank 0 writes the slowest rank's time per step to out/times.json."""
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
        timeout=timedelta(seconds=120),
    )
    try:
        from scripts.bench.trainer import Trainer

        cfg = default_config()
        batch = rank_batch(load_batch(out / "batch.safetensors"), cfg.ppo, rank, world_size)
        trainer = Trainer(cfg)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t = torch.tensor([trainer.step(batch)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank ends
            if i > 0:  # step 0 is the warm-up
                times.append(float(t))
        sharded = trainer.engines["actor"].sharded
        trainer.destroy()
        if rank == 0:
            (out / "times.json").write_text(json.dumps({"times": times, "sharded": sharded}))
        # Leave together: a rank whose peer has already torn down gloo can abort on its way out.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(out: Path, world_size: int, repeats: int) -> Dict:
    from realhf.base.network import find_free_port

    (out / "times.json").unlink(missing_ok=True)
    port = find_free_port()
    procs, logs = [], []
    try:
        for rank in range(world_size):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
            logs.append(open(out / f"dp{world_size}-rank{rank}.log", "w+"))
            procs.append(
                subprocess.Popen(
                    [PYTHON, "-m", "scripts.bench.engine", "--worker", str(out), "--repeats", str(repeats)],
                    cwd=REPO,
                    env=env,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + RANK_TIMEOUT_S
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:  # a failed rank leaves its peer waiting in a collective
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for f in logs:
            f.close()
    codes = [p.returncode for p in procs]
    times = out / "times.json"
    if any(codes) and times.is_file():
        # Every step was measured and written; only the exit failed (seen once: gloo aborting a
        # rank at teardown, "terminate called without an active exception"). Keep the numbers.
        log(f"DP={world_size}: ranks exited with {codes} after writing their times; kept")
        return {**json.loads(times.read_text()), "exit_codes": codes}
    if any(codes):
        tails = "\n".join(
            f"--- rank {r} (exit {c}) ---\n" + (out / f"dp{world_size}-rank{r}.log").read_text()[-3000:]
            for r, c in enumerate(codes)
        )
        raise RuntimeError(f"DP={world_size} engine ranks failed:\n{tails}")
    return {**json.loads(times.read_text()), "exit_codes": codes}


def bench_dp(batch, repeats: int, rounds: int) -> Dict:
    times: Dict[int, List[float]] = {1: [], 2: []}
    sharded = {}
    round_speedups, bad_exits = [], 0
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        out = Path(tmp)
        save_batch(batch, out / "batch.safetensors")
        for r in range(rounds):
            medians = {}
            for dp in (1, 2):
                res = launch(out, dp, repeats)
                times[dp] += res["times"]
                sharded[dp] = res["sharded"]
                bad_exits += sum(1 for c in res["exit_codes"] if c)
                medians[dp] = statistics.median(res["times"])
                log(f"DP round {r + 1}/{rounds}: DP={dp} median {medians[dp]:.3f} s")
            round_speedups.append(medians[1] / medians[2])
    rows = [
        {"dp": dp, "sharded": sharded[dp], "best_s": round(min(t), 4), "median_s": round(statistics.median(t), 4)}
        for dp, t in times.items()
    ]
    return {
        "runs": rows,
        "rounds": rounds,
        "speedup": round(statistics.median(round_speedups), 3),
        "round_speedups": [round(s, 3) for s in round_speedups],
        "ranks_failing_at_exit": bad_exits,
    }


# ---- output ---------------------------------------------------------------------------------------
def tables(r):
    dp1 = [
        [
            w["way"] + (" (FSDP2)" if w["sharded"] else " (plain HF model)"),
            w["best_s"],
            w["median_s"],
            w["over_unwrapped"],
            w["max_param_diff"],
        ]
        for w in r["dp1"]["ways"]
    ]
    dp = [
        [f"DP={x['dp']}" + (" (FSDP2)" if x["sharded"] else " (unwrapped)"), x["best_s"], x["median_s"]]
        for x in r["dp"]["runs"]
    ]
    return [
        (
            f"trainer step (actor_inf with the deferral, ref_inf, train step) at DP=1: {r['n_seqs']} sequences, "
            f"{r['n_tokens']} trained tokens, padded width {r['width']}, ppo_n_minibatches=2, micro_batch_tokens=1024, "
            f"decoupled loss, kl_ctl=0.1; {r['repeats']} alternating repeats; fsdp/unwrapped = {r['fsdp_over_unwrapped']}",
            [
                "way",
                "best s",
                "median s",
                "time / unwrapped (median of pairs)",
                "max |Δparam| vs unwrapped after 1 step",
            ],
            dp1,
        ),
        (
            f"trainer step, DP=2 vs DP=1 (each rank half of every minibatch; {r['dp']['rounds']} alternating "
            f"rounds of {r['repeats']} steps; 2 ranks share {r['cores']} cores): speed-up DP=1/DP=2 = "
            f"{r['dp']['speedup']}",
            ["run", "best s", "median s"],
            dp,
        ),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 4 prompts, 1 repeat, 1 round")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per way (and per DP launch)")
    p.add_argument("--rounds", type=int, default=3, help="alternating DP=1/DP=2 launches (median of their speed-ups)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one DP rank
    args = p.parse_args(argv)
    if args.worker:
        worker(Path(args.worker), args.repeats)
        return 0
    if args.short:
        args.repeats, args.rounds, args.prompts = 1, 1, 4

    import torch

    from scripts.bench.trainer import sample_batch

    torch.set_num_threads(1)
    load_before = load_average()
    log(f"sampling a batch of {args.prompts} x 8 answers")
    batch = sample_batch(args.prompts)
    dp1 = bench_dp1(batch, args.repeats)
    log("DP=2 vs DP=1 in separate processes")
    dp = bench_dp(batch, args.repeats, args.rounds)
    ways = {w["way"]: w for w in dp1["ways"]}
    result = {
        "bench": "engine",
        "n_seqs": batch.n_seqs,
        "n_tokens": batch.n_tokens,
        "width": int(batch.input_ids.shape[1]),
        "minibatches": 2,
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "dp1": dp1,
        "dp": dp,
        "unwrapped_s": ways["unwrapped"]["median_s"],
        "fsdp_s": ways["fsdp"]["median_s"],
        "fsdp_over_unwrapped": ways["fsdp"]["over_unwrapped"],
        "dp1_s": dp["runs"][0]["median_s"],
        "dp2_s": dp["runs"][1]["median_s"],
        "dp_speedup": dp["speedup"],
        "load_before": load_before,
        "load_after": load_average(),
    }
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
