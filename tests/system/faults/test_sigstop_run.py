"""Issue 27 item 9: one process of each worker type paused with SIGSTOP in a real training run,
then resumed with SIGCONT.

The launcher judges a live process by its heartbeat key, which the process's own keep-alive
thread refreshes every TTL/3 s (`cluster.name_resolve.keepalive_ttl`); a paused process stops
refreshing it, so the key expires within TTL s of the pause, and once it has been gone for the
launcher's `heartbeat_grace` (5 s) the worker counts as hung. The pauses here are therefore
measured against TTL + grace, not the wall clock: TTL is set to 3 s so that the tests are quick,
and a pause of a minute has the outcome of any pause longer than TTL + grace (~8 s here, ~15 s
with the default TTL of 10 s) — the launcher acts at that point, and the SIGCONT that comes
later finds the process already killed.

- A short pause (longer than the TTL, so the key does expire, but resumed within the grace) of
  any worker type heals: the keep-alive puts the key back, nothing is restarted, the run
  finishes with exit 0 and every step.
- A long pause (past TTL + grace): a type that `cluster.restart_policy` restarts (by default the
  generation server, rollout worker and manager) is SIGKILLed and restarted, and the run finishes
  with exit 0, every step and every admitted group accounted for; any other type (by default the
  master and a trainer rank) ends the run with exit 1 within seconds, naming the worker and the
  pause ("worker master_worker/0 failed: stopped heart-beating … and is stopped (SIGSTOP? …)").

CI runs the short pauses (one run, each type in turn) and the master's long pause; the other long
pauses are slow tests.
"""

import os
import re
import signal
import time

import pytest
from redis.exceptions import RedisError

from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run, check_accounting
from realhf.api.cli_args import RestartPolicyConfig
from realhf.base import names

TTL = 3.0  # cluster.name_resolve.keepalive_ttl in these runs
GRACE = 5.0  # the launcher's heartbeat_grace (Supervisor's default)
FAST = [f"cluster.name_resolve.keepalive_ttl={TTL:g}", *SMALL_RUN]
SHORT_PAUSE = TTL + 2.0  # the key expires (after at most TTL s), and is back within the grace
LONG_PAUSE = TTL + GRACE + 12.0  # well past the point where the launcher acts


def _pause(run: Run, worker: str, seconds: float):
    """SIGSTOP `worker`, SIGCONT it `seconds` later (or as soon as the run ended). Returns the
    monotonic time of the SIGSTOP and whether its heartbeat key was seen gone meanwhile."""
    worker_type, index = worker.rsplit("-", 1)
    key = names.worker(EXPERIMENT, run.trial, worker_type, int(index))
    redis = run.redis()
    pid = run.worker_pid(worker)
    os.kill(pid, signal.SIGSTOP)
    t0, key_gone = time.monotonic(), False
    while time.monotonic() - t0 < seconds and run.proc.poll() is None:
        run.track()
        try:
            key_gone = key_gone or not redis.exists(key)
        except RedisError:  # the run ended: its Redis is gone
            pass
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # killed by the launcher meanwhile (and reaped)
        pass
    return t0, key_gone


WORKERS = ["rollout_worker-0", "generation_server-0", "gserver_manager-0", "model_worker-0", "master_worker-0"]


@pytest.mark.e2e
def test_a_short_pause_of_each_worker_type_heals(tmp_path, no_leftover_processes):
    steps = 40  # the five pauses take ≈ 16 steps (measured); the rest only ends the run
    run = Run(tmp_path, "pause-short", f"exp_ctrl.benchmark_steps={steps}", *FAST)
    timeline = []
    try:
        run.wait_steps(2, timeout=180)
        for worker in WORKERS:
            before = len(run.metrics())
            t0 = time.monotonic()
            _, key_gone = _pause(run, worker, SHORT_PAUSE)
            # The pause outlasted the TTL (the key expired): tolerated because it ended within the grace.
            assert key_gone, f"{worker}'s heartbeat key never expired during its {SHORT_PAUSE:g}s pause"
            run.wait_for(
                f"2 more train steps after {worker} was resumed",
                lambda before=before: len(run.metrics()) >= before + 2,
                120,
            )
            timeline.append(
                f"{worker}: paused at step {before}, step {len(run.metrics())} {time.monotonic() - t0:.1f}s later"
            )
        last_resumed_at = len(run.metrics())
        code = run.finish()
    finally:
        run.stop()
    out = run.output()
    print("\n".join(timeline))
    assert code == 0, out[-5000:]
    assert last_resumed_at < steps  # every pause was of a run still training
    assert [m["step"] for m in run.metrics()] == list(range(1, steps + 1)), out[-3000:]
    assert "workers restarted" not in out and "heart-beating" not in out, out[-3000:]
    check_accounting(tmp_path, out)
    assert run.leftovers() == []


# cluster.restart_policy's defaults: which types the launcher restarts.
RESTARTED = {
    t
    for t in ("generation_server", "rollout_worker", "gserver_manager", "model_worker", "master_worker")
    if getattr(RestartPolicyConfig(), t)
}


@pytest.mark.e2e
@pytest.mark.parametrize(
    "worker_type",
    [
        pytest.param("generation_server", marks=pytest.mark.slow),
        pytest.param("rollout_worker", marks=pytest.mark.slow),
        pytest.param("gserver_manager", marks=pytest.mark.slow),
        pytest.param("model_worker", marks=pytest.mark.slow),
        "master_worker",  # in CI: the quickest (~25 s) of the runs that must end loudly
    ],
)
def test_a_long_pause_restarts_the_worker_or_ends_the_run_naming_it(tmp_path, no_leftover_processes, worker_type):
    steps = 300
    worker = f"{worker_type}-0"
    # trial_restarts=0: a trainer or master paused past its timeout ends the run, naming it (with
    # whole-trial restarts the run would go on: faults/test_trial_restart.py).
    run = Run(
        tmp_path,
        f"pause-{worker_type}",
        f"exp_ctrl.benchmark_steps={steps}",
        *FAST,
        "cluster.restart_policy.trial_restarts=0",
    )
    try:
        run.wait_steps(2, timeout=180)
        t_stop, _ = _pause(run, worker, LONG_PAUSE)
        code = run.finish()
        t_end = time.monotonic()
    finally:
        run.stop()
    out = run.output()
    print(f"{worker_type}: exit {code}, {t_end - t_stop:.1f}s after the SIGSTOP")
    if worker_type in RESTARTED:
        assert code == 0, out[-5000:]
        assert [m["step"] for m in run.metrics()] == list(range(1, steps + 1)), out[-3000:]
        log = run.log(worker)
        assert re.search(
            rf"realhf launcher: restart 1 of {worker_type}/0 .*after: stopped heart-beating .* "
            r"and is stopped \(SIGSTOP\?",
            log,
        ), log[-3000:]
        assert f"'{worker_type}/0': 1" in out, out[-2000:]
        check_accounting(tmp_path, out)  # no admitted group lost to the pause or the restart
    else:
        assert code == 1, out[-5000:]
        assert re.search(
            rf"worker {worker_type}/0 failed: stopped heart-beating \(key \S+ gone for \d+s\) while "
            r"its process is still alive and is stopped \(SIGSTOP\?",
            out,
        ), out[-5000:]
        # The launcher acts TTL + grace after the pause, and stops everything within ~6 s.
        assert t_end - t_stop < TTL + GRACE + 20, out[-3000:]
    assert run.leftovers() == []
