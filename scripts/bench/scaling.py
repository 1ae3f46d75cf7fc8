"""Scaling of the whole system: samples/s against rollout workers, max_concurrent_rollouts and
group_size, and step time against max_new_tokens.

    python -m scripts.bench.scaling [--short] [--steps 15]

Each point is a short `training/main_async_ppo.py` run of the embedded default (evaluation off)
with one knob changed (see `scripts.bench.e2e.run_training`; throughput excludes the first
step). For the max_new_tokens axis every answer is forced to full length
(`ppo.gen.min_new_tokens = max_new_tokens`): the tiny model otherwise stops after ≈16 tokens
and the knob would change nothing. Linearity: a least-squares line step_time = a + b·L through
the points, its R² and the share of step time the line attributes to tokens at the largest L.
Points run one after another on a shared machine: the load average is recorded per point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Sequence

from scripts.bench.common import REPO, emit, log, print_tables
from scripts.bench.e2e import run_training

FULL_AXES = {
    "rollout.n_workers": [1, 2, 4],
    "max_concurrent_rollouts": [16, 32, 64],
    "group_size": [4, 8, 16],
    "ppo.gen.max_new_tokens": [16, 32, 64, 128],
}
SHORT_AXES = {
    "rollout.n_workers": [1, 2],
    "max_concurrent_rollouts": [16, 32],
    "group_size": [4, 8],
    "ppo.gen.max_new_tokens": [16, 32],
}


def overrides_for(axis: str, value: int) -> List[str]:
    out = [f"{axis}={value}"]
    if axis == "ppo.gen.max_new_tokens":
        out.append(f"ppo.gen.min_new_tokens={value}")
    return out


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> Dict[str, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 - ss_res / ss_tot if ss_tot else 1.0
    return {"intercept_s": a, "slope_s_per_token": b, "r2": r2}


def tables(r):
    out = []
    for axis, points in r["axes"].items():
        rows = [
            [
                p["value"],
                p["samples_per_s"],
                p["gen_tokens_per_s"],
                p["step_time_s"],
                p["gen_tokens_per_sample"],
                p["wall_s"],
                f"{p['load_before'][0]}/{p['load_after'][0]}",
            ]
            for p in points
        ]
        out.append(
            (
                f"{axis} ({r['steps']} steps per point; other knobs at the embedded default)",
                [axis.split(".")[-1], "samples/s", "gen tok/s", "step s", "tokens/sample", "wall s", "load 1m"],
                rows,
            )
        )
    lin = r["max_new_tokens_fit"]
    out.append(
        (
            "step time vs max_new_tokens: least-squares line",
            ["intercept s", "slope ms/token", "R^2", "token share of step at max L"],
            [[lin["intercept_s"], lin["slope_s_per_token"] * 1000, lin["r2"], r["max_new_tokens_token_share"]]],
        )
    )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.scaling", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 2 points per axis, 3 steps each")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    p.add_argument("--repo", default=REPO, help="checkout whose training/main_async_ppo.py runs (default: this one)")
    args = p.parse_args(argv)
    axes = SHORT_AXES if args.short else FULL_AXES
    if args.short:
        args.steps = 3
    base = [f"exp_ctrl.benchmark_steps={args.steps}", "evaluation.n_prompts=0"]
    result = {"bench": "scaling", "steps": args.steps, "axes": {}}
    for axis, values in axes.items():
        result["axes"][axis] = []
        for v in values:
            trial = f"bench-scaling-{axis.split('.')[-1].replace('_', '-')}-{v}"
            log(f"scaling: {axis}={v}")
            point = run_training(trial, base + overrides_for(axis, v), args.timeout, args.repo)
            result["axes"][axis].append({"value": v, **point})
    mnt = result["axes"]["ppo.gen.max_new_tokens"]
    fit = linear_fit([p["value"] for p in mnt], [p["step_time_s"] for p in mnt])
    result["max_new_tokens_fit"] = {k: round(v, 5) for k, v in fit.items()}
    top = max(p["value"] for p in mnt)
    at_top = fit["intercept_s"] + fit["slope_s_per_token"] * top
    result["max_new_tokens_linearity_r2"] = round(fit["r2"], 4)
    result["max_new_tokens_token_share"] = round(fit["slope_s_per_token"] * top / at_top, 4) if at_top else 0.0

    def ratio(axis):
        pts = result["axes"][axis]
        return round(pts[-1]["samples_per_s"] / pts[0]["samples_per_s"], 3)

    result["rollout_workers_last_over_first_samples_per_s"] = ratio("rollout.n_workers")
    result["max_concurrent_rollouts_last_over_first_samples_per_s"] = ratio("max_concurrent_rollouts")
    result["group_size_last_over_first_samples_per_s"] = ratio("group_size")
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
