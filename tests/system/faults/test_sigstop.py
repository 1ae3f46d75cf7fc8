"""Issue 14 item 5: a worker paused by SIGSTOP. Paused for longer than its heartbeat TTL but
resumed within the launcher's grace, it is tolerated (its keep-alive puts the key back). Left
paused, a restartable worker is killed and restarted, and any other fails the trial naming the
worker and the pause. (Real launcher, dummy workers with keepalive_ttl=2 s.)"""

import os
import re
import signal
import time

from helpers.launcher_process import LauncherProcess


def _log(tmp_path, trial, name):
    return (tmp_path / "logs" / "dummies" / trial / f"{name}.log").read_text()


def _wait_log(tmp_path, trial, name, text, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in _log(tmp_path, trial, name):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never in {name}'s log:\n{_log(tmp_path, trial, name)}")


def test_a_pause_longer_than_the_ttl_but_within_the_grace_is_tolerated(tmp_path, no_leftover_processes):
    # TTL 2 s, heartbeat_grace 6 s: a 4 s pause expires the key; SIGCONT brings it back in time.
    la = LauncherProcess(
        [
            "-m",
            "helpers.launch_dummies",
            str(tmp_path),
            "pause",
            "2",
            "exit_after=10.0",
            "complete_trial=true",
            "launcher.heartbeat_grace=6",
        ]
    )
    pids = la.wait_ready()["pids"]
    os.kill(pids["dummy/1"], signal.SIGSTOP)
    time.sleep(4)
    os.kill(pids["dummy/1"], signal.SIGCONT)
    code, out = la.finish()
    assert code == 0 and "DONE" in out and "FAILED" not in out, out


def test_a_worker_left_paused_fails_the_trial_naming_it_and_the_pause(tmp_path, no_leftover_processes):
    la = LauncherProcess(["-m", "helpers.launch_dummies", str(tmp_path), "stopped", "2", "launcher.heartbeat_grace=1"])
    pids = la.wait_ready()["pids"]
    t0 = time.monotonic()
    os.kill(pids["dummy/1"], signal.SIGSTOP)
    code, out = la.finish()
    assert code == 1, out
    assert re.search(r"FAILED dummy/1: stopped heart-beating .* and is stopped \(SIGSTOP\?", out), out
    assert time.monotonic() - t0 < 30  # the paused process was stopped too (SIGCONT after SIGTERM)


def test_a_restartable_worker_left_paused_is_killed_and_restarted(tmp_path, no_leftover_processes):
    la = LauncherProcess(
        [
            "-m",
            "helpers.launch_dummies",
            str(tmp_path),
            "stopped-r",
            "2",
            "restart.max_restarts=1",
            "exit_after=15.0",
            "complete_trial=true",
            "launcher.heartbeat_grace=1",
        ]
    )
    pids = la.wait_ready()["pids"]
    os.kill(pids["dummy/1"], signal.SIGSTOP)
    _wait_log(tmp_path, "stopped-r", "dummy-1", "restart 1 of dummy/1")
    code, out = la.finish()
    assert code == 0 and "DONE" in out, out
    assert "is stopped (SIGSTOP?" in _log(tmp_path, "stopped-r", "dummy-1")
    assert '"dummy/1": 1' in out
