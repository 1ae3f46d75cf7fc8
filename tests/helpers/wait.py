"""Polling until a condition holds, failing with what was waited for; stopping a process."""

import subprocess
import time


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):
    """The first truthy `predicate()`; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
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
