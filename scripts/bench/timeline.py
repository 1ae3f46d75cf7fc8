"""Where the time goes, as a picture: one minute of each system on the long-reasoning task, which
process keeps which core busy, and when.

    python -m scripts.bench.timeline [--short] [--window 60] [--warmup-steps 5] [--out docs/timeline-long.png]
                                     [--traces docs/bench-runs/timeline-long.json] [--redraw TRACES]

Three runs one after another, each measured for `--window` seconds once it has taken
`--warmup-steps` steps: realhf (training/configs/async-ppo-long.yaml), realhf synchronous
(the race protocol's `sync_overrides`) and TRL's GRPOTrainer with the race's
algorithm (scripts/bench/race.py reads it off the same config). Every 0.1 s each process's CPU
time (psutil) is read; a lane shows the cores it used (0..2 on this machine). For realhf one lane
per role (generation server, trainer, rollout workers, the rest: master, manager, Redis); TRL is
one process, so its lane is shaded by what it was doing (its driver's `--phase-log`): sampling,
scoring (rewards, old and reference log-probs), training. Samples/s are those of the steps that
ended inside the window. Writes the PNG and prints per-lane busy fractions and the JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from scripts.bench.common import PYTHON, REPO, emit, log, print_tables

CONFIG = "async-ppo-long"
PERIOD_S = 0.1
LANES = ("generation server", "trainer", "rollout workers", "master, manager, redis")
TRL_LANE = "TRL (one process)"
PHASE_COLORS = {"generate": "#f4a261", "score": "#e9c46a", "train": "#2a9d8f"}


def role_of(cmdline: str) -> str:
    """The lane of a realhf process, from its command line."""
    if "generation_server-" in cmdline:
        return LANES[0]
    if "model_worker-" in cmdline:
        return LANES[1]
    if "rollout_worker-" in cmdline:
        return LANES[2]
    return LANES[3]  # the launcher, master, manager, redis-server


def sample_cpu(root_pid: int, window_s: float, lane_of, steps_done=None) -> Tuple[Dict[str, List[float]], List[float]]:
    """Cores used per lane in each PERIOD_S of `window_s`, summed over the process tree of
    `root_pid`; and the seconds into the window at which `steps_done()` (a step count) grew."""
    import psutil

    root = psutil.Process(root_pid)
    last: Dict[int, float] = {}
    lanes: Dict[str, List[float]] = {}
    procs: Dict[int, psutil.Process] = {}
    t_prev = start = time.monotonic()
    step_ends: List[float] = []
    n_steps = steps_done() if steps_done else 0
    n = int(round(window_s / PERIOD_S))
    for i in range(n + 1):
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.Error:
            break
        now = time.monotonic()
        used: Dict[str, float] = {lane: 0.0 for lane in lanes}
        for p in tree:
            try:
                procs.setdefault(p.pid, p)
                c = p.cpu_times()
                cpu = c.user + c.system
                lane = lane_of(" ".join(p.cmdline()))
            except psutil.Error:
                continue
            if p.pid in last and i > 0:
                used[lane] = used.get(lane, 0.0) + max(0.0, cpu - last[p.pid]) / (now - t_prev)
            last[p.pid] = cpu
        if i > 0:
            for lane, v in used.items():
                lanes.setdefault(lane, [0.0] * (i - 1)).append(round(v, 3))
            for series in lanes.values():  # a lane first seen late starts at zero
                series.extend([0.0] * (i - len(series)))
        if steps_done:
            k = steps_done()
            step_ends += [round(now - start, 2)] * (k - n_steps)
            n_steps = k
        t_prev = now
        time.sleep(max(0.0, PERIOD_S - (time.monotonic() - now)))
    return lanes, step_ends


def _stop(proc: subprocess.Popen, sig=signal.SIGINT, timeout: float = 60.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timeline: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.5)


def run_realhf(work: str, overrides: Sequence[str], window_s: float, warmup_steps: int, name: str) -> Dict:
    from realhf.base.trial_files import TrialFiles, read_metrics

    trial = f"timeline-{name}"
    cmd = [PYTHON, "training/main_async_ppo.py", f"--config-name={CONFIG}", f"trial_name={trial}"]
    cmd += [f"cluster.fileroot={work}", "exp_ctrl.benchmark_steps=100000", "evaluation.n_prompts=0", *overrides]
    files = TrialFiles(work, "async-ppo-long", trial)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: len(read_metrics(files.log_dir)) >= warmup_steps, 600, f"{warmup_steps} steps of {name}")
        t0 = time.time()
        lanes, ends = sample_cpu(proc.pid, window_s, role_of, lambda: len(read_metrics(files.log_dir)))
        t1 = time.time()
        metrics = read_metrics(files.log_dir)
    finally:
        _stop(proc)
    per_step = metrics[-1]["n_samples"] if metrics else 0
    return {"lanes": lanes, "t0": t0, "window_s": t1 - t0, "step_ends": ends,
            "samples_per_s": round(len(ends) * per_step / (t1 - t0), 2)}  # fmt: skip


def run_trl(work: str, window_s: float, warmup_steps: int, setting: Dict) -> Dict:
    from scripts.bench import vs_trl_long
    from scripts.bench.peer_trl import DRIVER, ensure_venv
    from scripts.bench.race import trl_driver_args

    p = vs_trl_long.load_protocol()
    phases = Path(work, "trl_phases.jsonl")
    cmd = [ensure_venv(), DRIVER, "--out-dir", os.path.join(work, "trl"), "--budget-s", "100000"]
    cmd += ["--threads", str(setting["threads"]), "--groups", str(setting["groups"])]
    cmd += ["--minibatches", str(setting["minibatches"]), "--save-steps", "0", "--phase-log", str(phases)]
    cmd += ["--continuous-batching"] if setting.get("continuous_batching") else []
    cmd += trl_driver_args(vs_trl_long.realhf_config(p))
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "OMP_NUM_THREADS": str(setting["threads"]),
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )

    def events() -> List[Dict]:
        return [json.loads(x) for x in phases.read_text().splitlines()] if phases.is_file() else []

    try:
        _wait_for(lambda: sum(e["phase"] == "step" for e in events()) >= warmup_steps, 900, f"{warmup_steps} TRL steps")
        t0 = time.time()
        lanes, _ = sample_cpu(proc.pid, window_s, lambda cmdline: TRL_LANE)
        t1 = time.time()
    finally:
        _stop(proc, signal.SIGTERM)
    spans = phase_spans(events(), t0, t1)
    steps = [e for e in events() if e["phase"] == "step" and t0 <= e.get("end", t1 + 1) <= t1]
    per_step = setting["groups"] * 8 // setting["minibatches"]
    return {"lanes": lanes, "t0": t0, "window_s": t1 - t0, "phases": spans,
            "samples_per_s": round(len(steps) * per_step / (t1 - t0), 2)}  # fmt: skip


def phase_spans(events: List[Dict], t0: float, t1: float) -> List[Dict]:
    """The driver's phase log as spans in seconds from t0 that overlap [t0, t1]: a phase begun
    and never ended (the run was stopped in it) ends at t1."""
    ends = {(e["phase"], e["start"]): e["end"] for e in events if "end" in e}
    spans = []
    for e in events:
        if "end" in e:
            continue
        end = ends.get((e["phase"], e["start"]), t1)
        if end >= t0 and e["start"] <= t1:
            spans.append({"phase": e["phase"], "start": round(e["start"] - t0, 2), "end": round(end - t0, 2)})
    return spans


def phase_at(spans: List[Dict], t: float) -> str:
    """What TRL was doing at `t`: sampling inside `generate`, scoring in the rest of `score`,
    training in the rest of a step."""
    inside = {s["phase"] for s in spans if s["start"] <= t < s["end"]}
    return "generate" if "generate" in inside else "score" if "score" in inside else "train"


def busy_fractions(lanes: Dict[str, List[float]], threshold: float = 0.2) -> Dict[str, Dict[str, float]]:
    """Per lane: the share of samples with at least `threshold` of a core in use, and the mean cores."""
    return {
        lane: {"busy": round(sum(v >= threshold for v in xs) / len(xs), 3), "mean_cores": round(sum(xs) / len(xs), 3)}
        for lane, xs in lanes.items()
        if xs
    }


def trl_phase_shares(spans: List[Dict], window_s: float) -> Dict[str, float]:
    """Seconds of the window TRL spent sampling, scoring (beyond sampling) and training (the rest of a step)."""

    def total(name: str) -> float:
        return sum(max(0.0, min(s["end"], window_s) - max(s["start"], 0.0)) for s in spans if s["phase"] == name)

    gen, score, step = total("generate"), total("score"), total("step")
    return {"generate": round(gen / window_s, 3), "score": round((score - gen) / window_s, 3),
            "train": round((step - score) / window_s, 3)}  # fmt: skip


def draw(result: Dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, result["runs"][k]) for k in ("realhf", "realhf_sync", "trl") if k in result["runs"]]
    n_lanes = sum(len(r["lanes"]) for _, r in panels)
    fig, axes = plt.subplots(n_lanes, 1, figsize=(11, 0.95 * n_lanes + 1.6), sharex=True)
    axes = list(axes) if n_lanes > 1 else [axes]
    titles = {"realhf": "realhf (asynchronous)", "realhf_sync": "realhf, synchronous mode", "trl": "TRL GRPOTrainer"}
    i = 0
    for name, r in panels:
        for j, (lane, xs) in enumerate(sorted(r["lanes"].items(), key=lambda kv: (LANES + (TRL_LANE,)).index(kv[0]))):
            ax = axes[i]
            t = [k * PERIOD_S for k in range(len(xs))]
            if r.get("phases"):  # TRL's one lane, coloured by what it was doing
                phase = [phase_at(r["phases"], x) for x in t]
                for name_, color in PHASE_COLORS.items():
                    mask = [ph == name_ for ph in phase]
                    ax.fill_between(t, xs, where=mask, step="post", color=color, lw=0, label=name_)
                ax.legend(loc="lower left", fontsize=7, ncol=3)
            else:
                ax.fill_between(t, xs, step="post", color="#2a9d8f", alpha=0.85, lw=0)
            ax.set_ylim(0, 2.05)
            ax.set_yticks([0, 1, 2])
            ax.set_ylabel(lane, rotation=0, ha="right", va="center", fontsize=8)
            for x in r.get("step_ends", []):
                ax.axvline(x, color="#264653", lw=0.6, alpha=0.6)
            if j == 0:
                ax.set_title(f"{titles[name]}: {r['samples_per_s']} samples/s in this minute", fontsize=9, loc="left")
            i += 1
    axes[-1].set_xlabel("seconds (cores in use per process; dark lines: the trainer published a version)")
    fig.suptitle(f"one minute of each system on the long-reasoning task ({result['host']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def tables(r: Dict):
    rows = []
    for name, run in r["runs"].items():
        for lane, b in run["busy"].items():
            rows.append([name, lane, b["busy"], b["mean_cores"]])
    phases = [[k, v] for k, v in r["runs"].get("trl", {}).get("phase_shares", {}).items()]
    out = [
        (
            f"one {r['window_s']:.0f}-s window per system: share of 0.1-s samples a lane used >= 0.2 core, and mean cores",
            ["system", "lane", "busy", "mean cores"],
            rows,
        ),
        (
            "samples/s inside the window",
            ["system", "samples/s"],
            [[k, v["samples_per_s"]] for k, v in r["runs"].items()],
        ),
    ]
    if phases:
        out.append(("TRL's window by phase (share of wall time)", ["phase", "share"], phases))
    return out


def measure(window: float, warm: int, trl_setting: Dict) -> Dict:
    """The three runs' windows, traces and shares."""
    from scripts.bench.long_task import ensure_data

    ensure_data()
    runs: Dict[str, Dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_timeline_") as work:
        # realhf's synchronous mode as the race declares it (protocol_vs_trl_long.yaml).
        from scripts.bench.vs_trl_long import load_protocol

        sync = tuple(load_protocol().realhf["sync_overrides"])
        for name, overrides in (("realhf", ()), ("realhf_sync", sync)):
            log(f"timeline: {name}, {window:.0f} s after {warm} steps")
            runs[name] = run_realhf(work, overrides, window, warm, name)
        log(f"timeline: TRL, {window:.0f} s after {warm} steps")
        runs["trl"] = run_trl(work, window, warm, trl_setting)
    for r in runs.values():
        r["busy"] = busy_fractions(r["lanes"])
    runs["trl"]["phase_shares"] = trl_phase_shares(runs["trl"]["phases"], runs["trl"]["window_s"])
    return {"bench": "timeline", "window_s": window, "trl_setting": trl_setting, "runs": runs}


def main(argv=None) -> int:
    from scripts.bench.common import cpu_flags, cpu_model

    ap = argparse.ArgumentParser(prog="python -m scripts.bench.timeline", description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--warmup-steps", type=int, default=5)
    # The race's sweep winner on this machine (scripts/bench/protocol_vs_trl_long.yaml).
    ap.add_argument("--trl-setting", default='{"threads": 2, "groups": 8, "minibatches": 1}', help="JSON")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "timeline-long.png"))
    ap.add_argument("--short", action="store_true", help="10-s windows after 2 steps (a smoke test)")
    ap.add_argument("--traces", default="", help="also write the per-lane traces (JSON) here, to redraw from")
    ap.add_argument("--redraw", default="", help="draw --out from traces written by --traces; run nothing")
    args = ap.parse_args(argv)
    window, warm = (10.0, 2) if args.short else (args.window, args.warmup_steps)
    if args.redraw:
        with open(args.redraw) as f:
            res = json.load(f)
    else:
        res = measure(window, warm, json.loads(args.trl_setting))
        res["host"] = f"{cpu_model()} ({cpu_flags()})"
    if args.traces:
        with open(args.traces, "w") as f:
            json.dump(res, f)
    draw(res, args.out)
    log(f"wrote {args.out}")
    summary = {**res, "png": os.path.relpath(args.out, REPO)}
    summary["runs"] = {k: {x: v for x, v in r.items() if x != "lanes"} for k, r in res["runs"].items()}
    print_tables(tables(summary))
    emit(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
