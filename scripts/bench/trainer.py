"""The trainer's work per step, as the model worker does it on its engines: proximal log-probs
(actor_inf, PPOActor.compute_logprobs), reference log-probs (ref_inf, a frozen FSDPEngine), and
the PPO train step (PPOActor.train_step), on a realistic batch of the embedded task.

    python -m scripts.bench.trainer [--short] [--repeats 5]

The batch: B = 16 prompts × 8 answers sampled at T = 1 from `assets/tiny-math/sft`, as a train
step receives them; GRPO, kl_ctl 0.1 (so ref_inf runs), 2 minibatches, AdamW lr 1e-4. Ways of
doing the same work, timed alternately, best of `--repeats`; each way holds its own actor and
reference engines (DP=1, unwrapped: the engine's default), built from the same weights:

    baseline        no deferral: actor_inf over every row, then ref_inf, then the train step,
                    each forward over a whole minibatch (ppo.micro_batch_tokens = 0)
    deferred prox   actor_inf skips the first minibatch (its train forward, before any optimizer
                    step, gives the proximal log-probs), still whole minibatches
    micro-batches   as above, and every forward takes rows in order of length, at most
                    `ppo.micro_batch_tokens` padded tokens (512, 1024 = the default, 2048) per
                    forward, accumulating gradients in the train step
    shared prompts  as above, a group's rows kept together and its prompt computed once
                    (`ppo.shared_prompt`, realhf.impl.engine.shared_prompt)

All produce the same update (tests/unit/system/trainer/test_actor.py and test_ppo_actor.py check
it). One thread. The engine itself (FSDP-wrapped vs not, DP=2 vs DP=1): scripts/bench/engine.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from scripts.bench.common import REPO, emit, log, print_tables

MODEL = f"{REPO}/assets/tiny-math/sft"


def make_batch(model, tok, n_prompts: int, group: int, seed: int = 1):
    import json

    import torch

    from realhf.api.trajectory import Sample, Trajectory
    from realhf.impl.model.batching import pack_trajectories

    torch.manual_seed(seed)
    rows = [json.loads(line) for line in open(f"{REPO}/assets/tiny-math/data/train.jsonl")][:n_prompts]
    trajs = []
    for r in rows:
        prompt = tok.encode(r["prompt"], add_special_tokens=False)
        ids = torch.tensor([prompt] * group)
        out = model.generate(
            ids,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=32,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )[:, len(prompt) :]
        samples = []
        for o in out.tolist():
            if tok.eos_token_id in o:
                o = o[: o.index(tok.eos_token_id) + 1]
            else:
                o = [t for t in o if t != tok.pad_token_id]
            samples.append(Sample(o, [0.0] * len(o), [0] * len(o), float(torch.rand(()) > 0.5) * 2 - 1))
        trajs.append(Trajectory(r["query_id"], prompt, samples))
    return pack_trajectories(trajs, tok.pad_token_id)


def sample_batch(n_prompts: int, group: int = 8):
    """`make_batch` from a freshly loaded tiny-math model."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(MODEL, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(MODEL)
    return make_batch(model, tok, n_prompts, group)


def worker_config(ppo, optim):
    """The model worker's config of the default run on the tiny model (the engines are built
    from it exactly as the trainer builds them: realhf.system.trainer.ppo_actor.engine_config)."""
    from realhf.api.cli_args import ModelTrainEvalConfig
    from realhf.api.worker_configs import ModelWorkerConfig

    return ModelWorkerConfig(actor=ModelTrainEvalConfig(path=MODEL, optimizer=optim), ppo=ppo, device="cpu")


class Trainer:
    """One DP rank's actor (PPOActor) and frozen reference engine."""

    def __init__(self, cfg, shard_single_rank: bool = False, defer: bool = True, local_rank: int = 0):
        from realhf.impl.engine.fsdp_engine import FSDPEngine
        from realhf.system.trainer.ppo_actor import PPOActor, engine_config

        self.ppo = cfg.ppo
        self.engines = {}
        for role in ("actor", "ref"):
            config = dataclasses.replace(engine_config(cfg, role, local_rank), shard_single_rank=shard_single_rank)
            self.engines[role] = FSDPEngine(config)
            self.engines[role].initialize()
        self.actor = PPOActor(self.engines["actor"], cfg.ppo)
        self.actor.can_defer_prox = self.actor.can_defer_prox and defer
        self.phases = {}  # the last step's seconds in each call: actor_inf, ref_inf, actor_train

    def step(self, batch) -> float:
        """actor_inf, ref_inf and the train step on a copy of `batch`; seconds."""
        from realhf.system.trainer.ppo_actor import reference_logprobs

        b = dataclasses.replace(
            batch, prox_logprobs=None, ref_logprobs=None, values=None, advantages=None, returns=None
        )
        t0 = time.perf_counter()
        self.actor.compute_logprobs(b)
        t1 = time.perf_counter()
        reference_logprobs(self.engines["ref"], b, self.ppo.gen.temperature)
        t2 = time.perf_counter()
        self.actor.train_step(b)
        t3 = time.perf_counter()
        self.phases = {"actor_inf": t1 - t0, "ref_inf": t2 - t1, "actor_train": t3 - t2}
        return t3 - t0

    def destroy(self) -> None:
        for engine in self.engines.values():
            engine.destroy()


# name -> (deferred prox, ppo.micro_batch_tokens (0: whole minibatches), ppo.shared_prompt)
WAYS = {
    "baseline (no deferral, whole minibatches)": (False, 0, False),
    "deferred prox, whole minibatches": (True, 0, False),
    "+ length-sorted micro-batches of <= 512 padded tokens everywhere": (True, 512, False),
    "+ length-sorted micro-batches of <= 1024 padded tokens everywhere": (True, 1024, False),
    "+ length-sorted micro-batches of <= 2048 padded tokens everywhere": (True, 2048, False),
    "+ each prompt computed once per group, <= 1024 tokens (default)": (True, 1024, True),
    "+ each prompt computed once per group, <= 2048 tokens": (True, 2048, True),
    "+ each prompt computed once per group, <= 4096 tokens": (True, 4096, True),
}
DEFAULT_WAY = "+ each prompt computed once per group, <= 1024 tokens (default)"


def tables(r):
    ways = r.get("ways") or [  # results written before the micro-batch ways existed
        {"way": "baseline", "seconds": r["baseline_s"], "ratio": 1.0},
        {"way": "current", "seconds": r["current_s"], "ratio": r["speedup"]},
    ]
    rows = [[w["way"], w["seconds"], w["ratio"]] for w in ways]
    out = [
        (
            f"trainer work per step: {r['n_seqs']} sequences, {r['n_tokens']} trained tokens, padded width "
            f"{r['width']}, ppo_n_minibatches={r['minibatches']}, kl_ctl>0 (ref_inf), best of {r['repeats']}",
            ["way", "seconds per step", "ratio to baseline"],
            rows,
        )
    ]
    if r.get("default_phases"):  # where the default's step goes (its fastest repeat)
        total = sum(r["default_phases"].values())
        out.append(
            (
                "the default way's step by call (its fastest repeat)",
                ["call", "seconds", "share"],
                [[k, v, round(v / total, 3)] for k, v in r["default_phases"].items()],
            )
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 4 prompts, 1 repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    args = p.parse_args(argv)
    if args.short:
        args.repeats, args.prompts = 1, 4

    import torch
    import torch.distributed as dist

    from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters

    torch.set_num_threads(1)
    log(f"sampling a batch of {args.prompts} x 8 answers")
    batch = sample_batch(args.prompts)
    optim = OptimizerConfig(lr=1e-4, gradient_clipping=1.0)
    # One one-rank group for every engine (an engine that made its own would tear it down).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        trainers = {
            name: Trainer(
                worker_config(
                    PPOHyperparameters(
                        ppo_n_minibatches=2, kl_ctl=0.1, micro_batch_tokens=budget, shared_prompt=shared
                    ),
                    optim,
                ),
                defer=defer,
            )
            for name, (defer, budget, shared) in WAYS.items()
        }
        for t in trainers.values():  # untimed warm-up
            t.step(batch)
        times = {name: [] for name in WAYS}
        default_phases = None
        for i in range(args.repeats):
            for name, t in trainers.items():
                times[name].append(t.step(batch))
                if name == DEFAULT_WAY and times[name][-1] == min(times[name]):
                    default_phases = {k: round(v, 4) for k, v in t.phases.items()}
            log(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{v[-1]:.3f} s" for v in times.values()))
        for t in trainers.values():
            t.destroy()
    finally:
        dist.destroy_process_group()
    best = {name: min(t) for name, t in times.items()}
    base = best[next(iter(WAYS))]
    default = best[DEFAULT_WAY]
    result = {
        "bench": "trainer",
        "n_seqs": batch.n_seqs,
        "n_tokens": batch.n_tokens,
        "width": int(batch.input_ids.shape[1]),
        "minibatches": 2,
        "repeats": args.repeats,
        "ways": [{"way": name, "seconds": round(t, 4), "ratio": round(base / t, 3)} for name, t in best.items()],
        "baseline_s": round(base, 4),
        "current_s": round(default, 4),
        "speedup": round(base / default, 3),
        "default_phases": default_phases,
    }
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
