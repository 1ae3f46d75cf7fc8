"""Drive training/main_async_ppo.py as a subprocess, the way a user runs it, and look at what it left."""

import os
import subprocess
import sys

import psutil

from realhf.base.trial_files import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def trial_processes(marker: str):
    """(pid, cmdline) of every realhf process whose command line contains `marker` (e.g. tmp_path)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if "realhf" in cmd and marker in cmd:
            found.append((p.pid, cmd))
    return found


def training_command(tmp_path, trial, *overrides):
    return [sys.executable, "training/main_async_ppo.py", f"trial_name={trial}", f"cluster.fileroot={tmp_path}",
            *overrides]


def run_training(tmp_path, trial, *overrides, timeout=900, env=None):
    """Run to the end; returns (CompletedProcess, metrics.jsonl rows, the trial's log dir)."""
    proc = subprocess.run(training_command(tmp_path, trial, *overrides), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)
    log_dir = tmp_path / "logs" / "async-ppo-math" / trial
    return proc, read_metrics(log_dir), log_dir
