"""The trainer's work per step, as the model worker does it: proximal log-probs (actor_inf),
reference log-probs (ref_inf), and the PPO train step, on a realistic batch of the embedded task.

    python -m scripts.bench.trainer [--short] [--repeats 5]

The batch: B = 16 prompts × 8 answers sampled at T = 1 from `assets/tiny-math/sft`, as a train
step receives them. Ways of doing the same work, timed alternately, best of `--repeats`:

    baseline        actor_inf over every row in arrival order, then ref_inf, then train_step with
                    one forward/backward per minibatch
    deferred prox   actor_inf skips the first minibatch (its train forward, before any optimizer
                    step, gives the proximal log-probs); inference passes take rows in order of
                    length in micro-batches of 64, so each is padded only to its own longest row
    micro-batches   as above, and every forward — the train step's too, accumulating gradients —
                    takes rows in order of length, at most `ppo.micro_batch_tokens` padded tokens
                    (512, 1024 = the default, 2048) per forward

All produce the same update (tests/unit/impl/model/test_actor.py checks it). One thread.
"""

from __future__ import annotations

import argparse
import copy
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
        out = model.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=32,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[:, len(prompt):]
        samples = []
        for o in out.tolist():
            if tok.eos_token_id in o:
                o = o[: o.index(tok.eos_token_id) + 1]
            else:
                o = [t for t in o if t != tok.pad_token_id]
            samples.append(Sample(o, [0.0] * len(o), [0] * len(o), float(torch.rand(()) > 0.5) * 2 - 1))
        trajs.append(Trajectory(r["query_id"], prompt, samples))
    return pack_trajectories(trajs, tok.pad_token_id)


def one_step(actor_model, ref_model, batch, cfg, deferred: bool, micro_batch_tokens: int) -> float:
    """One step's trainer work; micro_batch_tokens < 0: the train step in whole minibatches and
    inference in micro-batches of 64 rows (before `ppo.micro_batch_tokens` existed)."""
    import dataclasses

    import torch

    from realhf.impl.model import actor
    from realhf.impl.model.optim import make_optimizer

    model = copy.deepcopy(actor_model)
    opt, sched = make_optimizer(model, cfg["optim"], 0)
    ppo = dataclasses.replace(cfg["ppo"], micro_batch_tokens=max(micro_batch_tokens, 0))
    b = copy.deepcopy(batch)
    t0 = time.perf_counter()
    if deferred:
        first = set(actor.first_minibatch_rows(b.n_seqs, ppo.ppo_n_minibatches).tolist())
        rest = torch.tensor([r for r in range(b.n_seqs) if r not in first], dtype=torch.long)
        if micro_batch_tokens < 0:
            b.prox_logprobs = _inference(model, b, rows=rest, sort=True)
            b.ref_logprobs = _inference(ref_model, b, sort=True)
        else:
            b.prox_logprobs = actor.inference_logprobs(model, b, 1.0, micro_batch_tokens=micro_batch_tokens, rows=rest)
            b.ref_logprobs = actor.inference_logprobs(ref_model, b, 1.0, micro_batch_tokens=micro_batch_tokens)
    else:
        b.prox_logprobs = _inference(model, b)
        b.ref_logprobs = _inference(ref_model, b)
    actor.ppo_train_step(model, opt, sched, b, ppo, 1.0, prox_from_first_forward=deferred)
    return time.perf_counter() - t0


# name -> (deferred prox, micro_batch_tokens; < 0: see one_step)
WAYS = {
    "baseline (full actor_inf, arrival order, whole minibatches)": (False, -1),
    "deferred prox, length-sorted inference (64 rows)": (True, -1),
    "+ length-sorted micro-batches of <= 512 padded tokens everywhere": (True, 512),
    "+ length-sorted micro-batches of <= 1024 padded tokens everywhere (default)": (True, 1024),
    "+ length-sorted micro-batches of <= 2048 padded tokens everywhere": (True, 2048),
}
DEFAULT_WAY = "+ length-sorted micro-batches of <= 1024 padded tokens everywhere (default)"


def _inference(model, batch, rows=None, sort: bool = False, micro_batch_size: int = 64):
    """Inference as it was before token-budget micro-batches: 64 rows per forward, in arrival
    order or (sort) in order of length."""
    import torch

    from realhf.impl.model.actor import compute_logprobs

    rows = torch.arange(batch.n_seqs) if rows is None else rows
    if sort:
        rows = rows[torch.argsort(batch.attention_mask[rows].sum(dim=1), stable=True)]
    model.eval()
    out = torch.zeros((batch.n_seqs, batch.input_ids.shape[1] - 1))
    with torch.no_grad():
        for chunk in torch.split(rows, micro_batch_size):
            mb = batch.select(chunk)
            out[chunk, : mb.input_ids.shape[1] - 1] = compute_logprobs(model, mb)
    model.train()
    return out


def tables(r):
    ways = r.get("ways") or [  # results written before the micro-batch ways existed
        {"way": "baseline", "seconds": r["baseline_s"], "ratio": 1.0},
        {"way": "current", "seconds": r["current_s"], "ratio": r["speedup"]}]
    rows = [[w["way"], w["seconds"], w["ratio"]] for w in ways]
    return [(f"trainer work per step: {r['n_seqs']} sequences, {r['n_tokens']} trained tokens, padded width "
             f"{r['width']}, ppo_n_minibatches={r['minibatches']}, kl_ctl>0 (ref_inf), best of {r['repeats']}",
             ["way", "seconds per step", "ratio to baseline"], rows)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 4 prompts, 1 repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    args = p.parse_args(argv)
    if args.short:
        args.repeats, args.prompts = 1, 4

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(MODEL, use_safetensors=True)
    ref = AutoModelForCausalLM.from_pretrained(MODEL, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(MODEL)
    log(f"sampling a batch of {args.prompts} x 8 answers")
    batch = make_batch(model.eval(), tok, args.prompts, 8)
    cfg = {"optim": OptimizerConfig(lr=1e-4), "ppo": PPOHyperparameters(ppo_n_minibatches=2, kl_ctl=0.1)}
    times = {name: [] for name in WAYS}
    for _ in range(args.repeats):
        for name, (deferred, mb_rows) in WAYS.items():
            times[name].append(one_step(model, ref, batch, cfg, deferred, mb_rows))
    best = {name: min(t) for name, t in times.items()}
    base = best[next(iter(WAYS))]
    default = best[DEFAULT_WAY]
    result = {"bench": "trainer", "n_seqs": batch.n_seqs, "n_tokens": batch.n_tokens,
              "width": int(batch.input_ids.shape[1]), "minibatches": 2, "repeats": args.repeats,
              "ways": [{"way": name, "seconds": round(t, 4), "ratio": round(base / t, 3)} for name, t in best.items()],
              "baseline_s": round(base, 4), "current_s": round(default, 4), "speedup": round(base / default, 3)}
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
