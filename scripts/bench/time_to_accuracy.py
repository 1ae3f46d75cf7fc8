"""Time to accuracy: realhf default, realhf's best synchronous mode and TRL, same task and budget.

    python -m scripts.bench.time_to_accuracy [--short] [--budget-s 372] [--trl-threads 2] [--target A]

Three runs, one after another, each for the same training-time budget (`exp_ctrl.max_train_seconds`
for realhf; a callback for TRL), each saving its policy every `--save-steps` steps (16 groups x 8
samples each) with the training seconds at which it existed:

    realhf_default  training/configs/async-ppo.yaml as it is
    realhf_eta1     the same with max_head_offpolicyness=1 (optional: --runs)
    realhf_sync     max_head_offpolicyness=0 ppo.use_decoupled_loss=false + BEST_SYNC (thread counts)
    trl             TRL's GRPOTrainer with the same algorithm (scripts/bench/trl_driver.py), own venv

Only after all three have ended are the checkpoints evaluated (scripts/bench/accuracy_curve.py:
sampled accuracy at T=1 on the first --eval-prompts held-out prompts x --eval-samples, final answer
graded, check-work not applied), plus the SFT checkpoint as every curve's point at 0 s. Time to
target: training seconds of the first checkpoint at or above the target (default: 3/4 of the way
from the SFT accuracy to the worst run's final accuracy). samples/s: completions trained over the
whole run / its training seconds (the first step's warm-up included, for all three alike).
Checkpoints are every --save-steps steps, so a time to target is known to that resolution.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Dict, Optional, Sequence

from scripts.bench import accuracy_curve as ac
from scripts.bench.common import emit, log, print_tables

# realhf's synchronous mode at its best thread setting on this machine kind. Measured (40 steps
# each, docs/benchmarks.md): one thread per process 115 samples/s, two for the trainer and the
# generation server (each phase alone on both cores) 110: the generation phase is bound by the
# rollout path rather than the engine's arithmetic, so a second thread buys nothing.
BEST_SYNC: tuple = ()
SYNC = ("max_head_offpolicyness=0", "ppo.use_decoupled_loss=false")
# realhf runs by name: the overrides on top of training/configs/async-ppo.yaml.
REALHF_RUNS = {"realhf_default": (), "realhf_eta1": ("max_head_offpolicyness=1",), "realhf_sync": SYNC + BEST_SYNC}
RUNS = ("realhf_default", "realhf_eta1", "realhf_sync", "trl")
DEFAULT_RUNS = ("realhf_default", "realhf_sync", "trl")
EXPERIMENT = "async-ppo"
MAX_STEPS = 100000  # the time budget ends the run long before


def realhf_run(
    name: str, overrides: Sequence[str], budget_s: float, save_steps: int, seed: int, fileroot: str, timeout: float
) -> Dict:
    from realhf.base.trial_files import TrialFiles, read_metrics
    from scripts.bench.e2e import run_training

    common = (
        f"exp_ctrl.max_train_seconds={budget_s}",
        f"exp_ctrl.benchmark_steps={MAX_STEPS}",
        f"exp_ctrl.save_freq_steps={save_steps}",
        "exp_ctrl.keep_last_saves=0",
        "evaluation.n_prompts=0",
        f"seed={seed}",
    )
    trial = f"tta-{name.replace('_', '-')}"
    summary = run_training(trial, common + tuple(overrides), timeout, fileroot=fileroot)
    files = TrialFiles(fileroot, EXPERIMENT, trial)
    metrics = read_metrics(files.log_dir)
    train_s = sum(m["step_time_s"] for m in metrics)
    n = sum(m["n_samples"] for m in metrics)
    return {
        "overrides": list(overrides),
        "steps": len(metrics),
        "train_s": round(train_s, 2),
        "samples_per_s": round(n / train_s, 2),
        "wait_per_step_s": summary["wait_per_step_s"],
        "train_per_step_s": summary["train_per_step_s"],
        "head_offpolicyness_max": summary["head_offpolicyness_max"],
        "load_before": summary["load_before"],
        "load_after": summary["load_after"],
        "checkpoints": ac.realhf_checkpoints(files.log_dir, files.run_dir),
    }


def trl_run(budget_s: float, save_steps: int, seed: int, threads: int, out_dir: str, timeout: float) -> Dict:
    from scripts.bench.peer_trl import run_trl

    r = run_trl(out_dir, budget_s, threads, save_steps, seed=seed, timeout=timeout)
    return {
        "overrides": [f"trl=={r['trl']}", f"threads={threads}"],
        **{k: r[k] for k in ("steps", "train_s", "samples_per_s", "load_before", "load_after", "checkpoints")},
    }


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 3) if a and b else None


def summarize(runs: Dict[str, Dict], start: Dict, target: Optional[float]) -> Dict:
    """Per-run time to target and final accuracy, the target, and the TRL-vs-realhf ratios."""
    finals = {n: r["curve"][-1]["accuracy"] for n, r in runs.items()}
    if target is None:
        target = round(ac.default_target(start["accuracy"], list(finals.values())), 4)
    out = {"target": target, "start_accuracy": start["accuracy"], "ratios": {}}
    for n, r in runs.items():
        r.update(final_accuracy=finals[n], time_to_target_s=ac.time_to(r["curve"], target))
    if "trl" in runs:
        t = runs["trl"]
        for n in (x for x in runs if x != "trl"):
            out["ratios"][n] = {
                "trl_over_realhf_time_to_target": _ratio(t["time_to_target_s"], runs[n]["time_to_target_s"]),
                "realhf_over_trl_samples_per_s": _ratio(runs[n]["samples_per_s"], t["samples_per_s"]),
                "final_accuracy_diff": round(runs[n]["final_accuracy"] - t["final_accuracy"], 4),
            }
    return out


def _dash(v):
    return "-" if v is None else v


def tables(r):
    runs = r["runs"]
    rows = [
        [
            n,
            " ".join(x["overrides"]) or "(yaml defaults)",
            x["steps"],
            x["train_s"],
            x["samples_per_s"],
            _dash(x["time_to_target_s"]),
            x["final_accuracy"],
            f"{x['load_before'][0]}/{x['load_after'][0]}",
        ]
        for n, x in runs.items()
    ]
    ratio_rows = [
        [
            n,
            _dash(q["trl_over_realhf_time_to_target"]),
            _dash(q["realhf_over_trl_samples_per_s"]),
            q["final_accuracy_diff"],
        ]
        for n, q in r["ratios"].items()
    ]
    curve_rows = [[n, " ".join(f"{p['train_s']:.0f}:{p['accuracy']:.3f}" for p in x["curve"])] for n, x in runs.items()]
    return [
        (
            f"time to accuracy: {r['budget_s']} s training budget per run, seed {r['seed']}; sampled accuracy (T=1, "
            f"final answer) on {r['eval_prompts']} held-out prompts x {r['eval_samples']}, start {r['start_accuracy']}, "
            f"target {r['target']}; checkpoints every {r['save_steps']} steps (16x8 samples each)",
            ["run", "config", "steps", "train s", "samples/s", "train s to target", "final accuracy", "load 1m"],
            rows,
        ),
        (
            "TRL vs realhf (time to target: TRL / realhf, > 1 means realhf is sooner; samples/s: realhf / TRL)",
            ["realhf run", "time to target TRL/realhf", "samples/s realhf/TRL", "final accuracy realhf - TRL"],
            ratio_rows,
        ),
        ("accuracy curves (train s: accuracy)", ["run", "curve"], curve_rows),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.time_to_accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 40 s budget, 50 eval prompts, saves every 5 steps")
    p.add_argument("--budget-s", type=float, default=372.0, help="training seconds per run (6.2 min)")
    p.add_argument("--save-steps", type=int, default=10, help="steps between saved checkpoints")
    p.add_argument("--trl-threads", type=int, default=2)
    p.add_argument("--eval-prompts", type=int, default=500)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--eval-threads", type=int, default=2, help="torch threads of the evaluation (after all runs)")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="accuracy target (default: 3/4 of the way from the SFT accuracy to the worst final accuracy)",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        choices=RUNS,
        default=list(DEFAULT_RUNS),
        help="realhf_eta1: the default with max_head_offpolicyness=1",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", default=None, help="keep runs and checkpoints here (default: a temp dir, deleted)")
    args = p.parse_args(argv)
    if args.short:
        args.budget_s, args.eval_prompts, args.save_steps = 40.0, 50, 5
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_tta_")
    timeout = args.budget_s + 900
    try:
        made: Dict[str, Dict] = {}
        for name in args.runs:
            log(f"{name}: training for {args.budget_s:.0f} s")
            if name == "trl":
                made[name] = trl_run(
                    args.budget_s, args.save_steps, args.seed, args.trl_threads, os.path.join(work, "trl"), timeout
                )
            else:
                made[name] = realhf_run(
                    name, REALHF_RUNS[name], args.budget_s, args.save_steps, args.seed, work, timeout
                )
        log(f"evaluating {1 + sum(len(r['checkpoints']) for r in made.values())} checkpoints")
        ev = dict(n_prompts=args.eval_prompts, n_samples=args.eval_samples, seed=args.seed, threads=args.eval_threads)
        start = ac.evaluate_curve([(0.0, ac.SFT)], **ev)[0]
        for r in made.values():
            curve = ac.evaluate_curve([(c["train_s"], c["path"]) for c in r.pop("checkpoints")], **ev)
            r["curve"] = [{"train_s": 0.0, "accuracy": start["accuracy"]}] + [
                {"train_s": c["train_s"], "accuracy": c["accuracy"]} for c in curve
            ]
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    res = {
        "bench": "time_to_accuracy",
        "budget_s": args.budget_s,
        "save_steps": args.save_steps,
        "seed": args.seed,
        "eval_prompts": args.eval_prompts,
        "eval_samples": args.eval_samples,
        "trl_threads": args.trl_threads,
        "best_sync": list(BEST_SYNC),
        "runs": made,
    }
    res.update(summarize(made, start, args.target))
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
