"""Polling until a condition holds, failing with what was waited for; stopping a process.

Every wait that ends in time is recorded (`record_wait`): tests/conftest.py puts each test's
tightest one (the largest share of its timeout) in the lane's JUnit report, and
`scripts.slowest_tests` prints a run's tightest, so that a slower host shows which timeouts it
comes near before one of them fails."""

import subprocess
import time
from typing import List, Tuple

# (seconds taken, timeout, what) of this process's waits that ended in time.
WAITS: List[Tuple[float, float, str]] = []


def record_wait(took: float, timeout: float, what: str) -> None:
    if timeout > 0:
        WAITS.append((took, timeout, what))


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):
    """The first truthy `predicate()`; TimeoutError naming `what` after `timeout` seconds."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            record_wait(time.monotonic() - start, timeout, what)
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM `proc`, SIGKILL it if it is still there after `timeout` s; its exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
