"""The launcher's restart policy on real processes (dummy workers): a restartable worker that
dies is started again with the same index and config, its log marked; past `max_restarts` its
death fails the trial like any other, naming the worker and the restarts."""

import json
import os
import signal

import psutil
import pytest

from helpers.launcher_process import LauncherProcess

pytestmark = pytest.mark.system


class Launcher(LauncherProcess):
    """`python -m helpers.launch_dummies` with a restartable spec, in its own process."""

    def __init__(self, tmp_path, trial, n, max_restarts, *overrides):
        super().__init__(
            [
                "-m",
                "helpers.launch_dummies",
                str(tmp_path),
                trial,
                str(n),
                f"restart.max_restarts={max_restarts}",
                *overrides,
            ]
        )

    def wait_ready(self, timeout: float = 90) -> dict:
        return super().wait_ready(timeout)["pids"]

    def finish(self, timeout=90):
        code, text = super().finish(timeout)
        restarts = json.loads(text.split("RESTARTS ", 1)[1].splitlines()[0])
        return code, text, restarts


def _log(tmp_path, trial, name):
    return (tmp_path / "logs" / "dummies" / trial / f"{name}.log").read_text()


def test_a_sigkilled_restartable_worker_comes_back_with_the_same_index_and_the_trial_succeeds(
    tmp_path, no_leftover_processes
):
    # dummy/0 ends the trial (COMPLETE) after 8 s; dummy/1 is killed meanwhile.
    la = Launcher(tmp_path, "comeback", 2, 3, "exit_after=8.0", "complete_trial=true")
    pids = la.wait_ready()
    os.kill(pids["dummy/1"], signal.SIGKILL)
    code, out, restarts = la.finish()
    assert code == 0 and "DONE" in out, out
    assert restarts == {"dummy/0": 0, "dummy/1": 1}
    log = _log(tmp_path, "comeback", "dummy-1")
    assert "realhf launcher: restart 1 of dummy/1 (max_restarts=3) after: exited with code -9 (SIGKILL)" in log
    assert log.count("configured; running") == 2  # both incarnations ran, in one appended log
    assert not psutil.pid_exists(pids["dummy/1"]) or psutil.Process(pids["dummy/1"]).status() == psutil.STATUS_ZOMBIE


def test_a_worker_that_keeps_crashing_fails_the_trial_after_max_restarts(tmp_path, no_leftover_processes):
    la = Launcher(tmp_path, "crashloop", 2, 2, "exit_after=0.5", "exit_code=3")
    la.wait_ready()
    code, out, restarts = la.finish()
    assert code == 1, out
    assert (
        "FAILED dummy/0: exited with code 3 after 2 restarts within 600 s (cluster.restart_policy.max_restarts=2" in out
    )
    assert restarts["dummy/0"] == 2
    log = _log(tmp_path, "crashloop", "dummy-0")
    assert "restart 1 of dummy/0" in log and "restart 2 of dummy/0" in log and "restart 3" not in log
    assert log.count("crashing on purpose") == 3


@pytest.mark.slow
def test_a_hung_restartable_worker_is_killed_and_restarted(tmp_path, no_leftover_processes):
    # dummy/0 stops heart-beating after 1 s (a deadlock): with max_restarts=1 it is killed and
    # restarted once, hangs again, and then fails the trial naming the hang.
    la = Launcher(tmp_path, "hang", 2, 1, "hang_after=1.0")
    la.wait_ready()
    code, out, restarts = la.finish(timeout=120)
    assert code == 1, out
    assert "FAILED dummy/0: stopped heart-beating" in out and "after 1 restarts within 600 s" in out
    assert "restart 1 of dummy/0" in _log(tmp_path, "hang", "dummy-0")


def test_a_worker_that_exits_as_not_to_be_restarted_fails_the_trial_at_once(tmp_path, no_leftover_processes):
    # EXIT_DO_NOT_RESTART (78): a rollout worker whose streak of failures was one error in user
    # code; without its record (realhf.system.user_errors) the launcher still names the code.
    la = Launcher(tmp_path, "norestart", 2, 3, "exit_after=0.5", "exit_code=78")
    la.wait_ready()
    code, out, restarts = la.finish()
    assert code == 1, out
    assert "FAILED dummy/0: exited with code 78: an error a restart would only repeat (see its log)" in out
    assert restarts["dummy/0"] == 0 and "restart 1" not in _log(tmp_path, "norestart", "dummy-0")
