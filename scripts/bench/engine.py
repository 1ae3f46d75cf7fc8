"""The trainer engine (issue 13): one PPO train step of the default run on FSDPEngine against
the old path (`realhf.impl.model.actor.ppo_train_step`), and the engine at DP=2 against DP=1.

    python -m scripts.bench.engine [--short] [--repeats 5] [--rounds 3]

The batch is the trainer benchmark's (scripts/bench/trainer.py `make_batch`): 16 prompts × 8
answers sampled at T = 1 from `assets/tiny-math/sft`, with proximal and reference log-probs
computed once, outside the timings. The PPO hyper-parameters are the default run's
(training/configs/async-ppo.yaml): 2 minibatches, the decoupled loss with behav_imp_weight_cap 5,
GRPO advantages, kl_ctl 0.1 as a loss term, micro-batches of ≤ 1024 padded tokens, AdamW at
lr 1e-4, clipping 1.0. The run defers the first minibatch's proximal log-probs to its train
forward; that changes where they come from, not the step's work, so here every row has them.

DP=1, in this process, one thread, alternating a/b/c per repeat (each way keeps its own model
and optimizer; one untimed warm-up step each, from the same weights, whose updates are compared):

    old             ppo_train_step: advantages, then per minibatch micro-batched forward/backward,
                    the (no-op at DP=1) gradient all-reduce, clipping, AdamW, LR step
    engine          advantages, then FSDPEngine.train_batch per minibatch with the same PPO loss
                    as loss_fn (unwrapped at DP=1, the engine's default)
    engine sharded  the same with `shard_single_rank=True` (fully_shard over a one-rank mesh)

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

MODEL = f"{REPO}/assets/tiny-math/sft"
RANK_TIMEOUT_S = 300  # one DP launch: imports, model load, warm-up and the timed steps
TOLERATED_SLOWDOWN = 1.05  # issue 13: the engine may be at most 5% slower than the old path


# ---- the default run's train step, both ways ------------------------------------------------------
def default_cfg():
    from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters

    ppo = PPOHyperparameters(ppo_n_minibatches=2, eps_clip=0.2, use_decoupled_loss=True, behav_imp_weight_cap=5.0,
                             group_adv_norm=True, kl_ctl=0.1, micro_batch_tokens=1024)
    return ppo, OptimizerConfig(lr=1e-4, gradient_clipping=1.0)


def engine_config(optim, shard_single_rank: bool = False):
    from realhf.api.cli_args import ModelTrainEvalConfig
    from realhf.impl.engine.fsdp_engine import FSDPEngineConfig

    ppo, _ = default_cfg()
    return FSDPEngineConfig(model=ModelTrainEvalConfig(path=MODEL, optimizer=optim), device="cpu",
                            micro_batch_tokens=ppo.micro_batch_tokens, shard_single_rank=shard_single_rank)


def ppo_loss_fn(advantages, cfg):
    """ppo_train_step's per-micro-batch loss as an engine loss_fn: the summed (decoupled) PPO loss
    plus kl_ctl × the summed KL to the reference. `advantages` `[n_mb, w]` is the minibatch's."""
    import torch

    from realhf.impl.model.utils import ppo_functional as F

    temperature = cfg.gen.temperature
    kl_loss = cfg.kl_ctl > 0 and cfg.group_adv_norm

    def loss_fn(logits, mb, rows):
        w = mb.loss_mask.shape[1]
        logits = logits[:, :-1].float()  # [n, t-1, V]
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)  # [n, t-1]
        logp = torch.where(mb.attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))
        old, prox = mb.behav_logprobs, None
        if cfg.use_decoupled_loss:
            prox = mb.prox_logprobs
        elif cfg.recompute_logprob and mb.prox_logprobs is not None:
            old = mb.prox_logprobs
        loss, _ = F.actor_loss_fn(logp, old, advantages[rows, :w].to(logits.device), cfg.eps_clip, mb.loss_mask,
                                  c_clip=cfg.c_clip, proximal_logprobs=prox,
                                  behav_imp_weight_cap=cfg.behav_imp_weight_cap, eps_clip_high=cfg.eps_clip_high,
                                  reduce="sum")
        if kl_loss:
            kl = F.kl_estimate(logp, mb.ref_logprobs, cfg.kl_estimator)  # [n, t-1]
            loss = loss + cfg.kl_ctl * torch.where(mb.loss_mask, kl, torch.zeros_like(kl)).sum()
        return loss

    return loss_fn


def engine_step(engine, batch, cfg) -> float:
    """One train step on the engine (what ppo_train_step does, through train_batch); seconds."""
    from realhf.impl.model.actor import compute_advantages
    from realhf.impl.model.batching import minibatch_rows

    t0 = time.perf_counter()
    advantages = compute_advantages(batch, cfg)  # [N, T-1]
    for rows in minibatch_rows(batch.n_seqs, cfg.ppo_n_minibatches):
        minibatch = batch.select(rows)
        w = minibatch.loss_mask.shape[1]
        engine.train_batch(minibatch, ppo_loss_fn(advantages[rows, :w], cfg), lambda mb: float(mb.loss_mask.sum()))
    return time.perf_counter() - t0


class OldPath:
    """The model worker's trainer before the engine: an HF model, AdamW, ppo_train_step."""

    def __init__(self, optim):
        from realhf.api.cli_args import ModelTrainEvalConfig
        from realhf.impl.model.model_loading import load_causal_lm
        from realhf.impl.model.optim import make_optimizer

        self.model = load_causal_lm(ModelTrainEvalConfig(path=MODEL, optimizer=optim))
        self.optimizer, self.lr_scheduler = make_optimizer(self.model, optim, 0)
        self.clip = optim.gradient_clipping

    def step(self, batch, cfg) -> float:
        from realhf.impl.model.actor import ppo_train_step

        t0 = time.perf_counter()
        ppo_train_step(self.model, self.optimizer, self.lr_scheduler, batch, cfg, self.clip)
        return time.perf_counter() - t0


def _full_params(model) -> Dict:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


def _max_abs_diff(a: Dict, b: Dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---- the batch ------------------------------------------------------------------------------------
def build_batch(n_prompts: int):
    """The trainer benchmark's batch with proximal (= reference, before any step) log-probs."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from realhf.impl.model.actor import inference_logprobs
    from scripts.bench.trainer import make_batch

    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(MODEL, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(MODEL)
    batch = make_batch(model, tok, n_prompts, 8)
    batch.prox_logprobs = inference_logprobs(model, batch, 1.0, micro_batch_tokens=1024)
    batch.ref_logprobs = batch.prox_logprobs.clone()
    return batch


def save_batch(batch, path: Path) -> None:
    import dataclasses

    from safetensors.torch import save_file

    save_file({f.name: getattr(batch, f.name).contiguous() for f in dataclasses.fields(batch)}, str(path))


def load_batch(path: Path):
    from safetensors.torch import load_file

    from realhf.impl.model.batching import TrainBatch

    return TrainBatch(**load_file(str(path)))


def rank_batch(batch, cfg, rank: int, world_size: int):
    """Rank `rank`'s share: the rank-th contiguous part of every minibatch, so that the ranks of
    one optimizer step together hold the minibatch DP=1 trains on (groups of 8 stay whole)."""
    import torch

    from realhf.impl.model.batching import minibatch_rows

    parts = [rows.tensor_split(world_size)[rank] for rows in minibatch_rows(batch.n_seqs, cfg.ppo_n_minibatches)]
    return batch.select(torch.cat(parts))


# ---- DP=1: old path vs engine, in this process ----------------------------------------------------
def bench_dp1(batch, repeats: int) -> Dict:
    import torch.distributed as dist

    from realhf.impl.engine.fsdp_engine import FSDPEngine

    ppo, optim = default_cfg()
    # One one-rank group for both engines (an engine that made its own would tear it down).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        old = OldPath(optim)
        engines = {"engine": FSDPEngine(engine_config(optim)),
                   "engine sharded": FSDPEngine(engine_config(optim, shard_single_rank=True))}
        for e in engines.values():
            e.initialize()
        # Warm-up step from identical weights: the same update both ways shows the same work is timed.
        old.step(batch, ppo)
        ref = _full_params(old.model)
        diffs = {}
        for name, e in engines.items():
            engine_step(e, batch, ppo)
            diffs[name] = _max_abs_diff(ref, _full_params(e.model))
        times: Dict[str, List[float]] = {"old": [], **{name: [] for name in engines}}
        for i in range(repeats):
            times["old"].append(old.step(batch, ppo))
            for name, e in engines.items():
                times[name].append(engine_step(e, batch, ppo))
            log(f"DP=1 repeat {i + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()))
        for e in engines.values():
            e.destroy()
    finally:
        dist.destroy_process_group()
    ways = []
    for name, t in times.items():
        pair_ratios = [x / o for x, o in zip(t, times["old"])]  # each against the old step just before it
        ways.append({"way": name, "best_s": round(min(t), 4), "median_s": round(statistics.median(t), 4),
                     "over_old": round(statistics.median(pair_ratios), 3),
                     "max_param_diff": 0.0 if name == "old" else diffs[name]})
    return {"ways": ways}


# ---- DP=2 vs DP=1: engine ranks in their own processes --------------------------------------------
def worker(out: Path, repeats: int) -> None:
    """One rank (env RANK, WORLD_SIZE, MASTER_PORT): warm-up + `repeats` timed engine steps on its
    share of out/batch.safetensors; rank 0 writes the slowest rank's time per step to out/times.json."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from realhf.impl.engine.fsdp_engine import FSDPEngine

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    try:
        ppo, optim = default_cfg()
        batch = rank_batch(load_batch(out / "batch.safetensors"), ppo, rank, world_size)
        engine = FSDPEngine(engine_config(optim))
        engine.initialize()
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t = torch.tensor([engine_step(engine, batch, ppo)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank ends
            if i > 0:  # step 0 is the warm-up
                times.append(float(t))
        sharded = engine.sharded
        engine.destroy()
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
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
            logs.append(open(out / f"dp{world_size}-rank{rank}.log", "w+"))
            procs.append(subprocess.Popen([PYTHON, "-m", "scripts.bench.engine", "--worker", str(out),
                                           "--repeats", str(repeats)], cwd=REPO, env=env,
                                          stdout=logs[-1], stderr=subprocess.STDOUT))
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
        tails = "\n".join(f"--- rank {r} (exit {c}) ---\n" + (out / f"dp{world_size}-rank{r}.log").read_text()[-3000:]
                          for r, c in enumerate(codes))
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
    rows = [{"dp": dp, "sharded": sharded[dp], "best_s": round(min(t), 4), "median_s": round(statistics.median(t), 4)}
            for dp, t in times.items()]
    return {"runs": rows, "rounds": rounds, "speedup": round(statistics.median(round_speedups), 3),
            "round_speedups": [round(s, 3) for s in round_speedups], "ranks_failing_at_exit": bad_exits}


# ---- output ---------------------------------------------------------------------------------------
def tables(r):
    ratio = r["engine_over_old"]
    verdict = "within" if ratio <= TOLERATED_SLOWDOWN else "OVER"
    dp1 = [[w["way"], w["best_s"], w["median_s"], w["over_old"], w["max_param_diff"]] for w in r["dp1"]["ways"]]
    dp = [[f"DP={x['dp']}" + (" (FSDP2)" if x["sharded"] else " (unwrapped)"), x["best_s"], x["median_s"]]
          for x in r["dp"]["runs"]]
    return [
        (f"trainer train step at DP=1: {r['n_seqs']} sequences, {r['n_tokens']} trained tokens, padded width "
         f"{r['width']}, ppo_n_minibatches=2, micro_batch_tokens=1024, decoupled loss, kl_ctl=0.1; "
         f"{r['repeats']} alternating repeats; engine/old = {ratio} ({verdict} the 5% allowance)",
         ["way", "best s", "median s", "time / old (median of pairs)", "max |Δparam| vs old after 1 step"], dp1),
        (f"engine train step, DP=2 vs DP=1 (each rank half of every minibatch; {r['dp']['rounds']} alternating "
         f"rounds of {r['repeats']} steps; 2 ranks share {r['cores']} cores): speed-up DP=1/DP=2 = "
         f"{r['dp']['speedup']}", ["run", "best s", "median s"], dp),
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

    torch.set_num_threads(1)
    load_before = load_average()
    log(f"sampling a batch of {args.prompts} x 8 answers")
    batch = build_batch(args.prompts)
    dp1 = bench_dp1(batch, args.repeats)
    log("DP=2 vs DP=1 in separate processes")
    dp = bench_dp(batch, args.repeats, args.rounds)
    ways = {w["way"]: w for w in dp1["ways"]}
    result = {"bench": "engine", "n_seqs": batch.n_seqs, "n_tokens": batch.n_tokens,
              "width": int(batch.input_ids.shape[1]), "minibatches": 2, "repeats": args.repeats,
              "cores": os.cpu_count(), "dp1": dp1, "dp": dp,
              "old_s": ways["old"]["median_s"], "engine_s": ways["engine"]["median_s"],
              "engine_sharded_s": ways["engine sharded"]["median_s"],
              "engine_over_old": ways["engine"]["over_old"], "sharded_over_old": ways["engine sharded"]["over_old"],
              "dp1_s": dp["runs"][0]["median_s"], "dp2_s": dp["runs"][1]["median_s"], "dp_speedup": dp["speedup"],
              "load_before": load_before, "load_after": load_average()}
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
