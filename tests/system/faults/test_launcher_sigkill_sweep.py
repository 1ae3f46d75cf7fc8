"""Issue 14 item 7: SIGKILL of the launcher leaves no process of the trial alive, grandchildren
included — one that ignores SIGTERM and is re-parented when its worker dies, and one that also
left the worker's session (setsid) — swept by the launcher's watchdog (realhf/scheduler/watchdog.py)."""

import re
import time

import psutil

from helpers.launcher_process import LauncherProcess
from helpers.launcher_process import alive as _alive


def _grandchildren(log_path):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [int(pid) for pid in re.findall(r"stubborn grandchild pid (\d+)", log_path.read_text())]
        if len(found) == 2:
            return found
        time.sleep(0.1)
    raise AssertionError(f"the dummy never started its grandchildren:\n{log_path.read_text()}")


def test_sigkill_of_the_launcher_leaves_no_grandchild_alive(tmp_path):
    la = LauncherProcess(["-m", "helpers.launch_dummies", str(tmp_path), "sweep", "2", "stubborn_grandchildren=true"])
    info = la.wait_ready()
    stubborn = _grandchildren(tmp_path / "logs" / "dummies" / "sweep" / "dummy-0.log")
    everything = list(info["pids"].values()) + [info["redis"]] + stubborn
    try:
        assert _alive(stubborn) == stubborn
        la.proc.kill()
        la.finish()
        deadline = time.monotonic() + 10
        while _alive(everything) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(everything) == [], [(pid, psutil.Process(pid).cmdline()) for pid in _alive(everything)]
    finally:
        for pid in _alive(everything):
            psutil.Process(pid).kill()


def test_a_normal_stop_also_sweeps_grandchildren_that_left_the_workers_session(tmp_path, no_leftover_processes):
    # The launcher's own teardown finds descendants through its workers; the setsid'd grandchild
    # is found that way too while its parent lives, and by the watchdog's marker sweep after.
    la = LauncherProcess(
        [
            "-m",
            "helpers.launch_dummies",
            str(tmp_path),
            "normal",
            "2",
            "stubborn_grandchildren=true",
            "exit_after=3.0",
            "complete_trial=true",
        ]
    )
    info = la.wait_ready()
    stubborn = _grandchildren(tmp_path / "logs" / "dummies" / "normal" / "dummy-0.log")
    try:
        code, out = la.finish()
        assert code == 0 and "DONE" in out, out
        assert _alive(list(info["pids"].values()) + stubborn) == []
    finally:
        for pid in _alive(stubborn):
            psutil.Process(pid).kill()
