"""realhf's levers against its own default, under the realhf-vs-TRL protocol's rules.

    python -m scripts.bench.levers [--short] [--levers scripts/bench/protocol_levers.yaml] [--work-dir D]

A levers file may replace the base's `budget_s` and `save_every_s` (declared with it, e.g. for a
host too slow to reach the target within the base's budget: protocol_levers_avx2.yaml).

For each seed of the base protocol, the default (training/configs/async-ppo.yaml plus the base's
`realhf.overrides`) and every lever (the same plus its overrides) train for the base's budget on
the process clock, saving a checkpoint every `save_every_s`; the one going first rotates by seed.
After all training one evaluator scores every checkpoint (vs_trl.evaluate: sampled at T=1, and
greedy on each run's last). Reported per lever: time to target, samples/s, final accuracy (median
and range over seeds) and `default_over_lever_time_to_target` (median of the default's times over
the lever's: above 1, the lever reaches the target sooner). Full mode: about 20 minutes per
configuration (3 seeds) on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import yaml

from scripts.bench import vs_trl
from scripts.bench.common import emit, log, print_tables

LEVERS = Path(__file__).with_name("protocol_levers.yaml")
DEFAULT = "default"


def load_levers(path: Path = LEVERS):
    """(the base protocol, {name: overrides}) from the levers file, checked: an unknown or
    missing key, a bad name or an empty lever names the file and key."""
    raw = yaml.safe_load(Path(path).read_text())
    required, optional = {"declared", "base", "levers"}, {"budget_s", "save_every_s"}
    unknown, missing = set(raw) - required - optional, required - set(raw)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    levers = raw["levers"]
    if not isinstance(levers, dict) or not levers:
        raise ValueError(f"{path}: levers must map a name to a list of overrides")
    for name, overrides in levers.items():
        if name == DEFAULT or not str(name).replace("_", "").isalnum():
            raise ValueError(f"{path}: levers.{name}: a name of letters, digits and '_', not {DEFAULT!r}")
        if not isinstance(overrides, list) or not overrides or not all("=" in str(o) for o in overrides):
            raise ValueError(f"{path}: levers.{name}: a non-empty list of key=value overrides, got {overrides!r}")
    replaced = {k: raw[k] for k in optional if k in raw}
    for k, v in replaced.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"{path}: {k}: a positive number of seconds, got {v!r}")
    base = vs_trl.load_protocol(Path(path).parent / raw["base"])
    base = dataclasses.replace(base, **{k: float(v) for k, v in replaced.items()})
    return base, {k: [str(o) for o in v] for k, v in levers.items()}


def summarize(runs: List[Dict], names: List[str]) -> Dict:
    def med(xs):
        return statistics.median(xs)

    out = {}
    for name in names:
        rs = [r for r in runs if r["lever"] == name]
        out[name] = {
            k: vs_trl._median_range([r[k] for r in rs])
            for k in ("time_to_target_s", "samples_per_s", "final_accuracy", "final_greedy_accuracy", "steps")
        }
        out[name]["reached"] = sum(r["reached"] for r in rs)
        out[name]["overrides"] = rs[0]["overrides"]
    base_t = out[DEFAULT]["time_to_target_s"]["median"]
    base_sps = out[DEFAULT]["samples_per_s"]["median"]
    for name in names:
        o = out[name]
        o["default_over_lever_time_to_target"] = round(base_t / o["time_to_target_s"]["median"], 3)
        o["lever_over_default_samples_per_s"] = round(o["samples_per_s"]["median"] / base_sps, 3)
        per_seed = {r["seed"]: r for r in runs if r["lever"] == name}
        base_seed = {r["seed"]: r for r in runs if r["lever"] == DEFAULT}
        o["per_seed_default_over_lever"] = {
            s: round(base_seed[s]["time_to_target_s"] / per_seed[s]["time_to_target_s"], 3) for s in sorted(per_seed)
        }
        o["samples_to_target_median"] = round(
            med([r["time_to_target_s"] * r["samples_per_s"] for r in runs if r["lever"] == name])
        )
    return out


def tables(r: Dict):
    mr = vs_trl._mr
    rows = [
        [
            name,
            " ".join(v["overrides"]) or "(as shipped)",
            mr(v["time_to_target_s"]),
            f"{v['reached']}/{len(r['seeds'])}",
            v["default_over_lever_time_to_target"],
            mr(v["samples_per_s"]),
            v["samples_to_target_median"],
            mr(v["final_accuracy"]),
            mr(v["final_greedy_accuracy"]),
        ]
        for name, v in r["levers"].items()
    ]
    curves = [
        [x["lever"], x["seed"], " ".join(f"{c['clock_s']:.0f}:{c['accuracy']:.3f}" for c in x["curve"])]
        for x in r["runs"]
    ]
    return [
        (
            f"realhf levers, protocol {r['protocol']} (target {r['target']} sampled accuracy from {r['start_accuracy']}, "
            f"{r['budget_s']} s from process start, seeds {r['seeds']}); median (range) over seeds",
            [
                "lever",
                "overrides",
                "s to target",
                "reached",
                "default/lever time",
                "samples/s",
                "samples to target (median of s x samples/s)",
                "final sampled",
                "final greedy",
            ],
            rows,
        ),
        ("accuracy curves (process-clock s: sampled accuracy)", ["lever", "seed", "curve"], curves),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.levers", description=__doc__.split("\n")[0])
    ap.add_argument("--levers", default=str(LEVERS))
    ap.add_argument("--short", action="store_true", help="smoke mode: 45 s budgets, 50 eval prompts, the first seed")
    ap.add_argument("--work-dir", default=None, help="keep runs and checkpoints here (default: a temp dir, deleted)")
    args = ap.parse_args(argv)
    p, levers = load_levers(Path(args.levers))
    budget = 45.0 if args.short else float(p.budget_s)
    n_prompts = 50 if args.short else p.evaluation["n_prompts"]
    seeds = p.seeds[:1] if args.short else list(p.seeds)
    base = list(p.realhf.get("overrides", []))
    configs = {DEFAULT: base, **{k: base + v for k, v in levers.items()}}
    names = list(configs)
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_levers_")
    try:
        runs: List[Dict] = []
        for i, seed in enumerate(seeds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                log(f"seed {seed}: {name} for {budget:.0f} s")
                pp = dataclasses.replace(p, realhf={**p.realhf, "overrides": configs[name]})
                r = vs_trl.run_realhf(pp, seed, work, budget, budget + 900, trial=f"lever-{name}-{seed}")
                r["lever"] = name
                runs.append(r)
        log(f"evaluating {sum(len(r['checkpoints']) for r in runs)} checkpoints")
        starts = vs_trl.evaluate(runs, p, budget, n_prompts)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    res = {
        "bench": "levers",
        "protocol": os.path.relpath(args.levers),
        "base_protocol": p.declared,
        "target": p.target,
        "seeds": seeds,
        "budget_s": budget,
        "save_every_s": p.save_every_s,
        "eval_prompts": n_prompts,
        "eval_samples": p.evaluation["n_samples"],
        **starts,
        "levers": summarize(runs, names),
        "runs": runs,
    }
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
