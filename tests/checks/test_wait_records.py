"""The suite's wait report (helpers.wait, printed by scripts/slowest_tests.py): the subprocess
waits test code makes with a timeout are recorded with what they waited for, and nothing else is."""

import subprocess
import sys

import pytest

from helpers import wait


@pytest.fixture
def recorded():
    first = len(wait.WAITS)
    yield lambda: wait.WAITS[first:]
    del wait.WAITS[first:]


def test_a_wait_and_a_run_with_a_timeout_are_recorded_naming_the_command_and_the_line(recorded):
    proc = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(0.3)"])
    assert proc.wait(timeout=30) == 0
    out = subprocess.run(["sleep", "0.2"], timeout=20, capture_output=True)
    assert out.returncode == 0
    (took_wait, timeout_wait, what_wait), (took_run, timeout_run, what_run) = recorded()
    assert (timeout_wait, timeout_run) == (30, 20)
    assert 0.2 < took_wait < 30 and 0.1 < took_run < 20, (took_wait, took_run)
    # one line, naming the command (a program's newlines folded) and where the test waited
    assert what_wait.startswith(f"{sys.executable.rsplit('/', 1)[-1]} -c import time time.sleep"), what_wait
    assert "\n" not in what_wait and "test_wait_records.py:" in what_wait
    assert what_run.startswith("sleep 0.2 to exit (test_wait_records.py:"), what_run


def test_waits_without_a_timeout_that_time_out_that_are_not_test_code_or_grace_periods_are_not(recorded):
    proc = subprocess.Popen(["sleep", "5"])
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)  # the test's to report, not a wait that ended in time
    proc.kill()
    proc.wait()  # no timeout
    # A wait made by code outside tests/ (here the standard library's own) is not the suite's.
    exec(compile("proc.wait(timeout=5)", subprocess.__file__.replace("subprocess", "elsewhere"), "exec"))
    # Nor a grace period that ends in SIGKILL rather than a failure.
    assert wait.stop_process(subprocess.Popen(["sleep", "5"]), timeout=5) == -15
    assert recorded() == []
