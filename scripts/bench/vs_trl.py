"""realhf against TRL's GRPOTrainer under a protocol declared before the runs.

    python -m scripts.bench.vs_trl [--short] [--protocol scripts/bench/protocol_vs_trl.yaml] [--work-dir D]

Everything that decides a number is in the protocol file (target, seeds, budget, clock,
checkpoint cadence, evaluator, numerics, realhf overrides, TRL's sweep); this module only carries
it out, in three parts:

1. TRL's sweep: each listed setting trains for `trl.sweep_budget_s`; the fastest in samples/s
   (training clock) races, a later-listed one winning only by more than `trl.sweep_margin`.
   Every setting's figures are kept in the result.
2. The race: for each seed, realhf (training/configs/async-ppo.yaml plus `realhf.overrides`) and
   TRL (the sweep's winner) train one after another for `budget_s` on the process clock, the one
   going first alternating by seed, each saving an HF checkpoint every `save_every_s` seconds.
3. After all training, every checkpoint inside the budget is evaluated by one evaluator
   (scripts/bench/accuracy_curve.py: sampled at T=1) and each run's last one also greedily.

Reported per seed and as the median with its range: time to target (process clock), samples/s
(training clock), final sampled and greedy accuracy; `trl_over_realhf_time_to_target_median` is
median(TRL's times) / median(realhf's). A run that never reaches the target counts as the budget
in the median and is marked `reached: false`. Full mode takes about 50 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import yaml

from scripts.bench import accuracy_curve as ac
from scripts.bench.common import emit, log, print_tables

PROTOCOL = Path(__file__).with_name("protocol_vs_trl.yaml")


@dataclass(frozen=True)
class Protocol:
    """The declared protocol (see protocol_vs_trl.yaml for what each field means)."""

    declared: str
    task: str
    target: float
    seeds: List[int]
    budget_s: float
    save_every_s: float
    numerics: str
    evaluation: Dict[str, int]
    realhf: Dict[str, List[str]]
    trl: Dict = field(default_factory=dict)

    @property
    def bf16(self) -> bool:
        return self.numerics == "bf16"


def read_protocol(path: Path, cls):
    """A protocol file as `cls` (a dataclass), with the checks every race shares: an unknown or
    missing key, fewer than 3 distinct seeds or a target outside (0, 1) names the file and key."""
    raw = yaml.safe_load(Path(path).read_text())
    names = set(cls.__dataclass_fields__)
    unknown, missing = set(raw) - names, names - set(raw)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    p = cls(**raw)
    if len(p.seeds) < 3 or len(set(p.seeds)) != len(p.seeds):
        raise ValueError(f"{path}: seeds must be 3 or more distinct seeds, got {p.seeds}")
    if not 0 < p.target < 1:
        raise ValueError(f"{path}: target must be an accuracy in (0, 1), got {p.target}")
    return p


def load_protocol(path: Path = PROTOCOL) -> Protocol:
    """The protocol file, checked: an unknown or missing key, or a bad value, names the file and key."""
    p = read_protocol(path, Protocol)
    if p.numerics not in ("fp32", "bf16"):
        raise ValueError(f"{path}: numerics must be fp32 or bf16, got {p.numerics!r}")
    if p.numerics == "bf16":
        raise ValueError(
            f"{path}: numerics bf16: realhf's trainer has no bf16 mode that is measured to learn as well yet"
        )
    if not 0 <= p.trl.get("sweep_margin", -1) < 1:
        raise ValueError(f"{path}: trl.sweep_margin must be a fraction in [0, 1), got {p.trl.get('sweep_margin')}")
    if not p.trl.get("sweep"):
        raise ValueError(f"{path}: trl.sweep must list at least one setting")
    for s in p.trl["sweep"]:
        if set(s) != {"threads", "groups", "minibatches"} or (s["groups"] * 8) % s["minibatches"]:
            raise ValueError(f"{path}: trl.sweep entry {s}: needs threads, groups, minibatches dividing groups x 8")
    return p


def _median_range(xs: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def run_realhf(
    p: Protocol, seed: int, work: str, budget_s: float, timeout: float, trial: str = "", config_name: str = ""
) -> Dict:
    """One realhf run of the race (`config_name`: a training/configs file other than async-ppo.yaml)."""
    from realhf.base.trial_files import TrialFiles, read_metrics
    from scripts.bench.e2e import run_training

    trial = trial or f"vs-trl-realhf-{seed}"
    overrides = (
        "experiment_name=async-ppo",  # where run_training reads the run's logs, whatever the config
        f"exp_ctrl.max_train_seconds={budget_s}",  # its training clock starts after start-up: it overshoots, cut below
        "exp_ctrl.benchmark_steps=100000",
        f"exp_ctrl.save_freq_secs={p.save_every_s}",
        "exp_ctrl.keep_last_saves=0",
        "exp_ctrl.ckpt_freq_steps=0",  # recovery checkpoints: TRL's side writes none
        "evaluation.n_prompts=0",
        f"seed={seed}",
        *p.realhf.get("overrides", []),
    )
    t0 = time.time()
    summary = run_training(trial, overrides, timeout, fileroot=work, config_name=config_name)
    files = TrialFiles(work, "async-ppo", trial)
    metrics = read_metrics(files.log_dir)
    train_s = sum(m["step_time_s"] for m in metrics)
    return {
        "system": "realhf",
        "seed": seed,
        "overrides": list(p.realhf.get("overrides", [])),
        "steps": len(metrics),
        "samples_per_s": round(sum(m["n_samples"] for m in metrics) / train_s, 2),
        "load": [summary["load_before"][0], summary["load_after"][0]],
        "checkpoints": ac.clock_checkpoints(ac.realhf_checkpoints(files.log_dir, files.run_dir), t0),
        "train_success": [round(m["success_rate"], 4) for m in metrics],
    }


def trl_run_dir_name(seed: int, setting: Dict) -> str:
    cb = "-cb" if setting.get("continuous_batching") else ""
    return f"trl-{seed}-{setting['threads']}-{setting['groups']}{cb}"


def run_trl(
    p: Protocol, seed: int, setting: Dict, work: str, budget_s: float, timeout: float, driver_args: Sequence[str] = ()
) -> Dict:
    """One TRL run of the race (`driver_args`: the task and algorithm when not the tiny default)."""
    from scripts.bench.peer_trl import run_trl as drive

    if setting.get("continuous_batching"):
        driver_args = [*driver_args, "--continuous-batching"]
    r = drive(
        os.path.join(work, trl_run_dir_name(seed, setting)),
        budget_s,
        setting["threads"],
        save_steps=0,
        seed=seed,
        timeout=timeout,
        save_secs=p.save_every_s,
        budget_clock="process",
        bf16=p.bf16,
        groups=setting["groups"],
        minibatches=setting["minibatches"],
        driver_args=driver_args,
    )
    return {
        "system": "trl",
        "seed": seed,
        "overrides": [f"trl=={r['trl']}", *(f"{k}={v}" for k, v in setting.items())],
        "bf16": r["bf16"],
        "steps": r["steps"],
        "samples_per_s": r["samples_per_s"],
        "start_s": r["start_s"],
        "load": [r["load_before"][0], r["load_after"][0]],
        "checkpoints": r["checkpoints"],
        "train_success": r.get("train_success", []),
        "train_clipped": r.get("train_clipped", []),
    }


def sweep(p: Protocol, work: str, budget_s: float, driver_args: Sequence[str] = ()) -> List[Dict]:
    out = []
    for s in p.trl["sweep"]:
        log(f"TRL sweep: {s} for {budget_s:.0f} s")
        r = run_trl(p, p.seeds[0], s, os.path.join(work, "sweep"), budget_s, budget_s + 900, driver_args)
        out.append({**s, "samples_per_s": r["samples_per_s"], "steps": r["steps"], "bf16": r["bf16"]})
    return out


def race_order(seeds: Sequence[int]) -> List[Tuple[int, str]]:
    """(seed, system) in the order the runs go: per seed both systems, the first one alternating."""
    return [(seed, system) for i, seed in enumerate(seeds) for system in (("realhf", "trl"), ("trl", "realhf"))[i % 2]]


def pick_setting(swept: List[Dict], margin: float) -> Dict:
    """The sweep's winner: in listed order, a setting replaces the best so far only when its
    samples/s beat it by more than `margin` (ties go to the setting closer to the exact algorithm)."""
    best = swept[0]
    for s in swept[1:]:
        if s["samples_per_s"] > best["samples_per_s"] * (1 + margin):
            best = s
    return best


def evaluate(runs: List[Dict], p: Protocol, budget_s: float, n_prompts: int) -> Dict:
    """Each run's curve (clock_s: sampled accuracy) inside the budget, and its last point greedily."""
    ev = dict(n_prompts=n_prompts, n_samples=p.evaluation["n_samples"], seed=p.evaluation["seed"])
    ev["threads"] = p.evaluation["threads"]
    start = ac.evaluate_curve([(0.0, ac.SFT)], **ev)[0]["accuracy"]
    greedy_start = ac.evaluate_curve([(0.0, ac.SFT)], **{**ev, "n_samples": 1}, temperature=0.0)[0]["accuracy"]
    for r in runs:
        inside = [c for c in r.pop("checkpoints") if c["clock_s"] <= budget_s]
        if not inside:
            raise RuntimeError(f"{r['system']} seed {r['seed']} saved nothing within {budget_s} s")
        curve = ac.evaluate_curve([(c["clock_s"], c["path"]) for c in inside], **ev)
        r["curve"] = [{"clock_s": 0.0, "accuracy": start}] + [
            {"clock_s": c["train_s"], "accuracy": c["accuracy"]} for c in curve
        ]
        last = inside[-1]
        r["final_accuracy"] = r["curve"][-1]["accuracy"]
        r["final_clock_s"] = last["clock_s"]
        greedy = ac.evaluate_curve([(last["clock_s"], last["path"])], **{**ev, "n_samples": 1}, temperature=0.0)
        r["final_greedy_accuracy"] = greedy[0]["accuracy"]
        t = ac.time_to([{"train_s": c["clock_s"], "accuracy": c["accuracy"]} for c in r["curve"]], p.target)
        r["reached"] = t is not None
        r["time_to_target_s"] = t if t is not None else budget_s
    return {"start_accuracy": start, "start_greedy_accuracy": greedy_start}


def summarize(runs: List[Dict], seeds: List[int]) -> Dict:
    by = {s: [r for r in runs if r["system"] == s] for s in ("realhf", "trl")}
    out = {}
    for s, rs in by.items():
        out[s] = {k: _median_range([r[k] for r in rs]) for k in ("time_to_target_s", "samples_per_s", "final_accuracy")}
        out[s]["final_greedy_accuracy"] = _median_range([r["final_greedy_accuracy"] for r in rs])
        out[s]["reached"] = sum(r["reached"] for r in rs)
    per_seed = []
    for seed in seeds:
        a = next(r for r in by["realhf"] if r["seed"] == seed)
        b = next(r for r in by["trl"] if r["seed"] == seed)
        per_seed.append(
            {
                "seed": seed,
                "realhf_time_to_target_s": a["time_to_target_s"],
                "trl_time_to_target_s": b["time_to_target_s"],
                "trl_over_realhf_time_to_target": round(b["time_to_target_s"] / a["time_to_target_s"], 3),
                "realhf_samples_per_s": a["samples_per_s"],
                "trl_samples_per_s": b["samples_per_s"],
                "realhf_final_accuracy": a["final_accuracy"],
                "trl_final_accuracy": b["final_accuracy"],
                "realhf_final_greedy_accuracy": a["final_greedy_accuracy"],
                "trl_final_greedy_accuracy": b["final_greedy_accuracy"],
            }
        )
    ratio = out["trl"]["time_to_target_s"]["median"] / out["realhf"]["time_to_target_s"]["median"]
    return {
        "systems": out,
        "per_seed": per_seed,
        "trl_over_realhf_time_to_target_median": round(ratio, 3),
        "realhf_over_trl_samples_per_s_median": round(
            out["realhf"]["samples_per_s"]["median"] / out["trl"]["samples_per_s"]["median"], 3
        ),
        "final_accuracy_realhf_minus_trl_median": round(
            out["realhf"]["final_accuracy"]["median"] - out["trl"]["final_accuracy"]["median"], 4
        ),
    }


def _mr(d: Dict[str, float]) -> str:
    return f"{d['median']} ({d['min']}–{d['max']})"


def tables(r: Dict):
    sw = [[s["threads"], s["groups"], s["minibatches"], s["steps"], s["samples_per_s"]] for s in r["trl_sweep"]]
    seeds = [
        [
            x["seed"],
            x["realhf_time_to_target_s"],
            x["trl_time_to_target_s"],
            x["trl_over_realhf_time_to_target"],
            x["realhf_samples_per_s"],
            x["trl_samples_per_s"],
            f"{x['realhf_final_accuracy']} / {x['trl_final_accuracy']}",
            f"{x['realhf_final_greedy_accuracy']} / {x['trl_final_greedy_accuracy']}",
        ]
        for x in r["per_seed"]
    ]
    sys_rows = [
        [
            s,
            _mr(v["time_to_target_s"]),
            f"{v['reached']}/{len(r['seeds'])}",
            _mr(v["samples_per_s"]),
            _mr(v["final_accuracy"]),
            _mr(v["final_greedy_accuracy"]),
        ]
        for s, v in r["systems"].items()
    ]
    curves = [
        [x["system"], x["seed"], " ".join(f"{c['clock_s']:.0f}:{c['accuracy']:.3f}" for c in x["curve"])]
        for x in r["runs"]
    ]
    return [
        (
            f"TRL sweep ({r['trl_sweep_budget_s']} s each, samples/s on the training clock, {r['trl_numerics']})",
            ["threads", "groups", "minibatches", "steps", "samples/s"],
            sw,
        ),
        (
            f"vs TRL, protocol declared {r['declared']}: target {r['target']} sampled accuracy (start "
            f"{r['start_accuracy']}, greedy {r['start_greedy_accuracy']}), {r['budget_s']} s from process start, "
            f"checkpoints every {r['save_every_s']} s, {r['numerics']} both, TRL {r['trl_setting']}",
            [
                "seed",
                "realhf s to target",
                "TRL s to target",
                "TRL/realhf",
                "realhf samples/s",
                "TRL samples/s",
                "final sampled realhf / TRL",
                "final greedy realhf / TRL",
            ],
            seeds,
        ),
        (
            f"median (range) over seeds; TRL/realhf time to target (ratio of medians) "
            f"{r['trl_over_realhf_time_to_target_median']}",
            ["system", "s to target", "reached", "samples/s", "final sampled", "final greedy"],
            sys_rows,
        ),
        ("accuracy curves (process-clock s: sampled accuracy)", ["system", "seed", "curve"], curves),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.vs_trl", description=__doc__.split("\n")[0])
    ap.add_argument("--protocol", default=str(PROTOCOL))
    ap.add_argument("--short", action="store_true", help="smoke mode: 45 s budgets, 15 s sweep runs, 50 eval prompts")
    ap.add_argument("--work-dir", default=None, help="keep runs and checkpoints here (default: a temp dir, deleted)")
    args = ap.parse_args(argv)
    p = load_protocol(Path(args.protocol))
    budget = 45.0 if args.short else float(p.budget_s)
    sweep_budget = 15.0 if args.short else float(p.trl["sweep_budget_s"])
    n_prompts = 50 if args.short else p.evaluation["n_prompts"]
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_vs_trl_")
    timeout = budget + 900
    try:
        swept = sweep(p, work, sweep_budget)
        best = pick_setting(swept, float(p.trl["sweep_margin"]))
        setting = {k: best[k] for k in ("threads", "groups", "minibatches")}
        log(f"TRL races with {setting}")
        runs: List[Dict] = []
        for seed, system in race_order(p.seeds):
            log(f"seed {seed}: {system} for {budget:.0f} s")
            if system == "realhf":
                runs.append(run_realhf(p, seed, work, budget, timeout))
            else:
                runs.append(run_trl(p, seed, setting, work, budget, timeout))
        log(f"evaluating {sum(len(r['checkpoints']) for r in runs)} checkpoints")
        starts = evaluate(runs, p, budget, n_prompts)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    res = {
        "bench": "vs_trl",
        "protocol": os.path.relpath(args.protocol),
        "declared": p.declared,
        "target": p.target,
        "seeds": list(p.seeds),
        "budget_s": budget,
        "save_every_s": p.save_every_s,
        "numerics": p.numerics,
        "trl_numerics": "bf16" if p.bf16 else "fp32",
        "trl_bf16": all(r["bf16"] for r in runs if r["system"] == "trl"),
        "realhf_bf16": False,
        "eval_prompts": n_prompts,
        "eval_samples": p.evaluation["n_samples"],
        "trl_sweep_budget_s": sweep_budget,
        "trl_sweep": swept,
        "trl_setting": setting,
        **starts,
        "runs": runs,
    }
    res.update(summarize(runs, list(p.seeds)))
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
