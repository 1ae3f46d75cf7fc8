"""Polling until a condition holds, failing with what was waited for; stopping a process.

Every wait that ends in time is recorded (`record_wait`): `wait_for`, a whole run's end
(helpers.training_runs) and, once `record_subprocess_waits` is on (tests/conftest.py turns it on
for the session), every `Popen.wait`/`communicate` with a timeout that test code makes, directly or
through `subprocess.run`. tests/conftest.py puts each test's tightest one (the largest share of its
timeout) in the lane's JUnit report, and `scripts.slowest_tests` prints a run's tightest, so that a
slower host shows which timeouts it comes near before one of them fails."""

import functools
import os
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

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


_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SUBPROCESS = subprocess.__file__
_inside = threading.local()  # communicate's own inner wait is not a second wait


def _test_caller() -> Optional[str]:
    """`file:line` of the test code that asked for this wait (past `subprocess` itself, which
    `run` goes through), or None when the wait is not test code's (realhf's own, in-process)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == _SUBPROCESS:
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(_TESTS + os.sep):
        return None
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _command(args) -> str:
    words = args.split() if isinstance(args, str) else [str(a) for a in args]
    # one line: a `python -c` program's newlines would break the report's
    return " ".join(" ".join([os.path.basename(words[0]), *words[1:3]]).split())[:40] if words else "?"


def _recorded(method: Callable, timeout_at: int) -> Callable:
    @functools.wraps(method)
    def wait(self, *args, **kwargs):
        timeout = kwargs.get("timeout", args[timeout_at] if len(args) > timeout_at else None)
        if timeout is None or getattr(_inside, "on", False):
            return method(self, *args, **kwargs)
        where = _test_caller()
        if where is None:
            return method(self, *args, **kwargs)
        _inside.on = True
        start = time.monotonic()
        try:
            result = method(self, *args, **kwargs)  # a TimeoutExpired is the test's to report
        finally:
            _inside.on = False
        record_wait(time.monotonic() - start, timeout, f"{_command(self.args)} to exit ({where})")
        return result

    return wait


def record_subprocess_waits() -> Callable[[], None]:
    """Records test code's `Popen.wait(timeout=)` and `Popen.communicate(timeout=)` (and so
    `subprocess.run(timeout=)`) that end in time; returns the undo."""
    originals = {name: getattr(subprocess.Popen, name) for name in ("wait", "communicate")}
    subprocess.Popen.wait = _recorded(originals["wait"], 0)
    subprocess.Popen.communicate = _recorded(originals["communicate"], 1)

    def undo() -> None:
        for name, method in originals.items():
            setattr(subprocess.Popen, name, method)

    return undo


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM `proc`, SIGKILL it if it is still there after `timeout` s; its exit code."""
    proc.terminate()
    _inside.on = True  # a grace period that ends in SIGKILL, not a wait that fails a test
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        _inside.on = False
