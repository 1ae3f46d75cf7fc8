"""Issue 14 item 5: the restart budget is per time window, not per run. A restartable worker whose
deaths are spaced further apart than `restart_window` is restarted every time (more often than
max_restarts); a burst of deaths within the window fails the trial saying "N restarts within W s"."""

import json
import signal
import time

from helpers.launcher_process import LauncherProcess


def _restarts(text):
    return json.loads(text.split("RESTARTS ", 1)[1].splitlines()[0])


def _dummies(tmp_path, trial, max_restarts, window, *overrides):
    return LauncherProcess(
        [
            "-m",
            "helpers.launch_dummies",
            str(tmp_path),
            trial,
            "2",
            f"restart.max_restarts={max_restarts}",
            f"restart.window={window}",
            *overrides,
        ]
    )


def _log(tmp_path, trial, name):
    return (tmp_path / "logs" / "dummies" / trial / f"{name}.log").read_text()


def test_spaced_deaths_beyond_the_window_keep_being_restarted(tmp_path, no_leftover_processes):
    # dummy/0 crashes 1.5 s after it starts; a new incarnation needs over a second to start on top
    # of that, so no two restarts fall within the 1 s window: max_restarts=1 never runs out.
    la = _dummies(tmp_path, "spaced", 1, 1.0, "exit_after=1.5", "exit_code=3")
    la.wait_ready()
    deadline = time.monotonic() + 90
    while _log(tmp_path, "spaced", "dummy-0").count("crashing on purpose") < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    la.proc.send_signal(signal.SIGINT)
    code, out = la.finish()
    assert code == 130 and "INTERRUPTED" in out, out  # still running when we stopped it: never failed
    assert "FAILED" not in out, out
    assert _restarts(out)["dummy/0"] >= 3, out


def test_a_burst_of_deaths_within_the_window_fails_naming_the_restarts_and_the_window(tmp_path, no_leftover_processes):
    la = _dummies(tmp_path, "burst", 2, 600, "exit_after=0.5", "exit_code=3")
    la.wait_ready()
    code, out = la.finish(timeout=90)
    assert code == 1, out
    assert "FAILED dummy/0: exited with code 3 after 2 restarts within 600 s" in out, out
    assert "restart_window=600" in out
    assert _restarts(out)["dummy/0"] == 2
