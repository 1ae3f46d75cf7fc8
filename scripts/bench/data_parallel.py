"""The trainer's data parallelism: samples/s and tokens per rank at DP=1, 2 and 3, side by side.

    python -m scripts.bench.data_parallel [--short] [--steps 40] [--repeats 2]

Each point is a `training/main_async_ppo.py` run of the embedded default (evaluation off) with
`allocation_mode=native.d1m1p1+d<N>m1p1`, the same batch at every N (groups_per_step 12, which
1, 2 and 3 divide; 3 rollout workers, so every DP rank has its own) and nothing else changed.
Throughput excludes the first step (`scripts.bench.e2e.summarize`). Token balance, from the
run's metrics: tokens per rank max/mean as the groups arrived at the ranks (`before`) and after
the master's re-split (realhf.system.master.dp_balance), and the share of tokens that moved. The points
of a repeat run one after another, rotating which DP size goes first, and the load average is
recorded per run: on a shared two-core machine the ratios in one repeat are what to trust.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from scripts.bench.common import REPO, emit, log, print_tables
from scripts.bench.e2e import run_training

DP_SIZES = (1, 2, 3)
BASE = ["evaluation.n_prompts=0", "groups_per_step=12", "rollout.n_workers=3"]


def tables(r):
    rows = []
    for dp in DP_SIZES:
        for p in r["runs"][str(dp)]:
            rows.append(
                [
                    dp,
                    p["repeat"],
                    p["samples_per_s"],
                    p["train_per_step_s"],
                    p["wait_per_step_s"],
                    p["dp_token_imbalance_before"],
                    p["dp_token_imbalance"],
                    p["dp_tokens_moved_fraction"],
                    p["final_success_rate"],
                    p["wall_s"],
                    f"{p['load_before'][0]}/{p['load_after'][0]}",
                ]
            )
    medians = [[dp, r["median_samples_per_s"][str(dp)], r["samples_per_s_over_dp1"][str(dp)]] for dp in DP_SIZES]
    return [
        (
            f"DP size ({r['steps']} steps per run, B = 12 groups x 8; embedded default otherwise)",
            [
                "DP",
                "repeat",
                "samples/s",
                "train s/step",
                "wait s/step",
                "imbalance before",
                "imbalance after",
                "tokens moved",
                "success (last 10)",
                "wall s",
                "load 1m",
            ],
            rows,
        ),
        ("median over repeats", ["DP", "samples/s", "vs DP=1"], medians),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.data_parallel", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 3 steps per run, one repeat")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per run")
    p.add_argument("--repo", default=REPO, help="checkout whose training/main_async_ppo.py runs (default: this one)")
    args = p.parse_args(argv)
    if args.short:
        args.steps, args.repeats = 3, 1
    result = {
        "bench": "data_parallel",
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": {str(dp): [] for dp in DP_SIZES},
    }
    for repeat in range(args.repeats):
        order = DP_SIZES[repeat % len(DP_SIZES) :] + DP_SIZES[: repeat % len(DP_SIZES)]
        for dp in order:
            log(f"data_parallel: DP={dp}, repeat {repeat + 1}/{args.repeats}")
            overrides = BASE + [f"exp_ctrl.benchmark_steps={args.steps}", f"allocation_mode=native.d1m1p1+d{dp}m1p1"]
            point = run_training(f"bench-dp{dp}-{repeat}", overrides, args.timeout, args.repo)
            point.pop("_curve", None)
            result["runs"][str(dp)].append({"repeat": repeat + 1, **point})
    result["median_samples_per_s"] = {
        str(dp): round(statistics.median(p["samples_per_s"] for p in result["runs"][str(dp)]), 2) for dp in DP_SIZES
    }
    base = result["median_samples_per_s"]["1"]
    result["samples_per_s_over_dp1"] = {
        str(dp): round(result["median_samples_per_s"][str(dp)] / base, 3) if base else 0.0 for dp in DP_SIZES
    }
    result["token_imbalance"] = {
        str(dp): {
            k: round(statistics.mean(p[k] for p in result["runs"][str(dp)]), 4)
            for k in ("dp_token_imbalance_before", "dp_token_imbalance", "dp_tokens_moved_fraction")
        }
        for dp in DP_SIZES
    }
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
