"""Notices an asyncio event loop that stopped running callbacks, and says where it is stuck.

User code that blocks (a synchronous call inside an agent's or an environment's coroutine)
freezes everything on the rollout worker's loop, the episode timeouts included; from outside the
worker still looks alive. The only observer that still runs then is another thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from typing import Any, List, Optional

from realhf.base import name_resolve

# Code that is not the user's: `where` names the innermost frame outside it (a blocking
# `requests.get` is reported at the user's line, not in ssl.py).
_LIBRARY_DIRS = tuple(
    {os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_STACK_FRAMES = 8


def _where(stack: List[traceback.FrameSummary]) -> str:
    """ "file:line in function" of the innermost frame of code outside the libraries."""
    own = [f for f in stack if not os.path.realpath(f.filename).startswith(_LIBRARY_DIRS)]
    frame = (own or stack)[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


class LoopWatchdog:
    """Notices an event loop that stopped running callbacks, and says where it is stuck.

    A task on the loop stamps the time every `interval` s; a daemon thread compares. When the
    stamp is `warn_s` old, it logs a WARNING with the loop thread's current stack (once per
    blocking, then a reminder every `remind_s` s) and publishes `{blocked_for_s, where}` under
    `key` (keep-alive, so a process killed while blocked leaves nothing behind) for the master's
    stall report; when the loop runs again, an INFO line says for how long, and the key goes.
    A thread is the only observer that still runs while the loop is blocked."""

    def __init__(
        self, name: str, logger: Any, key: Optional[str], warn_s: float, remind_s: float, keepalive_ttl: Optional[float]
    ):
        self.name, self.logger, self.key = name, logger, key
        self.warn_s, self.remind_s, self.keepalive_ttl = warn_s, remind_s, keepalive_ttl
        self.interval = min(0.5, warn_s / 4)
        self.last = time.monotonic()  # of the loop's latest stamp
        self.blocked_since: Optional[float] = None  # the stamp before the current blocking
        self._next_remind = self._next_publish = 0.0
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._task: Optional[asyncio.Task] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Call on the loop's thread, inside the running loop."""
        self._loop_thread, self.last = threading.get_ident(), time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._stamp(), name="loop-watchdog-stamp")
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
        if self.blocked_since is not None:
            self._unpublish()

    async def _stamp(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(self.interval)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the watchdog must outlive a bad probe
                self.logger.warning(f"event-loop watchdog: {type(e).__name__}: {e}")

    def check(self, now: float) -> None:
        last = self.last
        if now - last >= self.warn_s:
            self._blocked(now, last)
        elif self.blocked_since is not None:
            self.logger.info(
                f"event loop of {self.name} runs again after being blocked for {last - self.blocked_since:.1f}s"
            )
            self.blocked_since = None
            self._unpublish()

    def _blocked(self, now: float, last: float) -> None:
        first = self.blocked_since is None
        if first:
            self.blocked_since, self._next_remind, self._next_publish = last, now, now
        stack = self._loop_stack()
        blocked_for = now - last
        if now >= self._next_remind:
            self._next_remind = now + self.remind_s
            self.logger.warning(
                f"event loop of {self.name} {'blocked' if first else 'still blocked'} for {blocked_for:.1f}s: "
                "nothing else on it runs (episodes, their timeouts, the stop check) until the code below "
                "returns; run blocking work in a thread (asyncio.to_thread) or make it async. The loop is in:\n"
                + "".join(traceback.format_list(stack)).rstrip()
            )
        if now >= self._next_publish:
            self._next_publish = now + 5.0  # fresh enough for the stall report, cheap for Redis
            self._publish(blocked_for, _where(stack) if stack else "unknown")

    def _loop_stack(self) -> List[traceback.FrameSummary]:
        frame = sys._current_frames().get(self._loop_thread)
        return traceback.extract_stack(frame)[-_STACK_FRAMES:] if frame is not None else []

    def _publish(self, blocked_for: float, where: str) -> None:
        if self.key is None:
            return
        value = json.dumps({"blocked_for_s": round(blocked_for, 1), "where": where})
        name_resolve.add(self.key, value, replace=True, keepalive_ttl=self.keepalive_ttl)

    def _unpublish(self) -> None:
        if self.key is None:
            return
        try:
            name_resolve.delete(self.key)
        except name_resolve.NameEntryNotFoundError:
            pass  # expired, or never written (unblocked before the first publish)
