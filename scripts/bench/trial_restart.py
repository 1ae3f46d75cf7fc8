"""Time to heal: a vital process of a run SIGKILLed mid-run, the trial restarted by itself.

    python -m scripts.bench.trial_restart [--repeats 2] [--steps 16] [--kill-at 7] [--ckpt 4]
        [--victims model_worker-0,master_worker-0,redis-server] [OVERRIDE ...]

The embedded default (`default_run`, no evaluation) with a recovery checkpoint every `--ckpt`
steps; at step `--kill-at` one process is SIGKILLed — the trainer rank (model_worker/0), the
master, or the trial's redis-server — and the launcher restarts the trial from its last recovery
checkpoint (cluster.restart_policy.trial_restarts). More Hydra overrides (`cluster.device=cuda cluster.gpu_placement=shared` on a GPU) go to every
run. Per run:

  noticed s   from the kill to the launcher's "trial restart 1" line,
  healed s    from the kill to the first step trained after the resume (the run training again),
  steps lost  steps trained since the checkpoint it resumed from (trained again),
  exit        the run's exit code (0: it completed every step by itself).

With `--preempt`, the same run gets SIGTERM at step `--kill-at` instead (a scheduler's
preemption): *stopped s* is from the signal to the launcher's exit (75, a checkpoint of the step
written), *resumed s* from starting it again with `recover_mode=auto` to its first new step.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

import psutil

from realhf.base.trial_files import read_metrics
from scripts.bench.common import REPO, log
from scripts.bench.launchers import default_run

VICTIMS = ("model_worker-0", "master_worker-0", "redis-server")
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


def run_once(
    victim: str, repeat: int, steps: int, kill_at: int, ckpt: int, timeout: float, overrides: List[str]
) -> Dict:
    fileroot = tempfile.mkdtemp(prefix="bench-heal-")
    trial = f"heal-{victim.split('-')[0]}-{repeat}"
    log_dir = os.path.join(fileroot, "logs", "async-ppo", trial)
    out_path = os.path.join(fileroot, "out.txt")
    cmd = default_run(trial, fileroot, steps, f"exp_ctrl.ckpt_freq_steps={ckpt}", *overrides)
    try:
        with open(out_path, "w") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            t_kill = t_noticed = t_healed = None
            resumed = killed_at = None
            truncated = False
            deadline = time.monotonic() + timeout
            try:
                while proc.poll() is None and time.monotonic() < deadline:
                    n = len(read_metrics(log_dir)) if os.path.isdir(log_dir) else 0
                    if t_kill is None and n >= kill_at:
                        pid = _victim_pid(psutil.Process(proc.pid), victim)
                        if pid is not None:
                            os.kill(pid, signal.SIGKILL)
                            t_kill, killed_at = time.monotonic(), n
                    elif t_kill is not None and t_noticed is None:
                        m = re.search(r"trial restart 1 .*resuming after step (\d+)", open(out_path).read())
                        if m:
                            t_noticed, resumed = time.monotonic(), int(m.group(1))
                    elif t_noticed is not None and not truncated:
                        truncated = n <= resumed  # the resumed master cut metrics.jsonl to its checkpoint
                    elif truncated and t_healed is None and n > resumed:
                        t_healed = time.monotonic()
                    time.sleep(POLL_S)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if t_healed is None:
            raise RuntimeError(f"{trial}: did not heal (exit {proc.returncode}):\n{open(out_path).read()[-3000:]}")
        return {
            "victim": victim,
            "noticed_s": t_noticed - t_kill,
            "healed_s": t_healed - t_kill,
            "steps_lost": killed_at - resumed,
            "exit": proc.returncode,
            "steps": len(read_metrics(log_dir)),
        }
    finally:
        if os.environ.get("KEEP"):
            print(fileroot)
        else:
            shutil.rmtree(fileroot, ignore_errors=True)


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


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.trial_restart")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-at", type=int, default=7)
    ap.add_argument("--ckpt", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--preempt", action="store_true", help="SIGTERM the launcher instead, then resume it")
    ap.add_argument("--victims", default=",".join(VICTIMS), help="which processes to kill, comma-separated")
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
            row = run_once(victim, repeat, args.steps, args.kill_at, args.ckpt, args.timeout, args.overrides)
            log(
                f"{victim}: noticed {row['noticed_s']:.1f} s, healed {row['healed_s']:.1f} s, "
                f"{row['steps_lost']} step(s) trained again, exit {row['exit']}, {row['steps']} steps"
            )
            rows.append(row)
    print("| killed | noticed s (median) | healed s (median) | steps trained again | exits |")
    print("|---|---|---|---|---|")
    for victim in victims:
        mine = [r for r in rows if r["victim"] == victim]
        print(
            f"| {victim} | {statistics.median(r['noticed_s'] for r in mine):.1f} | "
            f"{statistics.median(r['healed_s'] for r in mine):.1f} | "
            f"{', '.join(str(r['steps_lost']) for r in mine)} | {', '.join(str(r['exit']) for r in mine)} |"
        )


if __name__ == "__main__":
    main()
