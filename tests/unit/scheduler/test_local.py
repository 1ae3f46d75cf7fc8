"""The local launcher on real processes: failures are named, nothing outlives it."""

import glob
import os
import signal
import tempfile
import time

import psutil
import pytest

from helpers.dummy_worker import DummyWorkerConfig
from helpers.launcher_process import LauncherProcess
from helpers.launcher_process import alive as _alive
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve
from realhf.scheduler.local import LauncherInterrupted, LocalLauncher, WorkerSpec

pytestmark = pytest.mark.system


class Launcher(LauncherProcess):
    """`python -m helpers.launch_dummies` in its own process."""

    def __init__(self, tmp_path, trial, n, *overrides):
        super().__init__(["-m", "helpers.launch_dummies", str(tmp_path), trial, str(n), *overrides])

    def all_pids(self, info):
        return list(info["pids"].values()) + [info["redis"]]


def test_workers_that_finish_normally_end_the_trial_with_success(tmp_path, no_leftover_processes):
    la = Launcher(tmp_path, "ok", 3, "exit_after=1.0", "complete_trial=true")
    info = la.wait_ready()
    code, out = la.finish()
    assert code == 0, out
    assert "DONE" in out
    assert _alive(la.all_pids(info)) == []


def test_a_slow_exit_after_the_trial_completed_is_not_a_failure(tmp_path, no_leftover_processes):
    # Worker 0 completes the trial after 4 s, later than the launcher's 3 s startup timeout, then
    # deregisters and takes 3 s more to exit, longer than the 1 s heartbeat grace: leaving slowly
    # at the end of a run (a loaded machine, torch teardown) is neither a hang nor a startup failure.
    la = Launcher(
        tmp_path,
        "slow",
        2,
        "exit_after=4.0",
        "complete_trial=true",
        "linger_after_exit=3.0",
        "launcher.startup_timeout=3",
        "launcher.heartbeat_grace=1",
    )
    info = la.wait_ready()
    code, out = la.finish()
    assert code == 0, out
    assert "DONE" in out and "FAILED" not in out
    assert _alive(la.all_pids(info)) == []


def test_sigkilled_worker_is_named_with_its_log_tail_and_nothing_survives(tmp_path, no_leftover_processes):
    la = Launcher(tmp_path, "kill", 3, "spawn_grandchild=true")
    info = la.wait_ready()
    grandchildren = [c.pid for c in psutil.Process(info["pids"]["dummy/0"]).children(recursive=True)]
    assert grandchildren, "the dummy should have started a grandchild"
    victim = info["pids"]["dummy/1"]
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code, out = la.finish()
    assert code == 1, out
    assert "FAILED dummy/1: exited with code -9 (SIGKILL)" in out
    assert "last 30 lines of" in out and "dummy-1.log" in out
    assert time.monotonic() - t0 < 20  # everything stopped within the launcher's 10 s + start-up slack
    assert _alive(la.all_pids(info) + grandchildren) == []


def test_crashing_worker_fails_the_trial_with_its_exit_code(tmp_path, no_leftover_processes):
    la = Launcher(tmp_path, "crash", 2, "exit_after=0.5", "exit_code=3")
    info = la.wait_ready()
    code, out = la.finish()
    assert code == 1 and "FAILED dummy/0: exited with code 3" in out, out
    assert "crashing on purpose" in out  # the log tail shows what the worker said last
    assert _alive(la.all_pids(info)) == []


def test_sigint_to_the_launcher_stops_every_worker_and_redis(tmp_path, no_leftover_processes):
    la = Launcher(tmp_path, "sigint", 3, "spawn_grandchild=true")
    info = la.wait_ready()
    grandchildren = [c.pid for c in psutil.Process(info["pids"]["dummy/0"]).children(recursive=True)]
    la.proc.send_signal(signal.SIGINT)
    code, out = la.finish()
    assert code == 130 and "INTERRUPTED" in out, out
    assert _alive(la.all_pids(info) + grandchildren) == []


def test_sigkill_of_the_launcher_takes_its_workers_down_too(tmp_path):
    redis_dirs = set(glob.glob(os.path.join(tempfile.gettempdir(), "realhf-redis-*")))
    la = Launcher(tmp_path, "sigkill", 2)
    info = la.wait_ready()
    la.proc.kill()
    la.finish()
    deadline = time.monotonic() + 10
    while _alive(la.all_pids(info)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(la.all_pids(info)) == []  # PR_SET_PDEATHSIG
    # Nothing was left in the temporary directory: Redis worked in the trial's log directory.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "realhf-redis-*"))) <= redis_dirs


def test_worker_that_stops_heart_beating_without_exiting_is_detected(tmp_path, no_leftover_processes):
    # The key expires within the TTL (2 s) of the hang; a 1 s grace ends the wait for it to return.
    la = Launcher(tmp_path, "hang", 3, "hang_after=1.0", "launcher.heartbeat_grace=1")
    info = la.wait_ready()
    code, out = la.finish(timeout=60)
    assert code == 1, out
    assert "FAILED dummy/0: stopped heart-beating" in out
    assert _alive(la.all_pids(info)) == []


@pytest.mark.parametrize("caught_by", ["the redis call", "a broad except inside it"])
def test_a_signal_that_lands_inside_a_redis_call_still_interrupts(
    tmp_path, monkeypatch, caught_by, no_leftover_processes
):
    # SIGINT's exception is raised wherever the main thread happens to be; inside a Redis call it
    # was once reported as "Redis unreachable" (exit 1, not 130), and a library that catches
    # broadly could swallow it altogether.
    launcher = LocalLauncher(
        "dummies", "signal-in-call", str(tmp_path), NameResolveConfig(keepalive_ttl=2.0), startup_timeout=60
    )
    launcher.start()
    try:
        launcher.submit(WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class="helpers.dummy_worker:DummyWorker"))
        real_find = name_resolve.find_subtree

        def find_while_a_signal_arrives(root):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here
            except Exception:
                if caught_by == "the redis call":
                    raise
            return real_find(root)

        monkeypatch.setattr(name_resolve, "find_subtree", find_while_a_signal_arrives)
        with pytest.raises(LauncherInterrupted):
            launcher.wait(timeout=60)
    finally:
        launcher.stop_all()
