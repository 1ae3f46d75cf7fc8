"""StreamDataset: the trajectories one DP head has received and not yet trained on.

A background thread pulls finished groups from the trajectory stream into a bounded queue; the
model worker takes exactly `n` of them with `get(n, timeout)`. When the queue is full the thread
stops pulling, ZMQ's high-water mark fills, and pushers block: back-pressure, not data loss.
"""

import collections
import queue
import threading
import time
from typing import Any, Callable, List, Optional

from realhf.base import logging

logger = logging.getLogger("stream_dataset")


class StreamDatasetError(RuntimeError):
    pass


class StreamTimeoutError(StreamDatasetError, TimeoutError):
    def __init__(self, message: str, n_have: int):
        super().__init__(message)
        self.n_have = n_have


class StreamDataset:
    """`puller` is any object with `pull(timeout) -> obj` and `close()` (e.g. ZMQPuller).

    `parse` (optional) is called on each item in the pull thread and what it returns is what
    `get` hands out (e.g. `Trajectory.from_msg`: validated once, off the trainer's thread). An
    item it rejects (by raising ValueError — or any other Exception, since a parser may trip over
    a foreign message) is logged, counted in `n_invalid` and dropped; the thread keeps pulling.
    """

    def __init__(
        self,
        puller,
        maxsize: int = 10000,
        poll_interval: float = 0.1,
        parse: Optional[Callable[[Any], Any]] = None,
        name: str = "stream-dataset",
    ):
        self._puller = puller
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize)
        # Items handed back by a get() that timed out; served before the queue, in order.
        self._front: "collections.deque[Any]" = collections.deque()
        self._front_lock = threading.Lock()
        self._poll_interval = poll_interval
        self._parse = parse
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self.n_pulled = 0
        self.n_invalid = 0
        self._name = name
        self._thread = threading.Thread(target=self._pull_loop, name=name, daemon=True)
        self._thread.start()

    def _pull_loop(self):
        try:
            while not self._stop.is_set():
                try:
                    item = self._puller.pull(timeout=self._poll_interval)
                except TimeoutError:
                    continue
                if self._parse is not None:
                    try:
                        item = self._parse(item)
                    except Exception as e:  # noqa: BLE001 - a foreign message must not kill the thread
                        self.n_invalid += 1
                        logger.error(
                            f"{self._name}: dropped invalid item #{self.n_invalid}: {type(e).__name__}: {str(e)[:300]}"
                        )
                        continue
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=self._poll_interval)
                        self.n_pulled += 1
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # surfaced to the caller of get()
            self._error = e
            logger.error(f"{self._name}: pull thread died: {type(e).__name__}: {e}")

    def _check_alive(self):
        if self._error is not None:
            raise StreamDatasetError(
                f"{self._name}: pull thread died: {type(self._error).__name__}: {self._error}"
            ) from self._error
        if self._stop.is_set():
            raise StreamDatasetError(f"{self._name} is closed")

    def qsize(self) -> int:
        return self._queue.qsize() + len(self._front)

    def _take(self, timeout: float):
        with self._front_lock:
            if self._front:
                return self._front.popleft()
        return self._queue.get(timeout=timeout)

    def get(self, n: int, timeout: float) -> List[Any]:
        """Exactly `n` items; on timeout raises StreamTimeoutError and keeps what it had queued."""
        if n <= 0:
            return []
        self._check_alive()
        deadline = time.monotonic() + timeout
        items: List[Any] = []
        try:
            while len(items) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StreamTimeoutError(
                        f"{self._name}: got {len(items)} of {n} items within {timeout:.1f}s", len(items)
                    )
                try:
                    items.append(self._take(min(remaining, self._poll_interval)))
                except queue.Empty:
                    self._check_alive()
        except BaseException:
            self._put_back(items)
            raise
        return items

    def get_available(self, max_n: Optional[int] = None) -> List[Any]:
        """Whatever is queued now (at most `max_n`), without waiting."""
        self._check_alive()
        items = []
        while max_n is None or len(items) < max_n:
            try:
                items.append(self._take(0))
            except queue.Empty:
                break
        return items

    def _put_back(self, items: List[Any]) -> None:
        # Items taken by a failed get() go back to the front so that nothing received is lost
        # and the arrival order is kept.
        with self._front_lock:
            self._front.extendleft(reversed(items))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._puller.close()
