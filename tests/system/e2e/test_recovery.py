"""Recovery on the real system: a trainer rank killed mid-run (DP=2, FSDP2 over gloo) stops
everything; rerunning the trial with recover_mode=auto resumes after the last (sharded) recovery
checkpoint and finishes the run."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from helpers.paths import REPO
from helpers.training_runs import run_training, training_command, trial_log_dir, trial_processes
from realhf.base.trial_files import read_metrics

STEPS, CKPT, ETA, B = 12, 4, 1, 8
COMMON = [
    f"exp_ctrl.benchmark_steps={STEPS}",
    f"exp_ctrl.ckpt_freq_steps={CKPT}",
    f"max_head_offpolicyness={ETA}",
    f"groups_per_step={B}",
    "max_concurrent_rollouts=16",
    "evaluation.n_prompts=0",
    "allocation_mode=native.d1m1p1+d2m1p1",
    "cluster.restart_policy.trial_restarts=0",  # recovered by hand here (faults/test_trial_restart.py: by itself)
]


def _worker_pid(tmp_path, config_name):
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(tmp_path) in cmd and config_name in cmd:
            return p.pid
    return None


@pytest.mark.e2e
def test_killed_trainer_stops_the_run_and_auto_recovery_resumes_after_the_checkpoint(tmp_path, no_leftover_processes):
    trial = "rec"
    log_dir = trial_log_dir(tmp_path, trial)
    proc = subprocess.Popen(
        training_command(tmp_path, trial, *COMMON),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not any(m["step"] >= CKPT + 2 for m in read_metrics(log_dir)):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the first run did not reach the step to kill at"
            time.sleep(0.2)
        pid = _worker_pid(tmp_path, "model_worker-1.yaml")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The trainer's death ends the run: named, non-zero, nothing left behind.
    assert proc.returncode == 1, out[-3000:]
    assert "model_worker/1" in out
    assert trial_processes(str(tmp_path)) == []
    killed_at = max(m["step"] for m in read_metrics(log_dir))
    recover = tmp_path / "runs" / "async-ppo" / trial / "recover"
    info = json.loads((recover / "recover_info.json").read_text())
    assert info["dp_size"] == 2 and info["roles"] == ["actor"]
    assert sorted(p.name for p in (recover / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]
    assert len(list((recover / "actor").glob("*.distcp"))) == 2  # one shard file per rank
    assert info["version"] == info["step"] and info["version"] % CKPT == 0 and CKPT <= info["version"] <= killed_at
    assert info["training_samples"] == info["step"] * B
    # rollout.n_workers=0 (the default): two rollout workers per DP rank, each one's prompt order saved.
    assert info["rollout_workers"] == 4 and set(info["rollout_samplers"]) == {"0", "1", "2", "3"}

    proc2, metrics, _ = run_training(tmp_path, trial, *COMMON, "recover_mode=auto")
    out2 = proc2.stdout + proc2.stderr
    assert proc2.returncode == 0, out2[-5000:]
    assert f"after step {info['version']} (version {info['version']})" in out2
    # Every step exactly once (the ones after the checkpoint were run again, their old lines
    # replaced), the version continues from the checkpoint, and the bound held throughout.
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert [m["version"] for m in metrics] == list(range(1, STEPS + 1))
    assert max(m["head_offpolicyness_max"] for m in metrics) <= ETA
    # Admission resumed from the checkpoint's counters: had it started from zero, it would admit
    # (η + v + 1)·B groups at once and the trainer would drop the surplus as stale.
    assert metrics[-1]["stale_dropped"] <= B, metrics[-1]
    for i in range(4):
        log = (log_dir / f"rollout_worker-{i}.log").read_text()
        pos = info["rollout_samplers"][str(i)]["position"]
        assert f"prompt order resumed at epoch 0, position {pos}" in log
    assert trial_processes(str(tmp_path)) == []


def test_resume_without_a_checkpoint_fails_before_starting_anything(tmp_path):
    proc, metrics, _ = run_training(tmp_path, "none", "recover_mode=resume", "evaluation.n_prompts=0", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "recover_mode=resume but there is no recovery checkpoint" in proc.stderr
    assert metrics == [] and trial_processes(str(tmp_path)) == []
