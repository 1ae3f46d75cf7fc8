"""A bounded pool of daemon threads for blocking calls that may never return (users' code).

`concurrent.futures.ThreadPoolExecutor` and `asyncio.to_thread` join their threads when the
process exits, so one call stuck in `time.sleep(3600)` would hold a worker's exit for an hour;
these threads are daemons, and there are at most `size` of them, so stuck calls cannot pile up
threads either. Callers bound each call with their own timeout (the wait for a free thread
included): realhf.plugins.agents.math_single_step runs users' synchronous reward functions here.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable


class DaemonThreads:
    """At most `size` daemon threads that run blocking calls off an event loop, started as calls
    need them. A thread stuck in a call cannot be killed and comes back only when its call returns;
    when all `size` are stuck, later calls wait in the queue (their callers' timeouts fire), and no
    thread is added."""

    def __init__(self, size: int, name: str = "blocking-call"):
        if size < 1:
            raise ValueError(f"DaemonThreads needs at least one thread, got {size}")
        self.size, self.name = size, name
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self.busy = 0  # threads inside a call now (stuck ones included)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn()` in a free thread (queued while none is); cancelling the returned future
        before a thread takes it drops the call."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn))
        with self._lock:
            grow = self._idle == 0 and self._threads < self.size
            if grow:
                self._threads += 1
            else:
                self._idle = max(0, self._idle - 1)
        if grow:
            threading.Thread(target=self._serve, name=f"{self.name}-{self._threads}", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            future, fn = self._queue.get()
            if future.set_running_or_notify_cancel():  # False: it timed out while queued
                with self._lock:
                    self.busy += 1
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the awaiting episode
                    future.set_exception(e)
                finally:
                    with self._lock:
                        self.busy -= 1
            with self._lock:
                self._idle += 1
