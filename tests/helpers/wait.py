"""Polling until a condition holds, failing with what was waited for."""

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
