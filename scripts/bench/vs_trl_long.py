"""The long-reasoning race: realhf against TRL's GRPOTrainer, with realhf's synchronous mode beside
them, under a protocol declared before the runs.

    python -m scripts.bench.vs_trl_long [--short] [--seeds 1] [--protocol P] [--work-dir D] [--state F]

The task whose answers run from 8 to ~530 tokens (assets/tiny-long): the regime where a
synchronous trainer waits for its longest answer and pads every row to it. Everything that
decides a number is in scripts/bench/protocol_vs_trl_long.yaml; TRL's algorithm is read off
realhf's composed config (scripts/bench/race.py) and a realhf setting the TRL driver cannot
match is refused.

1. TRL's sweep (once): each listed setting trains for `trl.sweep_budget_s`; the fastest in
   samples/s races, a later one winning only by more than `trl.sweep_margin`.
2. For each seed, three runs one after another, each for `budget_s` on the process clock and
   saving every `save_every_s`: realhf (the config as shipped), TRL (the sweep's winner) and
   realhf synchronous (`realhf.sync_overrides`), the first one rotating per seed.
3. After each run, off the clock, one evaluator (realhf's task evaluator on the held-out split,
   `evaluation.n_samples` answers per prompt at T=1) scores its checkpoints; its last one also
   greedily; its saves are then deleted.

Reported per seed and as medians with ranges in `results.vs_trl_long`:
`trl_over_realhf_time_to_target_median` is median(TRL's times) / median(realhf's); a run that
never reaches the target counts as the budget and is marked `reached: false`. The progress is
kept in `--work-dir` (default `.bench/vs_trl_long-<protocol sha>`), so `--seeds 1` now and the
same command later finish the race across sittings; `--state F` starts from a race_state.json
saved elsewhere (docs/bench-runs/, for a race that spans sessions on fresh machines). A seed's
three runs race on one host. Full mode: about 2 hours per seed on 2 cores (3 x 1800 s, then
25 s of scoring per checkpoint).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from scripts.bench import vs_trl
from scripts.bench.common import REPO, emit, log, print_tables
from scripts.bench.long_task import DATA, ensure_data
from scripts.bench.race import (
    algorithm_mismatches,
    open_state,
    protocol_sha,
    same_machine,
    samples_per_optimizer_step,
    save_state,
    task_evaluator,
    this_host,
    trl_driver_args,
)

PROTOCOL = Path(__file__).with_name("protocol_vs_trl_long.yaml")
SYSTEMS = ("realhf", "trl", "realhf_sync")
PROMPT_TOKENS = 32  # the task's prompts are at most 25 tokens
SETTING_KEYS = {"threads", "groups", "minibatches", "continuous_batching"}


@dataclass(frozen=True)
class Protocol:
    """The declared protocol (protocol_vs_trl_long.yaml says what each field means)."""

    declared: str
    realhf: Dict
    evaluation: Dict
    target: float
    seeds: List[int]
    budget_s: float
    save_every_s: float
    numerics: str
    trl: Dict

    @property
    def bf16(self) -> bool:
        return self.numerics == "bf16"


def load_protocol(path: Path = PROTOCOL) -> Protocol:
    """The protocol file, checked: an unknown or missing key, or a bad value, names the file and key."""
    p = vs_trl.read_protocol(path, Protocol)
    if p.numerics != "fp32":
        raise ValueError(f"{path}: numerics must be fp32 (realhf's trainer has no bf16 mode measured to help)")
    if set(p.realhf) != {"config", "overrides", "sync_overrides"} or not all(
        isinstance(p.realhf[k], list) for k in ("overrides", "sync_overrides")
    ):
        raise ValueError(f"{path}: realhf needs exactly config, overrides (a list) and sync_overrides (a list)")
    if "max_head_offpolicyness=0" not in p.realhf["sync_overrides"]:
        raise ValueError(f"{path}: realhf.sync_overrides must hold max_head_offpolicyness=0 (synchronous)")
    want = {"split", "n_prompts", "n_samples", "max_new_tokens", "threads"}
    if set(p.evaluation) != want or p.evaluation["n_samples"] < 1:
        raise ValueError(f"{path}: evaluation needs exactly {sorted(want)}, n_samples >= 1")
    if p.budget_s <= 0 or not 0 < p.save_every_s < p.budget_s:
        raise ValueError(f"{path}: need budget_s > 0 and 0 < save_every_s < budget_s")
    if not 0 <= p.trl.get("sweep_margin", -1) < 1 or not p.trl.get("sweep"):
        raise ValueError(f"{path}: trl needs sweep_margin in [0, 1) and a non-empty sweep")
    for s in p.trl["sweep"]:
        if set(s) != SETTING_KEYS:
            raise ValueError(f"{path}: trl.sweep entry {s}: needs exactly {sorted(SETTING_KEYS)}")
    return p


def realhf_config(p: Protocol, sync: bool = False):
    from realhf.experiments.config_loading import compose_config

    extra = p.realhf["sync_overrides"] if sync else []
    return compose_config([*p.realhf["overrides"], *extra], config_name=p.realhf["config"])


def check_algorithm(p: Protocol, path: str) -> None:
    """Refuse a protocol whose realhf side the TRL driver cannot reproduce, or whose sweep changes
    the samples per optimizer step."""
    cfg = realhf_config(p)
    bad = algorithm_mismatches(cfg)
    if bad:
        raise SystemExit(f"{path}: realhf's config runs what the TRL driver cannot: {'; '.join(bad)}")
    for s in p.trl["sweep"]:
        if s["groups"] * cfg.group_size // s["minibatches"] != samples_per_optimizer_step(cfg):
            raise SystemExit(
                f"{path}: trl.sweep entry {s}: not realhf's {samples_per_optimizer_step(cfg)} samples per optimizer step"
            )


def race_order(seeds: Sequence[int]) -> List[Tuple[int, str]]:
    """(seed, system) in the order the runs go: each seed runs all three, the first one rotating."""
    return [(seed, SYSTEMS[(i + j) % len(SYSTEMS)]) for i, seed in enumerate(seeds) for j in range(len(SYSTEMS))]


def pair_seed_on_this_host(state: Dict, seed: int, host: Dict) -> None:
    """A seed's runs race on one machine: those left by an invocation on another host are
    dropped, to be run again here."""
    have = [r for r in state["runs"] if r["seed"] == seed]
    if have and not all(same_machine(r["host"], host) for r in have):
        log(f"seed {seed}: dropping its {[r['system'] for r in have]} runs from another host: a seed races on one host")
        state["runs"] = [r for r in state["runs"] if r["seed"] != seed]


# -- the runs -------------------------------------------------------------------------------------


def run_system(p: Protocol, system: str, seed: int, setting: Dict, work: str, budget: float) -> Dict:
    """One run of the race from a clean directory (an interrupted attempt leaves its saves behind)."""
    if system == "trl":
        shutil.rmtree(os.path.join(work, vs_trl.trl_run_dir_name(seed, setting)), ignore_errors=True)
        # Which prompts TRL trained, in order (realhf writes its trained_qids.jsonl): read after
        # the race to compare learning per sample at equal prompt difficulty.
        samples = os.path.join(work, f"trl-samples-{seed}.jsonl")
        if os.path.exists(samples):
            os.remove(samples)
        args = [*trl_driver_args(realhf_config(p)), "--sample-log", samples]
        return vs_trl.run_trl(p, seed, setting, work, budget, budget + 900, args)
    from realhf.base.trial_files import TrialFiles

    sync = system == "realhf_sync"
    trial = f"long-{system.replace('_', '-')}-{seed}"
    files = TrialFiles(work, "async-ppo", trial)
    for d in (files.run_dir, files.log_dir):
        shutil.rmtree(d, ignore_errors=True)
    overrides = [*p.realhf["overrides"], *(p.realhf["sync_overrides"] if sync else [])]
    q = dataclasses.replace(p, realhf={"overrides": overrides})
    r = vs_trl.run_realhf(q, seed, work, budget, budget + 900, trial, p.realhf["config"])
    r["system"] = system
    return r


def score_run(r: Dict, score, p: Protocol, budget_s: float, start: Dict, n_prompts: int, k: int) -> None:
    """One run's sampled curve inside the budget (from the warm start's), its time to target, its
    last checkpoint greedily; its saves deleted once scored."""
    saved = r.pop("checkpoints")
    inside = [c for c in saved if c["clock_s"] <= budget_s]
    r["curve"] = [{"clock_s": 0.0, "accuracy": start["start_accuracy"]}]
    for c in inside:
        s = score(c["path"], 1.0, n_prompts, k)
        r["curve"].append(
            {"clock_s": c["clock_s"], "accuracy": round(s["accuracy"], 4), "mean_new_tokens": s["mean_new_tokens"]}
        )
    if inside:
        r["final_accuracy"] = r["curve"][-1]["accuracy"]
        r["final_greedy_accuracy"] = round(score(inside[-1]["path"], 0.0, n_prompts)["accuracy"], 4)
        r["final_clock_s"] = inside[-1]["clock_s"]
    else:  # too slow to save inside the budget: it ends where it began
        log(f"{r['system']} seed {r['seed']} saved nothing within {budget_s} s: scored as the warm start")
        r.update(final_accuracy=start["start_accuracy"], final_greedy_accuracy=start["start_greedy_accuracy"])
        r["final_clock_s"] = 0.0
    t = next((c["clock_s"] for c in r["curve"][1:] if c["accuracy"] >= p.target), None)
    r["reached"] = t is not None
    r["time_to_target_s"] = t if t is not None else budget_s
    r["checkpoints_saved"] = len(saved)
    for c in saved:
        shutil.rmtree(c["path"], ignore_errors=True)


# -- the report -----------------------------------------------------------------------------------


def _median_range(xs: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def summarize(runs: List[Dict], seeds: List[int]) -> Dict:
    """Per system medians (ranges), per seed the three side by side, and the ratios of medians."""
    keys = ("time_to_target_s", "samples_per_s", "final_accuracy", "final_greedy_accuracy")
    systems = {}
    for s in SYSTEMS:
        rs = [r for r in runs if r["system"] == s]
        systems[s] = {k: _median_range([r[k] for r in rs]) for k in keys}
        systems[s]["reached"] = sum(r["reached"] for r in rs)
    per_seed = []
    for seed in seeds:
        row: Dict = {"seed": seed}
        for r in runs:
            if r["seed"] == seed:
                for k in keys:
                    row[f"{r['system']}_{k}"] = r[k]
                row[f"{r['system']}_reached"] = r["reached"]
        row["trl_over_realhf_time_to_target"] = round(row["trl_time_to_target_s"] / row["realhf_time_to_target_s"], 3)
        per_seed.append(row)
    med = {s: systems[s]["time_to_target_s"]["median"] for s in SYSTEMS}
    return {
        "systems": systems,
        "per_seed": per_seed,
        "trl_over_realhf_time_to_target_median": round(med["trl"] / med["realhf"], 3),
        "sync_over_async_time_to_target_median": round(med["realhf_sync"] / med["realhf"], 3),
        "realhf_over_trl_samples_per_s_median": round(
            systems["realhf"]["samples_per_s"]["median"] / systems["trl"]["samples_per_s"]["median"], 3
        ),
        "final_accuracy_realhf_minus_trl_median": round(
            systems["realhf"]["final_accuracy"]["median"] - systems["trl"]["final_accuracy"]["median"], 4
        ),
    }


def _mr(d: Dict[str, float]) -> str:
    return f"{d['median']} ({d['min']}–{d['max']})"


def tables(r: Dict):
    sw = [
        [s["threads"], s["groups"], s["minibatches"], s["continuous_batching"], s["steps"], s["samples_per_s"]]
        for s in r["trl_sweep"]
    ]
    seeds = [
        [x["seed"]]
        + [x.get(f"{s}_time_to_target_s") for s in SYSTEMS]
        + [x["trl_over_realhf_time_to_target"]]
        + [x.get(f"{s}_samples_per_s") for s in SYSTEMS]
        + [" / ".join(str(x.get(f"{s}_final_accuracy")) for s in SYSTEMS)]
        + [" / ".join(str(x.get(f"{s}_final_greedy_accuracy")) for s in SYSTEMS)]
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
    head = (
        f"long-reasoning race, protocol declared {r['declared']}: target {r['target']} sampled success "
        f"({r['eval_prompts']} held-out prompts x {r['eval_samples']} at T=1; warm start {r['start_accuracy']}, "
        f"greedy {r['start_greedy_accuracy']}), {r['budget_s']} s from process start, checkpoints every "
        f"{r['save_every_s']} s, fp32 all, TRL {r['trl_setting']}; seeds {r['seeds']}"
        + ("" if r["complete"] else f" (not yet run: {r['seeds_missing']})")
        + f" on {', '.join(r['hosts'])}"
    )
    return [
        (
            f"TRL sweep ({r['trl_sweep_budget_s']} s each, samples/s on the training clock)",
            ["threads", "groups", "minibatches", "continuous batching", "steps", "samples/s"],
            sw,
        ),
        (
            head,
            ["seed", "realhf s", "TRL s", "realhf sync s", "TRL/realhf", "realhf samples/s", "TRL samples/s"]
            + ["sync samples/s", "final sampled realhf / TRL / sync", "final greedy realhf / TRL / sync"],
            seeds,
        ),
        (
            f"median (range) over seeds; TRL/realhf time to target (ratio of medians) "
            f"{r['trl_over_realhf_time_to_target_median']}, sync/async {r['sync_over_async_time_to_target_median']}",
            ["system", "s to target", "reached", "samples/s", "final sampled", "final greedy"],
            sys_rows,
        ),
        ("sampled success curves (process-clock s: accuracy)", ["system", "seed", "curve"], curves),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.vs_trl_long", description=__doc__.split("\n")[0])
    ap.add_argument("--protocol", default=str(PROTOCOL))
    ap.add_argument(
        "--short", action="store_true", help="smoke mode: 120 s budgets, one 40 s sweep run, 40 prompts x 2, seed 1"
    )
    ap.add_argument("--seeds", default=None, help="run only these of the protocol's seeds now (comma-separated)")
    ap.add_argument("--work-dir", default=None, help="the race's progress and runs (see the module doc)")
    ap.add_argument("--state", default=None, help="start from this race_state.json (a race saved in docs/bench-runs)")
    args = ap.parse_args(argv)
    p = load_protocol(Path(args.protocol))
    check_algorithm(p, args.protocol)
    sha, mode = protocol_sha(args.protocol), "short" if args.short else "full"
    if args.short:
        p = dataclasses.replace(p, save_every_s=40.0)
    budget = 120.0 if args.short else float(p.budget_s)
    sweep_budget = 40.0 if args.short else float(p.trl["sweep_budget_s"])
    n_prompts, k = (40, 2) if args.short else (p.evaluation["n_prompts"], p.evaluation["n_samples"])
    seeds = p.seeds[:1] if args.short else list(p.seeds)
    now = seeds if args.seeds is None else [int(x) for x in args.seeds.split(",")]
    if not set(now) <= set(seeds):
        raise SystemExit(f"--seeds {args.seeds}: the protocol's seeds are {seeds}")
    temporary = args.work_dir is None and args.short
    work = args.work_dir or (
        tempfile.mkdtemp(prefix="bench_long_")
        if args.short
        else os.path.join(REPO, ".bench", f"vs_trl_long-{sha[:12]}")
    )
    os.makedirs(work, exist_ok=True)
    if args.state and not Path(work, "race_state.json").is_file():
        shutil.copyfile(args.state, Path(work, "race_state.json"))
    state, host = open_state(work, sha, mode), this_host()
    started = time.time()
    try:
        ensure_data()
        eval_path = os.path.join(DATA, f"{p.evaluation['split']}.jsonl")
        score = task_evaluator(
            p.realhf["config"],
            p.realhf["overrides"],
            eval_path,
            p.evaluation["max_new_tokens"],
            PROMPT_TOKENS + p.evaluation["max_new_tokens"],
            p.evaluation["threads"],
            work,
        )
        if "base" not in state:
            base = os.path.join(REPO, realhf_config(p).actor.path)
            s0, g0 = score(base, 1.0, n_prompts, k), score(base, 0.0, n_prompts)
            state["base"] = {
                "start_accuracy": round(s0["accuracy"], 4),
                "start_greedy_accuracy": round(g0["accuracy"], 4),
                "start_mean_new_tokens": s0["mean_new_tokens"],
                "host": host,
            }
            save_state(work, state)
        start = state["base"]
        if start["start_accuracy"] >= p.target:
            why = f"the warm start already scores {start['start_accuracy']} >= target {p.target}"
            if not args.short:
                raise SystemExit(f"{args.protocol}: {why}")
            log(f"warning (short mode, {n_prompts} prompts): {why}")
        if "sweep" not in state:
            sweep_list = p.trl["sweep"][:1] if args.short else p.trl["sweep"]
            q = dataclasses.replace(p, trl={**p.trl, "sweep": sweep_list})
            swept = vs_trl.sweep(q, work, sweep_budget, trl_driver_args(realhf_config(p)))
            best = vs_trl.pick_setting(swept, float(p.trl["sweep_margin"]))
            state["sweep"] = {"runs": swept, "setting": {k_: best[k_] for k_ in SETTING_KEYS}, "host": host}
            save_state(work, state)
        setting = state["sweep"]["setting"]
        log(f"TRL races with {setting}")
        for seed, system in race_order(seeds):
            if seed not in now:
                continue
            pair_seed_on_this_host(state, seed, host)
            if any(r["seed"] == seed and r["system"] == system for r in state["runs"]):
                continue
            log(f"seed {seed}: {system} for {budget:.0f} s")
            r = run_system(p, system, seed, setting, work, budget)
            log(f"scoring {len(r['checkpoints'])} checkpoints of {system} seed {seed}")
            score_run(r, score, p, budget, start, n_prompts, k)
            state["runs"].append({**r, "host": host})
            save_state(work, state)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    done = [s for s in seeds if {r["system"] for r in state["runs"] if r["seed"] == s} == set(SYSTEMS)]
    if not done:
        raise SystemExit(f"{work}: no seed has all three runs scored yet")
    runs = [r for r in state["runs"] if r["seed"] in done]
    res = {
        "bench": "vs_trl_long",
        "protocol": os.path.relpath(args.protocol, REPO),
        "protocol_sha256": sha,
        "declared": p.declared,
        "target": p.target,
        "metric": "sampled success",
        "seeds": done,
        "complete": done == seeds,
        "seeds_missing": [s for s in seeds if s not in done],
        "hosts": sorted({f"{r['host']['cpu_model']} ({r['host']['cpu_flags']})" for r in runs}),
        "budget_s": budget,
        "save_every_s": p.save_every_s,
        "numerics": p.numerics,
        "trl_bf16": all(r["bf16"] for r in runs if r["system"] == "trl"),
        "realhf_bf16": False,
        "eval_prompts": n_prompts,
        "eval_samples": k,
        "trl_driver_args": trl_driver_args(realhf_config(p)),
        "trl_sweep_budget_s": sweep_budget,
        "trl_sweep": state["sweep"]["runs"],
        "trl_setting": setting,
        **{key: v for key, v in start.items() if key != "host"},
        "runs": runs,
        "wall_minutes_this_invocation": round((time.time() - started) / 60, 1),
    }
    res.update(summarize(runs, done))
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
