"""Issue 49, item 1: a stop is a checkpoint. SIGTERM to the launcher (what Slurm, Kubernetes and
Ray send before they kill a job) lets the master finish its step and write a recovery
checkpoint, every process stops and the launcher exits 75 ("resumable"); the next start with
recover_mode=auto trains the steps after it, no prompt group twice, with the group accounting
holding. A second signal stops at once, as before (exit 143: tests/system/faults/test_clean_exit.py)."""

import json
import signal
import time

import pytest

from helpers.prompt_order import trained_qids
from helpers.training_runs import SMALL_RUN, Run, check_accounting

STEPS, STOP_AT = 12, 4
# No periodic recovery checkpoint: the one the stop writes is the only one.
COMMON = [f"exp_ctrl.benchmark_steps={STEPS}", "exp_ctrl.ckpt_freq_steps=0", "exp_ctrl.ckpt_freq_secs=0", *SMALL_RUN]


@pytest.mark.e2e
def test_sigterm_checkpoints_exits_resumable_and_recover_auto_trains_the_rest_once(tmp_path, no_leftover_processes):
    trial = "preempt"
    first = Run(tmp_path, trial, *COMMON)
    try:
        first.wait_steps(STOP_AT, timeout=300)
        t0 = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)
        code = first.finish(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        first.stop()
    out = first.output()
    assert code == 75, out[-4000:]
    assert "run stopped (exit 75, resumable): launcher received SIGTERM; stopped after step" in out, out[-3000:]
    assert stopped_in < 30, stopped_in  # inside a scheduler's default grace before SIGKILL
    assert "did not exit within" not in out  # nothing needed SIGKILL
    assert first.leftovers() == []
    info = json.loads((tmp_path / "runs" / "async-ppo" / trial / "recover" / "recover_info.json").read_text())
    stopped_at = info["step"]
    assert STOP_AT <= stopped_at < STEPS, info
    assert f"stopped on SIGTERM after step {stopped_at}" in first.log("master_worker-0")
    assert [s["step"] for s in trained_qids(first.log_dir)] == list(range(1, stopped_at + 1))

    second = Run(tmp_path, trial, *COMMON, "recover_mode=auto")
    try:
        assert second.finish(timeout=400) == 0, second.output()[-5000:]
    finally:
        second.stop()
    assert f"after step {stopped_at}" in second.output()  # "resuming ... after step N"
    steps = trained_qids(second.log_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    trained = [q for s in steps for q in s["qids"]]
    assert len(trained) == len(set(trained)) == STEPS * 4, "a prompt group was trained twice"
    check_accounting(tmp_path, second.output())
