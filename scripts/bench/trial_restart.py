"""Time to heal: a process of a run SIGKILLed mid-run, the run healed by itself.

    python -m scripts.bench.trial_restart [--repeats 2] [--steps 16] [--kill-at 7] [--ckpt 4]
        [--victims model_worker-0,master_worker-0,redis-server] [OVERRIDE ...]
    python -m scripts.bench.trial_restart --victims generation_server-0,rollout_worker-0,gserver_manager-0

The embedded default (`default_run`, no evaluation) with a recovery checkpoint every `--ckpt`
steps; at step `--kill-at` one process is SIGKILLed — the trainer rank (model_worker/0), the
master, or the trial's redis-server — and the launcher restarts the trial from its last recovery
checkpoint (cluster.restart_policy.trial_restarts). More Hydra overrides (`cluster.device=cuda
cluster.gpu_placement=shared` on a GPU) go to every run. Per run:

  noticed s   from the kill to the launcher's "trial restart 1" line,
  healed s    from the kill to the first step trained after the resume (the run training again),
  steps lost  steps trained since the checkpoint it resumed from (trained again),
  exit        the run's exit code (0: it completed every step by itself).

A restartable worker — the generation server, a rollout worker, the manager — is restarted alone
while the rest of the run goes on (cluster.restart_policy). For these *noticed* is from the kill
to the launcher's "<worker> exited" line (the restart follows after `restart_policy.backoff`),
*healed* from the kill to the line saying the new incarnation is back at work (the server routed
again with the trainer's weights; the rollout worker's groups in flight settled; the manager
continuing from its admission ledger). Nothing is trained again, so instead of *steps lost* the
row gives the longest wait for a step from the kill on (the median wait before the kill beside it).

With `--preempt`, the same run gets SIGTERM at step `--kill-at` instead (a scheduler's
preemption): *stopped s* is from the signal to the launcher's exit (75, a checkpoint of the step
written), *resumed s* from starting it again with `recover_mode=auto` to its first new step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

import psutil

from realhf.base.trial_files import read_metrics
from scripts.bench.common import REPO, log
from scripts.bench.launchers import default_run

TRIAL_VICTIMS = ("model_worker-0", "master_worker-0", "redis-server")
# Each restartable worker's sign that its new incarnation is back at work, in its log (or the manager's).
BACK_AT_WORK = {
    "generation_server-0": ("gserver_manager-0", r"generation server \S+ (caught up with|routed at weight version)"),
    "rollout_worker-0": ("rollout_worker-0", r"restarted: previous incarnation left"),
    "gserver_manager-0": ("gserver_manager-0", r"restarted \(start \d+ of this run\)"),
}
VICTIMS = TRIAL_VICTIMS + tuple(BACK_AT_WORK)
POLL_S = 0.05


def _victim_pid(root: psutil.Process, victim: str) -> Optional[int]:
    for p in root.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if (victim == "redis-server" and "redis-server" in cmd) or f"configs/{victim}.yaml" in cmd:
            return p.pid
    return None


@dataclass
class HealRun:
    """A run of the embedded default started in its own fileroot, its output in `out_path`."""

    trial: str
    log_dir: str
    out_path: str
    proc: subprocess.Popen

    def steps(self) -> int:
        return len(read_metrics(self.log_dir)) if os.path.isdir(self.log_dir) else 0

    def fail(self, victim: str, t_kill: Optional[float], kill_at: int, timeout: float, awaited: str) -> None:
        """Raises, naming what the run did not reach: the step to kill at, or the sign of healing."""
        state = "still running" if self.proc.poll() is None else f"exit {self.proc.returncode}"
        what = f"step {kill_at} to kill {victim} at" if t_kill is None else awaited
        raise RuntimeError(
            f"{self.trial}: no {what} within {timeout:.0f} s ({self.steps()} steps trained, {state}):\n"
            + open(self.out_path).read()[-3000:]
        )


@contextlib.contextmanager
def heal_run(victim: str, repeat: int, steps: int, overrides: List[str]) -> Iterator[HealRun]:
    """Starts the run; on leaving, kills what is left of it and removes its fileroot (kept and
    printed with KEEP=1)."""
    fileroot = tempfile.mkdtemp(prefix="bench-heal-")
    trial = f"heal-{victim.split('-')[0]}-{repeat}"
    out_path = os.path.join(fileroot, "out.txt")
    try:
        with open(out_path, "w") as out:
            proc = subprocess.Popen(
                default_run(trial, fileroot, steps, *overrides),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                yield HealRun(trial, os.path.join(fileroot, "logs", "async-ppo", trial), out_path, proc)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        if os.environ.get("KEEP"):
            print(fileroot)
        else:
            shutil.rmtree(fileroot, ignore_errors=True)


def run_once(
    victim: str, repeat: int, steps: int, kill_at: int, ckpt: int, timeout: float, overrides: List[str]
) -> Dict:
    """One run with a vital process SIGKILLed once `kill_at` steps are trained; the trial restarts."""
    with heal_run(victim, repeat, steps, [f"exp_ctrl.ckpt_freq_steps={ckpt}", *overrides]) as run:
        t_kill = t_noticed = t_healed = None
        resumed = killed_at = None
        truncated = False
        deadline = time.monotonic() + timeout
        while run.proc.poll() is None and time.monotonic() < deadline:
            n = run.steps()
            if t_kill is None and n >= kill_at:
                pid = _victim_pid(psutil.Process(run.proc.pid), victim)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    t_kill, killed_at = time.monotonic(), n
            elif t_kill is not None and t_noticed is None:
                m = re.search(r"trial restart 1 .*resuming after step (\d+)", open(run.out_path).read())
                if m:
                    t_noticed, resumed = time.monotonic(), int(m.group(1))
            elif t_noticed is not None and not truncated:
                truncated = n <= resumed  # the resumed master cut metrics.jsonl to its checkpoint
            elif truncated and t_healed is None and n > resumed:
                t_healed = time.monotonic()
            time.sleep(POLL_S)
        if t_healed is None:
            run.fail(victim, t_kill, kill_at, timeout, "the first step trained after the resume")
        steps_done = run.steps()
    return {
        "victim": victim,
        "noticed_s": t_noticed - t_kill,
        "healed_s": t_healed - t_kill,
        "steps_lost": killed_at - resumed,
        "exit": run.proc.returncode,  # the run ended, or was killed at the deadline, on leaving heal_run
        "steps": steps_done,
    }


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _found_after(path: str, offset: int, pattern: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return re.search(pattern, f.read().decode(errors="replace")) is not None
    except OSError:
        return False


def worker_once(victim: str, repeat: int, steps: int, kill_at: int, timeout: float, overrides: List[str]) -> Dict:
    """One run with a restartable worker SIGKILLed once `kill_at` steps are trained; the run goes on."""
    watched, back_at_work = BACK_AT_WORK[victim]
    died = "/".join(victim.rsplit("-", 1)) + " exited with code"  # the launcher's name: "<type>/<index>"
    with heal_run(victim, repeat, steps, overrides) as run:
        watched_log = os.path.join(run.log_dir, f"{watched}.log")
        t_kill = t_noticed = t_healed = None
        out_at = log_at = 0
        step_times: List[float] = []
        deadline = time.monotonic() + timeout
        while run.proc.poll() is None and time.monotonic() < deadline:
            n = run.steps()
            step_times += [time.monotonic()] * (n - len(step_times))
            if t_kill is None and n >= kill_at:
                pid = _victim_pid(psutil.Process(run.proc.pid), victim)
                if pid is not None:
                    out_at, log_at = _file_size(run.out_path), _file_size(watched_log)
                    os.kill(pid, signal.SIGKILL)
                    t_kill = time.monotonic()
            elif t_kill is not None and t_noticed is None:
                if _found_after(run.out_path, out_at, re.escape(died)):
                    t_noticed = time.monotonic()
            if t_noticed is not None and t_healed is None and _found_after(watched_log, log_at, back_at_work):
                t_healed = time.monotonic()
            time.sleep(POLL_S)
        if t_healed is None:
            run.fail(victim, t_kill, kill_at, timeout, f"/{back_at_work}/ in {watched_log} after the kill")
        steps_done = run.steps()
    gaps = [b - a for a, b in zip(step_times, step_times[1:])]
    before = [g for g, b in zip(gaps, step_times[1:]) if b < t_kill]
    after = [g for g, b in zip(gaps, step_times[1:]) if b > t_kill]
    return {
        "victim": victim,
        "noticed_s": t_noticed - t_kill,
        "healed_s": t_healed - t_kill,
        "gap_before_s": statistics.median(before) if before else float("nan"),
        "gap_after_s": max(after) if after else float("nan"),
        "exit": run.proc.returncode,
        "steps": steps_done,
    }


def preempt_once(repeat: int, steps: int, kill_at: int, timeout: float, overrides: List[str]) -> Dict:
    fileroot = tempfile.mkdtemp(prefix="bench-preempt-")
    trial = f"preempt-{repeat}"
    log_dir = os.path.join(fileroot, "logs", "async-ppo", trial)
    try:
        with open(os.path.join(fileroot, "out1.txt"), "w") as out:
            proc = subprocess.Popen(
                default_run(trial, fileroot, steps, *overrides), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + timeout
            while proc.poll() is None and len(read_metrics(log_dir) if os.path.isdir(log_dir) else []) < kill_at:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"{trial}: no step {kill_at} within {timeout:.0f} s")
                time.sleep(POLL_S)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
            stopped = time.monotonic() - t0
        at = len(read_metrics(log_dir))
        with open(os.path.join(fileroot, "out2.txt"), "w") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                default_run(trial, fileroot, steps, "recover_mode=auto", *overrides),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            resumed = None
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                if resumed is None and len(read_metrics(log_dir)) > at:
                    resumed = time.monotonic() - t0
                time.sleep(POLL_S)
            code2 = proc.wait(timeout=timeout)
        return {
            "stopped_s": stopped,
            "exit": code,
            "at_step": at,
            "resumed_s": resumed,
            "exit2": code2,
            "steps": len(read_metrics(log_dir)),
        }
    finally:
        shutil.rmtree(fileroot, ignore_errors=True)


def _print_table(
    title: str, extra: List[str], victims: List[str], rows: List[Dict], extra_cells: Callable[[List[Dict]], List[str]]
) -> None:
    """A markdown row per victim: the medians of noticed and healed, `extra_cells` of its runs, the exits."""
    if not victims:
        return
    head = [title, "noticed s (median)", "healed s (median)", *extra, "exits"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for victim in victims:
        mine = [r for r in rows if r["victim"] == victim]
        cells = [
            victim,
            format(statistics.median(r["noticed_s"] for r in mine), ".1f"),
            format(statistics.median(r["healed_s"] for r in mine), ".1f"),
            *extra_cells(mine),
            ", ".join(str(r["exit"]) for r in mine),
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.trial_restart")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-at", type=int, default=7)
    ap.add_argument("--ckpt", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--preempt", action="store_true", help="SIGTERM the launcher instead, then resume it")
    ap.add_argument("--victims", default=",".join(TRIAL_VICTIMS), help="which processes to kill, comma-separated")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args(argv)
    victims = args.victims.split(",")
    unknown = sorted(set(victims) - set(VICTIMS))
    if unknown:
        ap.error(f"--victims: {', '.join(unknown)} not among {', '.join(VICTIMS)}")
    if args.preempt:
        for repeat in range(args.repeats):
            row = preempt_once(repeat, args.steps, args.kill_at, args.timeout, args.overrides)
            print(
                f"SIGTERM at step {row['at_step']}: stopped in {row['stopped_s']:.1f} s (exit {row['exit']}); "
                f"recover_mode=auto trained its first step {row['resumed_s']:.1f} s after its start "
                f"(exit {row['exit2']}, {row['steps']} steps)"
            )
        return
    rows = []
    for repeat in range(args.repeats):
        for victim in victims:
            if victim in BACK_AT_WORK:
                row = worker_once(victim, repeat, args.steps, args.kill_at, args.timeout, args.overrides)
                log(
                    f"{victim}: noticed {row['noticed_s']:.1f} s, healed {row['healed_s']:.1f} s, longest wait "
                    f"for a step {row['gap_after_s']:.1f} s (median {row['gap_before_s']:.1f} s before the kill), "
                    f"exit {row['exit']}, {row['steps']} steps"
                )
            else:
                row = run_once(victim, repeat, args.steps, args.kill_at, args.ckpt, args.timeout, args.overrides)
                log(
                    f"{victim}: noticed {row['noticed_s']:.1f} s, healed {row['healed_s']:.1f} s, "
                    f"{row['steps_lost']} step(s) trained again, exit {row['exit']}, {row['steps']} steps"
                )
            rows.append(row)
    _print_table(
        "killed",
        ["steps trained again"],
        [v for v in victims if v not in BACK_AT_WORK],
        rows,
        lambda mine: [", ".join(str(r["steps_lost"]) for r in mine)],
    )
    _print_table(
        "killed (restarted alone)",
        ["longest wait for a step s", "median step s before"],
        [v for v in victims if v in BACK_AT_WORK],
        rows,
        lambda mine: [
            ", ".join(format(r["gap_after_s"], ".1f") for r in mine),
            format(statistics.median(r["gap_before_s"] for r in mine), ".1f"),
        ],
    )


if __name__ == "__main__":
    main()
