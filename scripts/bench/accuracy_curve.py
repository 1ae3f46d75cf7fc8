"""Accuracy over training time, from checkpoints evaluated after the runs: the curve and time to a target.

    python -m scripts.bench.accuracy_curve 0=assets/tiny-math/sft 120.5=<hf dir> ... [--eval-prompts 500]

A run saves HF directories while it trains, each tagged with the training seconds at which those
weights existed (realhf: `realhf_checkpoints` maps `checkpoints/actor/version<v>` to Σ step_time_s
of metrics.jsonl up to the step that produced version v; the TRL driver writes `saved_at.json`
into each save). Only after every run has ended are they evaluated here, so evaluation never
competes with training for the cores.

The held-out set is fixed: the first `--eval-prompts` rows of assets/tiny-math/data/test.jsonl,
`--eval-samples` samples each at T=1 (pure sampling, no top-k/top-p), torch seeded the same for
every checkpoint, graded by `realhf.plugins.tasks.math_accuracy.evaluate_math_accuracy`. That grades the final
answer only: the check-work rule of the training reward (every worked equation must hold) is NOT
applied in evaluation, so accuracy here is "right final answer", the figure the issue quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from scripts.bench.common import REPO, emit, log, print_tables

SFT = os.path.join(REPO, "assets/tiny-math/sft")
TEST = os.path.join(REPO, "assets/tiny-math/data/test.jsonl")
SAVED_AT = "saved_at.json"  # {"train_s", "step", "version"} written beside a save by the TRL driver

Checkpoint = Tuple[float, str]  # (training seconds at which the weights existed, HF dir)


def held_out_rows(n_prompts: int, path: str = TEST):
    from realhf.impl.dataset.prompt_dataset import load_jsonl_prompts

    return load_jsonl_prompts(path)[:n_prompts]


def evaluate_curve(
    checkpoints: Sequence[Checkpoint],
    n_prompts: int = 500,
    n_samples: int = 4,
    seed: int = 1,
    threads: int = 2,
    batch_size: int = 128,
    temperature: float = 1.0,
) -> List[Dict]:
    """[{"train_s", "accuracy", "path"}] per checkpoint, in order of training seconds (T=0: greedy)."""
    import torch

    from realhf.plugins.environments.math_grader import MathGrader
    from realhf.plugins.tasks.math_accuracy import evaluate_math_accuracy

    torch.set_num_threads(threads)
    rows = held_out_rows(n_prompts)
    curve = []
    with MathGrader(n_workers=1) as grader:
        for train_s, path in sorted(checkpoints, key=lambda c: c[0]):
            r = evaluate_math_accuracy(
                path,
                rows,
                temperature=temperature,
                n=n_samples,
                max_new_tokens=32,
                batch_size=batch_size,
                grader=grader,
                seed=seed,
            )
            curve.append({"train_s": round(float(train_s), 2), "accuracy": round(r["accuracy"], 4), "path": str(path)})
            log(f"accuracy {r['accuracy']:.4f} at {train_s:.1f} train s ({path})")
    return curve


def time_to(curve: Sequence[Dict], target: float) -> Optional[float]:
    """Training seconds of the first checkpoint whose accuracy reaches `target` (None: none does)."""
    return next((p["train_s"] for p in sorted(curve, key=lambda p: p["train_s"]) if p["accuracy"] >= target), None)


def default_target(start: float, finals: Sequence[float]) -> float:
    """Three quarters of the way from the start accuracy to the worst run's final accuracy (as
    e2e.pair_target does): every run gets there, the faster ones sooner."""
    return start + 0.75 * (min(finals) - start)


def realhf_checkpoints(log_dir: str, run_dir: str) -> List[Dict]:
    """A realhf run's HF saves (`<run_dir>/checkpoints/actor/version<v>`) with the training seconds
    at which each version existed: Σ step_time_s of metrics.jsonl through the step that logged
    that version. step_time_s runs from the end of one step's metrics to the end of the next (the
    first from the master's start of step 1), so the sum is the master's training clock."""
    from realhf.base.trial_files import checkpoints_dir, read_metrics

    at, t = {}, 0.0
    for m in read_metrics(log_dir):
        t += m["step_time_s"]
        at.setdefault(int(m["version"]), (t, int(m["step"])))
    root = checkpoints_dir(run_dir, "actor")
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        v = d.name[len("version") :] if d.name.startswith("version") else ""
        if v.isdigit() and int(v) in at:
            out.append({"train_s": round(at[int(v)][0], 2), "step": at[int(v)][1], "version": int(v), "path": str(d)})
    return sorted(out, key=lambda c: c["train_s"])


def clock_checkpoints(checkpoints: Sequence[Dict], t0: float) -> List[Dict]:
    """The same saves with `clock_s`: when the save's weights file was written, in seconds since the
    Unix time `t0` (the moment the training command was started)."""
    out = [
        {**c, "clock_s": round(os.path.getmtime(os.path.join(c["path"], "model.safetensors")) - t0, 2)}
        for c in checkpoints
    ]
    return sorted(out, key=lambda c: c["clock_s"])


def saved_at_checkpoints(root: str) -> List[Dict]:
    """Saves under `root` that carry their own `saved_at.json` (the TRL driver's)."""
    out = []
    for d in Path(root).iterdir() if Path(root).is_dir() else []:
        if (d / SAVED_AT).is_file():
            out.append({**json.loads((d / SAVED_AT).read_text()), "path": str(d)})
    return sorted(out, key=lambda c: c["train_s"])


def tables(r):
    rows = [[p["train_s"], p["accuracy"], p["path"]] for p in r["curve"]]
    return [
        (
            f"sampled accuracy (T=1, {r['eval_prompts']} held-out prompts x {r['eval_samples']} samples) "
            "per checkpoint",
            ["train s", "accuracy", "checkpoint"],
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.accuracy_curve", description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", help="TRAIN_SECONDS=HF_DIR, one per checkpoint")
    p.add_argument("--eval-prompts", type=int, default=500)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", type=float, default=None, help="also print the time to this accuracy")
    args = p.parse_args(argv)
    points = [(float(c.split("=", 1)[0]), c.split("=", 1)[1]) for c in args.checkpoints]
    curve = evaluate_curve(points, args.eval_prompts, args.eval_samples, args.seed, args.threads)
    res = {
        "bench": "accuracy_curve",
        "eval_prompts": args.eval_prompts,
        "eval_samples": args.eval_samples,
        "curve": curve,
    }
    if args.target is not None:
        res.update(target=args.target, time_to_target=time_to(curve, args.target))
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
