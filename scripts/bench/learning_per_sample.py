"""Learning per sample in the long race: each system's training success over equal numbers of
samples, against what the warm start scores on the same prompts.

    python -m scripts.bench.learning_per_sample [--work-dir .bench/vs_trl_long-<sha>] [--seeds 1,2]
        [--window 3200] [--out docs/bench-runs/vs_trl_long-per-sample.json]

The held-out curves of a race are read every 90 s with a standard error of about 0.008 each, so
"samples to the target" is noisy. Training success is read on every sample trained, but it
depends on which prompts a run happened to draw (the warm start solves 0.94 of 1–2-pack problems
and none of 33–40), so each window of samples is set against the warm start's success rate on
the same prompts, from its rate per bucket of packs on the held-out split (scored here once and
cached in the work dir). `lift` = training success − that expectation: what the run has learned,
read at equal samples for every system.

Reads realhf's `trained_qids.jsonl` and `metrics.jsonl` (one line per train step) and TRL's
`trl-samples-<seed>.jsonl` (one line per reward call, written by the race since its seed 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from scripts.bench.common import REPO, log
from scripts.bench.long_task import BUCKETS, DATA, MODEL, ensure_data

SYSTEMS = ("realhf", "realhf_sync", "trl")


def _columns(per: Dict) -> List[str]:
    return [s for s in SYSTEMS if s in per] + sorted(s for s in per if s not in SYSTEMS)


def bucket_of(packs: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= packs <= hi:
            return f"{lo}-{hi}"
    raise ValueError(f"{packs} packs is outside every bucket {BUCKETS}")


def base_by_packs(work: str, threads: int = 2) -> Dict[str, float]:
    """The warm start's sampled success per bucket of packs (test split, 500 x 8 at T = 1)."""
    path = os.path.join(work, "base_by_packs.json")
    if os.path.isfile(path):
        return json.load(open(path))
    from scripts.bench.long_task import measure

    r = measure(MODEL, "test", 500, 8, 1.0, threads)
    table = {b["packs"]: b["success"] for b in r["by_packs"]}
    with open(path, "w") as f:
        json.dump(table, f)
    return table


def packs_by_qid(split: str = "train") -> Dict[str, int]:
    ensure_data()
    rows = (json.loads(line) for line in open(os.path.join(DATA, f"{split}.jsonl")) if line.strip())
    return {r["query_id"]: r["count"] for r in rows}


def realhf_steps(log_dir: str, packs: Dict[str, int], base: Dict[str, float]) -> List[Tuple[int, float, float]]:
    """(samples, mean success, the warm start's expected success) per train step."""
    qids = [json.loads(x) for x in open(os.path.join(log_dir, "trained_qids.jsonl"))]
    metrics = {m["step"]: m for m in map(json.loads, open(os.path.join(log_dir, "metrics.jsonl")))}
    out = []
    for q in qids:
        m = metrics.get(q["step"])
        if m is None:
            continue
        expected = [base[bucket_of(packs[x.split("@")[0]])] for x in q["qids"]]
        out.append((int(m["n_samples"]), float(m["success_rate"]), sum(expected) / len(expected)))
    return out


def trl_calls(sample_log: str, packs: Dict[str, int], base: Dict[str, float]) -> List[Tuple[int, float, float]]:
    """(samples, mean reward, expected success) per TRL reward call (one generation's rows)."""
    out = []
    for line in open(sample_log):
        c = json.loads(line)
        expected = [base[bucket_of(packs[q])] for q in c["query_id"]]
        out.append((len(c["reward"]), sum(c["reward"]) / len(c["reward"]), sum(expected) / len(expected)))
    return out


def windows(steps: Sequence[Tuple[int, float, float]], window: int) -> List[Dict]:
    """Sample-weighted means over consecutive windows of `window` samples (a step that straddles a
    border counts in the window it ends in)."""
    out, n, acc, exp, seen = [], 0, 0.0, 0.0, 0
    for k, success, expected in steps:
        n, acc, exp, seen = n + k, acc + k * success, exp + k * expected, seen + k
        if n >= window:
            out.append(
                {
                    "samples": seen,
                    "success": round(acc / n, 4),
                    "expected": round(exp / n, 4),
                    "lift": round((acc - exp) / n, 4),
                }
            )
            n, acc, exp = 0, 0.0, 0.0
    return out


def seed_runs(work: str, seed: int) -> Dict[str, Optional[str]]:
    logs = os.path.join(work, "logs", "async-ppo")
    found = {
        "realhf": os.path.join(logs, f"long-realhf-{seed}"),
        "realhf_sync": os.path.join(logs, f"long-realhf-sync-{seed}"),
        "trl": os.path.join(work, f"trl-samples-{seed}.jsonl"),
    }
    return {k: (v if os.path.exists(v) else None) for k, v in found.items()}


def analyse(work: str, seeds: Sequence[int], window: int, threads: int = 2) -> Dict:
    base, packs = base_by_packs(work, threads), packs_by_qid()
    res: Dict = {"window_samples": window, "base_by_packs": base, "seeds": {}}
    for seed in seeds:
        runs = seed_runs(work, seed)
        per = {}
        for system, path in runs.items():
            if path is None:
                continue
            steps = trl_calls(path, packs, base) if system == "trl" else realhf_steps(path, packs, base)
            per[system] = windows(steps, window)
        res["seeds"][str(seed)] = per
    return res


def table(res: Dict) -> str:
    lines = []
    for seed, per in res["seeds"].items():
        systems = _columns(per)
        lines.append(
            f"{'seed ' + seed if seed != 'runs' else 'runs'}: lift = training success - the warm start's on the same prompts"
        )
        lines.append("samples (k) | " + " | ".join(systems))
        rows = max(len(per[s]) for s in systems) if systems else 0
        for i in range(rows):
            cells = [
                f"{per[s][i]['lift']:+.3f} ({per[s][i]['success']:.3f})" if i < len(per[s]) else "-" for s in systems
            ]
            lines.append(f"{(i + 1) * res['window_samples'] / 1000:6.1f} | " + " | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.learning_per_sample", description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", default=None, help="the race's work dir (default: the newest .bench/vs_trl_long-*)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--window", type=int, default=3200, help="samples per window")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    ap.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="NAME=LOG_DIR",
        help="also read this realhf run's log dir (trained_qids.jsonl, metrics.jsonl), e.g. a probe outside the race",
    )
    args = ap.parse_args(argv)
    work = args.work_dir
    if work is None:
        bench = os.path.join(REPO, ".bench")
        found = sorted(
            (d for d in os.listdir(bench) if d.startswith("vs_trl_long-")),
            key=lambda d: os.path.getmtime(os.path.join(bench, d)),
        )
        if not found:
            raise SystemExit(f"{bench}: no vs_trl_long-* race to read; pass --work-dir")
        work = os.path.join(bench, found[-1])
    res = analyse(work, [int(s) for s in args.seeds.split(",")], args.window, args.threads)
    if args.run:
        base, packs = base_by_packs(work, args.threads), packs_by_qid()
        res["runs"] = {}
        for spec in args.run:
            name, _, log_dir = spec.partition("=")
            if not log_dir or not os.path.isfile(os.path.join(log_dir, "trained_qids.jsonl")):
                raise SystemExit(f"--run {spec}: expected NAME=LOG_DIR with a trained_qids.jsonl in LOG_DIR")
            res["runs"][name] = windows(realhf_steps(log_dir, packs, base), args.window)
        res["seeds"]["runs"] = res.pop("runs")
    print(table(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
