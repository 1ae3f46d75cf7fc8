"""Issue 27 item 4: one trial, one run. A second launch of a trial that is still running, even with
overwrite=true, is refused (exit 2) naming the live run's pid and host, and deletes nothing: the
live run keeps its files and keeps training. Once that run has ended, the trial can be
overwritten again (its lock is taken over)."""

import signal
import socket

import pytest

from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run, run_training
from realhf.base.trial_files import TrialFiles
from realhf.base.trial_lock import TrialLock


@pytest.mark.e2e
def test_a_running_trial_is_never_overwritten_and_can_be_once_it_has_ended(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "live", "exp_ctrl.benchmark_steps=1000", *SMALL_RUN)
    try:
        run.wait_steps(1)
        second, _, _ = run_training(
            tmp_path, "live", "overwrite=true", *SMALL_RUN, "exp_ctrl.benchmark_steps=2", timeout=120
        )
        steps_at_refusal = len(run.metrics())
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert (
            f"config error: this trial is already running: pid {run.proc.pid} on host {socket.gethostname()}"
            in second.stderr
        ), second.stderr[-2000:]
        assert "deleting the files" not in second.stdout
        # The live run's files are all there, and it goes on training.
        assert steps_at_refusal >= 1 and run.metrics()[0]["step"] == 1
        assert (run.log_dir / "configs" / "master_worker-0.yaml").is_file()
        run.wait_steps(steps_at_refusal + 1, timeout=60)
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(timeout=120)
    finally:
        run.stop()
    assert code == 75, run.output()[-3000:]  # Ctrl-C: a recovery checkpoint, then exit (resumable)
    assert run.leftovers() == []

    # The ended run's lock is free: the next launch takes it (its whole overwrite run: the unit
    # tests of realhf.base.trial_lock, and test_trial_files.py for overwrite=true itself).
    lock = TrialLock(TrialFiles(str(tmp_path), EXPERIMENT, "live").lock_path).acquire()
    lock.release()
