"""End to end, asynchronous vs synchronous PPO on the embedded default, same seed and steps.

    python -m scripts.bench.e2e [--short] [--steps 100] [--eval-prompts 200]

Both runs are `training/main_async_ppo.py` as a subprocess with the defaults of
`training/configs/async-ppo.yaml` (so the whole system: Redis, generation server, manager, rollout
workers, model worker, master), differing only in

    async: max_head_offpolicyness=4
    sync:  max_head_offpolicyness=0 ppo.use_decoupled_loss=false

Throughput comes from the run's own `metrics.jsonl`: samples/s = Σ n_samples / Σ step_time_s
over the steps after the first (the first includes the servers' warm-up), generated tokens/s
likewise; wall time is the whole subprocess (start-up, evaluation and shutdown included). Time to
a target: the training seconds (Σ step_time_s) until the 10-step mean of the training success
rate (samples at T=1 on training prompts, rewarded) first reaches a target set per pair — three
quarters of the way from where both runs started to where the worse one ended. The
entry point evaluates greedy and sampled accuracy on held-out prompts before and after and writes
them to `accuracy.json`. The runs go one after the other, so a change in machine load between
them moves the ratio (measured: 1.85x and 1.21x in two single pairs an hour apart): `--repeats`
pairs alternate which mode goes first, the ratio is the median of the pairs' ratios, and the
load average is recorded per run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

from realhf.base.trial_files import read_metrics
from scripts.bench.common import PYTHON, REPO, emit, load_average, log, print_tables

ASYNC = ("max_head_offpolicyness=4",)
SYNC = ("max_head_offpolicyness=0", "ppo.use_decoupled_loss=false")


def summarize(metrics: List[dict]) -> Dict[str, float]:
    """Throughput over the steps after the first (when there are at least 3)."""
    steady = metrics[1:] if len(metrics) >= 3 else metrics
    t = sum(m["step_time_s"] for m in steady)
    n = sum(m["n_samples"] for m in steady)
    tokens = sum(m["gen_tokens"] for m in steady)
    last = metrics[-min(10, len(metrics)) :]
    return {
        "steps": len(metrics),
        "steps_time_s": round(sum(m["step_time_s"] for m in metrics), 2),
        "samples_per_s": round(n / t, 2) if t else 0.0,
        "gen_tokens_per_s": round(tokens / t, 1) if t else 0.0,
        "step_time_s": round(t / len(steady), 4) if steady else 0.0,
        # Where a step goes: the master waiting for enough trajectories vs the trainer computing.
        "wait_per_step_s": round(sum(m.get("wait_time_s", 0.0) for m in steady) / len(steady), 4),
        "train_per_step_s": round(sum(m.get("train_time_s", 0.0) for m in steady) / len(steady), 4),
        "gen_tokens_per_sample": round(tokens / n, 2) if n else 0.0,
        "final_reward_mean": round(sum(m["reward_mean"] for m in last) / len(last), 4),
        "final_success_rate": round(sum(m["success_rate"] for m in last) / len(last), 4),
        "head_offpolicyness_max": max(m["head_offpolicyness_max"] for m in metrics),
        # Tokens per DP rank, max/mean, as the groups arrived and as the master re-split them.
        **{
            key: round(sum(m.get(key, 1.0) for m in metrics) / len(metrics), 4)
            for key in ("dp_token_imbalance_before", "dp_token_imbalance")
        },
        "dp_tokens_moved_fraction": round(
            sum(m.get("dp_tokens_moved_fraction", 0.0) for m in metrics) / len(metrics), 4
        ),
    }


ROLLING = 10  # steps in the rolling mean of the training success rate


def success_curve(metrics: List[dict]) -> List[List[float]]:
    """[training seconds so far, success rate averaged over the last ROLLING steps] per step."""
    out, t = [], 0.0
    for i, m in enumerate(metrics):
        t += m["step_time_s"]
        window = metrics[max(0, i + 1 - ROLLING) : i + 1]
        out.append([t, sum(w["success_rate"] for w in window) / len(window)])
    return out


def time_to(curve: List[List[float]], target: float):
    """Training seconds until the rolling success rate first reaches `target` (None: never)."""
    return next((round(t, 1) for t, rate in curve[ROLLING - 1 :] if rate >= target), None)


def pair_target(a: List[List[float]], s: List[List[float]]) -> float:
    """The success rate both runs of a pair must reach: three quarters of the way from where they
    started to where the worse of the two ended (so both get there; the faster one sooner)."""
    start = (a[ROLLING - 1][1] + s[ROLLING - 1][1]) / 2
    return start + 0.75 * (min(a[-1][1], s[-1][1]) - start)


def _override(overrides: Sequence[str], key: str, default: str) -> str:
    found = [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")]
    return found[-1] if found else default


def evaluate_fallback(fileroot: str, repo: str, overrides: Sequence[str]) -> Dict:
    """The entry point's before/after evaluation (the same task, settings and code:
    realhf.system.evaluator.task_eval), for a run whose shutdown failed."""
    import glob

    from realhf.experiments.async_ppo import evaluator_config, trial_files_of
    from realhf.experiments.config_loading import compose_config
    from realhf.system.evaluator.task_eval import evaluate_weights

    versions = glob.glob(os.path.join(fileroot, "**", "published_weights", "actor", "[0-9]*"), recursive=True)
    final = max(versions, key=lambda d: int(os.path.basename(d)))
    sft = os.path.join(repo, "assets/tiny-math/sft")
    test = os.path.join(repo, "assets/tiny-math/data/test.jsonl")
    cfg = compose_config([*overrides, f"actor.path={sft}", f"dataset.test_path={test}", f"cluster.fileroot={fileroot}"])
    ev = evaluator_config(cfg, trial_files_of(cfg), 0)
    runs = [(0.0, 1), (cfg.evaluation.sampled_temperature, 1)]
    out = {}
    for when, path in (("before", sft), ("after", final)):
        greedy, sampled = evaluate_weights(ev, path, runs, cfg.evaluation.n_prompts)
        out[when] = {"greedy": greedy["accuracy"], "sampled": sampled["accuracy"]}
    log(f"evaluated {final} myself: {out}")
    return out


def run_training(
    trial: str, overrides: Sequence[str], timeout: float, repo: str = REPO, fileroot: str = "", config_name: str = ""
) -> Dict:
    """One `training/main_async_ppo.py` run of the checkout at `repo` (`config_name`: another
    training/configs file than async-ppo.yaml); returns its summary (raises with the log tail on
    failure)."""
    own_root = not fileroot
    fileroot = fileroot or tempfile.mkdtemp(prefix="bench_e2e_")
    cmd = [PYTHON, "training/main_async_ppo.py", *([f"--config-name={config_name}"] if config_name else [])]
    cmd += [f"trial_name={trial}", f"cluster.fileroot={fileroot}", *overrides]
    load_before = load_average()
    t0 = time.monotonic()
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if repo != REPO:  # e.g. a `git archive` of another commit, for before/after comparisons
            env["PYTHONPATH"] = os.path.abspath(repo) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout, env=env)
        wall = time.monotonic() - t0
        log_dir = os.path.join(fileroot, "logs", "async-ppo", trial)
        metrics = read_metrics(log_dir)
        want = int(_override(overrides, "exp_ctrl.benchmark_steps", "0"))
        failure = ""
        if proc.returncode != 0:
            failure = next(
                (line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("run failed")),
                f"exit code {proc.returncode}",
            )
            if not metrics or len(metrics) < want:
                raise RuntimeError(
                    f"{' '.join(cmd)} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
                )
            # Every step was trained and only the shutdown failed: keep the numbers, say so.
            log(f"{trial}: all {len(metrics)} steps done but the run then failed: {failure}")
        if not metrics:
            raise RuntimeError(f"{' '.join(cmd)} completed no train step:\n{(proc.stdout + proc.stderr)[-4000:]}")
        out = {
            "overrides": list(overrides),
            "wall_s": round(wall, 1),
            **summarize(metrics),
            "load_before": load_before,
            "load_after": load_average(),
            "_curve": success_curve(metrics),
        }
        if failure:
            out["shutdown_failure"] = failure
        acc_path = os.path.join(log_dir, "accuracy.json")
        n_eval = int(_override(overrides, "evaluation.n_prompts", "500"))
        acc = None
        if os.path.isfile(acc_path):
            with open(acc_path) as f:
                acc = json.load(f)
        elif n_eval > 0 and failure:  # the entry point skips its evaluation after a failed shutdown
            acc = evaluate_fallback(fileroot, repo, overrides)
        if acc is not None:
            out.update(
                {
                    "sampled_acc_before": acc["before"]["sampled"],
                    "sampled_acc_after": acc["after"]["sampled"],
                    "greedy_acc_before": acc["before"]["greedy"],
                    "greedy_acc_after": acc["after"]["greedy"],
                }
            )
        log(
            f"{trial}: {out['steps']} steps, {out['samples_per_s']:.1f} samples/s, "
            f"{out['gen_tokens_per_s']:.0f} gen tok/s, wall {wall:.0f} s"
        )
        return out
    finally:
        if own_root:
            shutil.rmtree(fileroot, ignore_errors=True)


def _acc(r: dict, key: str):
    return r.get(key, "-")


def _mean_of(runs: List[dict]) -> dict:
    """Field-wise mean over repeats of the numeric fields every run has."""
    keys = [
        k
        for k, v in runs[0].items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and all(isinstance(r.get(k), (int, float)) for r in runs)
    ]
    return {k: round(statistics.fmean(r[k] for r in runs), 4) for k in keys}


def tables(r):
    rows = []
    runs = r.get("runs") or [{"run": n, "repeat": 0, **r[n]} for n in ("async", "sync")]
    for x in runs:
        rows.append(
            [
                f"{x['run']} #{x['repeat'] + 1}",
                x["steps"],
                x["samples_per_s"],
                x["gen_tokens_per_s"],
                x["step_time_s"],
                x.get("wait_per_step_s", "-"),
                x.get("train_per_step_s", "-"),
                x["wall_s"],
                x["final_reward_mean"],
                _acc(x, "success_target"),
                _acc(x, "train_s_to_target"),
                _acc(x, "sampled_acc_before"),
                _acc(x, "sampled_acc_after"),
                _acc(x, "greedy_acc_after"),
                x["head_offpolicyness_max"],
                f"{x['load_before'][0]}/{x['load_after'][0]}",
            ]
        )
    pairs = ", ".join(f"{v:.2f}" for v in r.get("pair_ratios", []))
    rows.append(
        [
            f"async / sync (median of pairs {pairs})" if pairs else "async / sync",
            "",
            r["async_over_sync_samples_per_s"],
            r["async_over_sync_gen_tokens_per_s"],
            "",
            "",
            "",
            "",
            "",
            "",
            _acc(r, "sync_over_async_time_to_target"),
            "",
            r.get("sampled_acc_after_diff", "-"),
            "",
            "",
            "",
        ]
    )
    notes = "; ".join(
        f"{x['run']} #{x['repeat'] + 1}: {x['shutdown_failure']} (after all steps; accuracy evaluated by the bench)"
        for x in runs
        if x.get("shutdown_failure")
    )
    return [
        (
            f"end to end: embedded default, {r['steps']} steps per run, seed {r['seed']}, "
            f"{r['eval_prompts']} held-out prompts for accuracy; runs alternate async/sync; 'train s to target': "
            f"training seconds until the {ROLLING}-step mean training success rate reaches the pair's target "
            "(3/4 of the way from the start to the worse run's end; last row: sync / async)"
            + (f". NOTE {notes}" if notes else ""),
            [
                "run",
                "steps",
                "samples/s",
                "gen tok/s",
                "step s",
                "of which wait s",
                "of which train s",
                "wall s",
                "final reward",
                "success target",
                "train s to target",
                "sampled acc before",
                "sampled acc after",
                "greedy acc after",
                "max staleness",
                "load 1m",
            ],
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.e2e", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 8 steps each, 16 evaluation prompts, 1 pair")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="async/sync pairs, alternating which goes first; the ratio is the median over pairs",
    )
    p.add_argument("--eval-prompts", type=int, default=200, help="held-out prompts for accuracy (0: skip)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    p.add_argument("--repo", default=REPO, help="checkout whose training/main_async_ppo.py runs (default: this one)")
    args = p.parse_args(argv)
    if args.short:
        args.steps, args.eval_prompts, args.repeats = 8, 16, 1
    common = (
        f"exp_ctrl.benchmark_steps={args.steps}",
        f"evaluation.n_prompts={args.eval_prompts}",
        f"seed={args.seed}",
    )
    res = {
        "bench": "e2e",
        "steps": args.steps,
        "seed": args.seed,
        "eval_prompts": args.eval_prompts,
        "repeats": args.repeats,
        "runs": [],
        "pair_ratios": [],
    }
    for i in range(args.repeats):
        # Alternating the order cancels a steady drift of the machine's load out of the median.
        order = [("async", ASYNC), ("sync", SYNC)]
        pair, curves = {}, {}
        executed = order if i % 2 == 0 else order[::-1]
        for name, overrides in executed:
            pair[name] = run_training(f"bench-{name}-{i}", common + overrides, args.timeout, args.repo)
            curves[name] = pair[name].pop("_curve")
        res["pair_ratios"].append(round(pair["async"]["samples_per_s"] / pair["sync"]["samples_per_s"], 3))
        if min(len(c) for c in curves.values()) > ROLLING:
            target = round(pair_target(curves["async"], curves["sync"]), 4)
            for name, curve in curves.items():
                pair[name].update(success_target=target, train_s_to_target=time_to(curve, target))
            if pair["async"]["train_s_to_target"] and pair["sync"]["train_s_to_target"]:
                res.setdefault("pair_time_to_target_ratios", []).append(
                    round(pair["sync"]["train_s_to_target"] / pair["async"]["train_s_to_target"], 3)
                )
        res["runs"].extend({"run": name, "repeat": i, **pair[name]} for name, _ in executed)
    for name in ("async", "sync"):
        res[name] = _mean_of([r for r in res["runs"] if r["run"] == name])
    a, s = res["async"], res["sync"]
    res["async_over_sync_samples_per_s"] = round(statistics.median(res["pair_ratios"]), 3)
    res["async_over_sync_gen_tokens_per_s"] = round(a["gen_tokens_per_s"] / s["gen_tokens_per_s"], 3)
    res["async_over_sync_wall"] = round(s["wall_s"] / a["wall_s"], 3)
    if res.get("pair_time_to_target_ratios"):
        res["sync_over_async_time_to_target"] = round(statistics.median(res["pair_time_to_target_ratios"]), 3)
    if "sampled_acc_after" in a and "sampled_acc_after" in s:
        res["sampled_acc_after_diff"] = round(a["sampled_acc_after"] - s["sampled_acc_after"], 4)
    print_tables(tables(res))
    print(
        f"async / sync samples/s: {res['async_over_sync_samples_per_s']:.2f}x "
        "(target >= 1.6x, accuracy within 3 points); time to the success target, sync / async: "
        f"{res.get('sync_over_async_time_to_target', '-')}"
    )
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
