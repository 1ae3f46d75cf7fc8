"""Issue 6, bullets 1 and 4: Ctrl-C, or the death of a worker that is not restarted (master,
model worker) with whole-trial restarts off (cluster.restart_policy.trial_restarts=0; on, the
trial heals: test_trial_restart.py), stops the whole run: every process it started is gone (redis-server included),
the exit status is non-zero and one line says why (naming the failed worker, with its log tail).
A signal first asks for a recovery checkpoint (cluster.stop_grace; tests/system/faults/test_preemption.py),
then exits 75; a second one stops at once, exiting 128 + the signal."""

import os
import signal

import pytest

from helpers.training_runs import SMALL_RUN, Run


def _interrupted_run_stops_everything(tmp_path, trial, interrupt, code_expected, said, *overrides, **run_kw):
    run = Run(tmp_path, trial, "exp_ctrl.benchmark_steps=1000", *SMALL_RUN, *overrides, **run_kw)
    try:
        run.wait_steps(1)
        interrupt(run)
        code = run.finish(timeout=120)
    finally:
        run.stop()
    out = run.output()
    assert code == code_expected, out[-4000:]
    assert said in out, out[-3000:]
    assert run.leftovers() == []


@pytest.mark.e2e
def test_ctrl_c_checkpoints_stops_every_process_including_redis_and_exits_75(tmp_path, no_leftover_processes):
    def ctrl_c(run):
        assert any("redis-server" in cmd for cmd, _ in run.seen.values()), run.seen
        # Ctrl-C in a terminal: SIGINT to the foreground process group (the entry point and
        # redis-server; the workers run in sessions of their own and are stopped by the launcher).
        os.killpg(run.proc.pid, signal.SIGINT)

    said = "run stopped (exit 75, resumable): launcher received SIGINT; stopped after step"
    _interrupted_run_stops_everything(tmp_path, "sigint", ctrl_c, 75, said, own_process_group=True)


@pytest.mark.e2e
def test_a_second_sigterm_stops_every_process_at_once_and_exits_143(tmp_path, no_leftover_processes):
    # What a process manager (systemd, a batch scheduler) sends, to the entry point only; a second
    # one (an impatient operator, a scheduler's escalation) does not wait for the checkpoint.
    # The master is frozen first (SIGSTOP: a master stuck mid-step, why an operator signals twice),
    # so its checkpoint never comes and the run cannot end the graceful way before the second
    # signal: a fixed 0.3 s gap lost that race once, to a master that stopped in 0.3 s.
    def twice(run):
        os.kill(run.worker_pid("master_worker-0"), signal.SIGSTOP)
        run.proc.send_signal(signal.SIGTERM)
        # A second signal before the launcher's handler ran for the first would be merged into it.
        run.wait_for(
            "the launcher to take the first SIGTERM", lambda: "launcher received SIGTERM" in run.output(), 30, 0.05
        )
        run.proc.send_signal(signal.SIGTERM)

    said = "run interrupted (exit 143): launcher received SIGTERM"
    _interrupted_run_stops_everything(tmp_path, "sigterm", twice, 143, said)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_the_evaluation_before_training_ends_the_run_in_one_line(tmp_path, sig, no_leftover_processes):
    # The first seconds of the README's command: no launcher watches yet, and the evaluation has
    # episodes in flight on the grader's process pool. Ctrl-C goes to the whole process group (the
    # pool too), SIGTERM to the entry point only, as a process manager sends it.
    overrides = [o for o in SMALL_RUN if not o.startswith("evaluation.n_prompts=")]  # the default's 500
    run = Run(tmp_path, "eval-" + sig.name, *overrides, own_process_group=True)
    try:
        run.wait_for("the evaluation's engine", lambda: "evaluation: static_kv runner" in run.output(), 120, 0.05)
        run.track()  # the grader's pool among what must be gone
        (os.killpg if sig == signal.SIGINT else os.kill)(run.proc.pid, sig)
        code = run.finish(timeout=60)
    finally:
        run.stop()
    out = run.output()
    assert code == 128 + sig, out[-4000:]
    assert f"run interrupted (exit {128 + sig}): {sig.name} during the evaluation before training" in out, out[-3000:]
    # One line, not a traceback, nor asyncio's word for each episode destroyed while pending.
    # "Exception in callback": asyncio dropped the interruption and the run went on (RunInterrupted).
    assert all(w not in out for w in ("Traceback", "Task was destroyed", "Exception in callback")), out[-4000:]
    assert run.leftovers() == []


def _killed_worker_stops_the_run(tmp_path, trial, worker, name):
    run = Run(tmp_path, trial, "exp_ctrl.benchmark_steps=1000", *SMALL_RUN, "cluster.restart_policy.trial_restarts=0")
    try:
        run.wait_steps(2)
        run.kill_worker(worker)
        code = run.finish(timeout=180)
    finally:
        run.stop()
    out = run.output()
    assert code == 1, out[-4000:]
    assert f"run failed (exit 1): worker {name} exited with code -9 (SIGKILL)" in out, out[-3000:]
    assert f"worker {name} failed" in out and "last 30 lines of" in out  # the log tail is printed
    assert "restart 1" not in run.log(worker)  # not restarted by default
    assert run.leftovers() == []


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkilled_model_worker_stops_the_run_cleanly_naming_it(tmp_path, no_leftover_processes):
    _killed_worker_stops_the_run(tmp_path, "mwkill", "model_worker-0", "model_worker/0")


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkilled_master_stops_the_run_cleanly_naming_it(tmp_path, no_leftover_processes):
    _killed_worker_stops_the_run(tmp_path, "masterkill", "master_worker-0", "master_worker/0")
