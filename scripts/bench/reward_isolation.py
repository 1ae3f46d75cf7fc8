"""Reward functions that never return, in processes (killed at the timeout) vs threads (abandoned).

    python -m scripts.bench.reward_isolation [--short] [--steps 20] [--timeout 900]

Runs of the embedded default (`evaluation.n_prompts=0`), graded by a reward function
(`rollout.env.type=none`, `rollout.agent.reward_fn=scripts.bench.reward_fns:…`), each with
`rollout.agent.reward_isolation=process` and `=thread`:

  clean     grades every answer;
  spin 3%   spins the CPU forever on 3% of the prompts (reward_timeout=15 s);
  sleep 30% sleeps forever on 30% of the prompts (reward_timeout=5 s).

Per run: samples/s over the steps after the first (`e2e.summarize`), wall seconds, the groups
that ended `reward_timed_out` (accounting.json) and whether it finished. Then the cost of one
call of a trivial reward function through a reward process against a reward thread (median of
`--calls` calls, one at a time). Runs alternate process/thread per kind.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from realhf.base.trial_files import read_metrics
from scripts.bench.common import REPO, emit, load_average, log, print_tables
from scripts.bench.e2e import summarize
from scripts.bench.launchers import _stop, _tail, default_run

KINDS = {
    "clean": ("grade", 15),
    "spin 3%": ("spins_on_3_percent", 15),
    "sleep 30%": ("sleeps_on_30_percent", 5),
}
ISOLATIONS = ("process", "thread")


def run_once(kind: str, isolation: str, steps: int, timeout: float) -> Dict:
    fn, reward_timeout = KINDS[kind]
    trial = f"bench-reward-{fn}-{isolation}".replace("_", "-")
    fileroot = tempfile.mkdtemp(prefix="bench_reward_isolation_")
    log_dir = os.path.join(fileroot, "logs", "async-ppo", trial)
    out_path = os.path.join(fileroot, "bench_output.txt")
    cmd = default_run(
        trial,
        fileroot,
        steps,
        "rollout.env.type=none",
        f"rollout.agent.reward_fn=scripts.bench.reward_fns:{fn}",
        f"rollout.agent.reward_timeout={reward_timeout}",
        f"rollout.agent.reward_isolation={isolation}",
    )
    load_before = load_average()
    t0 = time.monotonic()
    try:
        with open(out_path, "w") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _stop(proc)
            except BaseException:
                _stop(proc)
                raise
        wall = time.monotonic() - t0
        try:
            metrics = read_metrics(log_dir)
        except (OSError, ValueError):
            metrics = []
        accounting = [
            json.load(open(p)) for p in glob.glob(os.path.join(fileroot, "**", "accounting.json"), recursive=True)
        ]
        ended = accounting[0]["ended"] if accounting else {}
        finished = proc.returncode == 0 and len(metrics) >= steps
        s = summarize(metrics) if metrics else {"samples_per_s": 0.0, "steps": 0}
        res = {
            "kind": kind,
            "isolation": isolation,
            "finished": finished,
            "exit": proc.returncode,
            "steps": s["steps"],
            "samples_per_s": s["samples_per_s"],
            "wall_s": round(wall, 1),
            "reward_timed_out": ended.get("reward_timed_out", 0),
            "failed": ended.get("failed", 0),
            "load_before": load_before,
            "load_after": load_average(),
        }
        if not finished:
            res["tail"] = _tail(out_path, 1500)
        log(
            f"{kind} / {isolation}: {'finished' if finished else 'DID NOT FINISH'} {s['steps']}/{steps} steps, "
            f"{res['samples_per_s']:.2f} samples/s, wall {res['wall_s']:.0f} s, "
            f"{res['reward_timed_out']} groups reward_timed_out"
        )
        return res
    finally:
        shutil.rmtree(fileroot, ignore_errors=True)


def call_cost(calls: int) -> Dict[str, float]:
    """Median seconds of one call of a trivial reward function, one call at a time."""
    from realhf.base.daemon_threads import DaemonThreads
    from realhf.plugins.agents.math_single_step import call_reward_fn
    from realhf.plugins.agents.reward_processes import RewardProcesses
    from scripts.bench.reward_fns import grade

    row = {"query_id": "q", "prompt": "Q", "solutions": ["#### 7"]}
    name = "scripts.bench.reward_fns:grade"
    processes, threads = RewardProcesses(name, 1, nice=0), DaemonThreads(1, name="reward")

    async def timed(**where) -> float:
        await call_reward_fn(grade, row, " #### 7", timeout=30, name=name, **where)  # warm: start the process
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await call_reward_fn(grade, row, " #### 7", timeout=30, name=name, **where)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    try:
        return {
            "process_ms": round(asyncio.run(timed(processes=processes)) * 1e3, 3),
            "thread_ms": round(asyncio.run(timed(threads=threads)) * 1e3, 3),
        }
    finally:
        processes.close()


def tables(r):
    rows = [
        [
            x["kind"],
            x["isolation"],
            "yes" if x["finished"] else f"no (exit {x['exit']})",
            x["steps"],
            x["samples_per_s"],
            x["wall_s"],
            x["reward_timed_out"],
            f"{x['load_before'][0]}/{x['load_after'][0]}",
        ]
        for x in r["runs"]
    ]
    out = [
        (
            f"reward_isolation: embedded default, {r['steps']} steps, graded by a reward function that never returns "
            "on some prompts (spin 3%: reward_timeout=15 s, sleep 30%: 5 s); samples/s over the steps after the first",
            ["kind", "isolation", "finished", "steps", "samples/s", "wall s", "groups reward_timed_out", "load 1m"],
            rows,
        )
    ]
    c = r.get("call_cost")
    if c:
        out.append(
            (
                f"reward_isolation: one call of a trivial reward function (median of {r['calls']} calls)",
                ["process ms", "thread ms"],
                [[c["process_ms"], c["thread_ms"]]],
            )
        )
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.reward_isolation", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="4 steps, process isolation only, 200 calls")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is stopped")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    p.add_argument("--isolations", default=",".join(ISOLATIONS), help="comma-separated, of: process, thread")
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args(argv)
    steps, calls = (4, 200) if a.short else (a.steps, a.calls)
    isolations = ("process",) if a.short else tuple(a.isolations.split(","))
    runs: List[Dict] = []
    for kind in a.kinds.split(","):
        for isolation in isolations:
            runs.append(run_once(kind, isolation, steps, a.timeout))
    result = {"bench": "reward_isolation", "steps": steps, "runs": runs, "calls": calls, "call_cost": call_cost(calls)}
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
