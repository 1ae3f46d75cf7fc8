"""Launchers: the same training run with `cluster.launcher=local` vs `cluster.launcher=ray`.

    python -m scripts.bench.launchers [--short] [--steps 60] [--repeats 2] [--timeout 900]

Each run is `training/main_async_ppo.py` as a subprocess on the embedded default (every default
of `training/configs/async-ppo.yaml` except `evaluation.n_prompts=0` and the step count), in its
own fresh temporary fileroot; the ray run adds `cluster.launcher=ray` and, without
`cluster.ray.address`, starts (and stops) a Ray cluster of its own. Per run:

  samples/s   steady-state throughput from the run's `metrics.jsonl` (`e2e.summarize`: the steps
              after the first),
  start-up s  wall-clock seconds from starting the subprocess until `metrics.jsonl` has its first
              row, minus that row's step_time_s: the time before the first step began (launcher,
              Redis, servers, workers, model loading),
  wall s      the whole subprocess, shutdown included.

Runs alternate (local, ray, ray, local, ...) so a drift of the machine's load cancels out of the
medians: ray / local samples/s is the median of the pairs' ratios, ray - local start-up the
median of the pairs' differences. The load average is recorded before and after each run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from realhf.base.trial_files import read_metrics
from scripts.bench.common import PYTHON, REPO, emit, load_average, log, print_tables
from scripts.bench.e2e import summarize

LAUNCHERS = {"local": (), "ray": ("cluster.launcher=ray",)}
POLL_S = 0.1  # how often the first metrics row is looked for


def _metrics_now(log_dir: str) -> List[dict]:
    """The rows written so far ([] also while the first line is half written)."""
    try:
        return read_metrics(log_dir)
    except ValueError:
        return []


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """End a run that overran: SIGTERM (its own orderly shutdown, which also stops its Ray cluster),
    then SIGKILL its process group (the launcher's watchdog sweeps what is left)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait(30)


def default_run(trial: str, fileroot: str, steps: int, *overrides: str) -> List[str]:
    """The command of `steps` steps of the embedded default, without evaluation, in `fileroot`."""
    return [
        PYTHON,
        "training/main_async_ppo.py",
        f"trial_name={trial}",
        f"cluster.fileroot={fileroot}",
        "evaluation.n_prompts=0",
        f"exp_ctrl.benchmark_steps={steps}",
        *overrides,
    ]


def run_once(name: str, repeat: int, steps: int, timeout: float) -> Dict:
    """One training run with launcher `name`; returns its figures (raises, naming the run and with
    the tail of its output, on failure or timeout)."""
    label = f"{name} #{repeat + 1}"
    trial = f"bench-launcher-{name}-{repeat}"
    fileroot = tempfile.mkdtemp(prefix=f"bench_launchers_{name}_")
    log_dir = os.path.join(fileroot, "logs", "async-ppo", trial)
    out_path = os.path.join(fileroot, "bench_output.txt")  # outside logs/, removed with the fileroot
    cmd = default_run(trial, fileroot, steps, *LAUNCHERS[name])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    load_before = load_average()
    try:
        with open(out_path, "w") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            first_row_at: Optional[float] = None
            try:
                while proc.poll() is None:
                    if time.monotonic() - t0 > timeout:
                        _stop(proc)
                        raise RuntimeError(
                            f"launchers run {label} ({' '.join(cmd)}) timed out after {timeout:.0f} s "
                            f"({'no' if first_row_at is None else 'some'} train step done); "
                            f"output tail:\n{_tail(out_path)}"
                        )
                    if first_row_at is None and _metrics_now(log_dir):
                        first_row_at = time.monotonic()
                    time.sleep(POLL_S)
            except BaseException:
                _stop(proc)
                raise
            wall = time.monotonic() - t0
        metrics = read_metrics(log_dir)
        if proc.returncode != 0 or len(metrics) < steps:
            raise RuntimeError(
                f"launchers run {label} ({' '.join(cmd)}) exited with {proc.returncode} after "
                f"{len(metrics)}/{steps} steps; output tail:\n{_tail(out_path)}"
            )
        if first_row_at is None:  # the whole run fitted between two polls: no start-up figure
            first_row_at = t0 + wall
        first_step = metrics[0]["step_time_s"]
        s = summarize(metrics)
        res = {
            "steps": s["steps"],
            "samples_per_s": s["samples_per_s"],
            "gen_tokens_per_s": s["gen_tokens_per_s"],
            "step_time_s": s["step_time_s"],
            "first_step_s": round(first_step, 2),
            "startup_s": round(first_row_at - t0 - first_step, 1),
            "first_row_s": round(first_row_at - t0, 1),
            "wall_s": round(wall, 1),
            "load_before": load_before,
            "load_after": load_average(),
        }
        log(
            f"{label}: {res['samples_per_s']:.1f} samples/s, start-up {res['startup_s']:.1f} s, "
            f"wall {res['wall_s']:.0f} s"
        )
        return res
    finally:
        shutil.rmtree(fileroot, ignore_errors=True)


def tables(r):
    rows = [
        [
            f"{x['run']} #{x['repeat'] + 1}",
            x["steps"],
            x["samples_per_s"],
            x["gen_tokens_per_s"],
            x["step_time_s"],
            x["startup_s"],
            x["first_step_s"],
            x["wall_s"],
            f"{x['load_before'][0]}/{x['load_after'][0]}",
        ]
        for x in r["runs"]
    ]
    ratios = ", ".join(f"{v:.2f}" for v in r["pair_ratios"])
    diffs = ", ".join(f"{v:+.1f}" for v in r["pair_startup_diffs_s"])
    walls = ", ".join(f"{v:+.1f}" for v in r["pair_wall_diffs_s"])
    rows.append(
        [f"ray / local (median of pairs {ratios})", "", r["ray_over_local_samples_per_s"], "", "", "", "", "", ""]
    )
    rows.append(
        [
            f"ray - local (median of pairs {diffs}; wall {walls})",
            "",
            "",
            "",
            "",
            r["ray_minus_local_startup_s"],
            "",
            r["ray_minus_local_wall_s"],
            "",
        ]
    )
    return [
        (
            f"launchers: embedded default (evaluation.n_prompts=0), {r['steps']} steps per run, "
            "cluster.launcher=local vs ray (own Ray cluster per run); runs alternate local/ray; samples/s over the "
            "steps after the first; start-up: seconds from starting the process until the first metrics row, minus "
            "that step's time",
            ["run", "steps", "samples/s", "gen tok/s", "step s", "start-up s", "first step s", "wall s", "load 1m"],
            rows,
        )
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.launchers", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 1 pair of 15 steps")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="local/ray pairs, alternating which goes first; ratios are medians over pairs",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    args = p.parse_args(argv)
    if args.short:
        args.steps, args.repeats = 15, 1
    res = {
        "bench": "launchers",
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": [],
        "pair_ratios": [],
        "pair_startup_diffs_s": [],
        "pair_wall_diffs_s": [],
    }
    for i in range(args.repeats):
        executed = ["local", "ray"] if i % 2 == 0 else ["ray", "local"]
        pair = {name: run_once(name, i, args.steps, args.timeout) for name in executed}
        res["runs"].extend({"run": name, "repeat": i, **pair[name]} for name in executed)
        res["pair_ratios"].append(round(pair["ray"]["samples_per_s"] / pair["local"]["samples_per_s"], 3))
        res["pair_startup_diffs_s"].append(round(pair["ray"]["startup_s"] - pair["local"]["startup_s"], 1))
        res["pair_wall_diffs_s"].append(round(pair["ray"]["wall_s"] - pair["local"]["wall_s"], 1))
    for name in LAUNCHERS:
        runs = [r for r in res["runs"] if r["run"] == name]
        res[name] = {
            k: round(statistics.fmean(r[k] for r in runs), 3)
            for k in ("samples_per_s", "gen_tokens_per_s", "startup_s", "first_step_s", "wall_s")
        }
    res["ray_over_local_samples_per_s"] = round(statistics.median(res["pair_ratios"]), 3)
    res["ray_minus_local_startup_s"] = round(statistics.median(res["pair_startup_diffs_s"]), 1)
    res["ray_minus_local_wall_s"] = round(statistics.median(res["pair_wall_diffs_s"]), 1)
    print_tables(tables(res))
    print(
        f"ray / local samples/s: {res['ray_over_local_samples_per_s']:.2f}x; start-up ray - local: "
        f"{res['ray_minus_local_startup_s']:+.1f} s (local {res['local']['startup_s']:.1f} s, "
        f"ray {res['ray']['startup_s']:.1f} s)"
    )
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
