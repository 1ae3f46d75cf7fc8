"""The staleness rule: when may one more rollout (prompt group) start? (docs/architecture.md §4)

With B prompt groups per train step, staleness bound η and trainer version v:

    capacity = min(max_concurrent_rollouts − running,
                   (η + v + 1)·B − (accepted − stale_dropped + running))

and a rollout is admitted iff `capacity > 0`. `running` counts admitted groups still in flight,
`accepted` the groups that finished and were pushed to the trainer, `stale_dropped` the pushed
groups the trainer later dropped as too stale (reported back as a monotonic total). A group
dropped by a filter, or a rollout that died, frees its slot and is not counted.

The manager depends on the rest of the system only through `VersionSource.get_version()`; all
counters live behind one lock, so many request handlers may call it concurrently.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, Hashable, Protocol

OK = "ok"
MAX_CONCURRENT = "max_concurrent_rollouts"
STALENESS = "staleness"
DUPLICATE_QID = "duplicate_qid"
REJECTION_REASONS = (MAX_CONCURRENT, STALENESS, DUPLICATE_QID)


class VersionSource(Protocol):
    def get_version(self) -> int:
        """The trainer's current version: completed actor train steps (0 for the initial model)."""
        ...


@dataclass(frozen=True)
class Decision:
    success: bool
    reason: str  # "ok", or one of REJECTION_REASONS


class StalenessManager:
    """Admission control for rollouts under `max_head_offpolicyness` (η)."""

    def __init__(
        self,
        max_concurrent_rollouts: int,
        batch_size: int,
        max_head_offpolicyness: int,
        version_source: VersionSource,
        accepted: int = 0,
    ):
        """`accepted`: groups accepted before this manager started — on a resumed run, the groups
        already trained — so that capacity continues from where the checkpoint left it."""
        if max_concurrent_rollouts < 1:
            raise ValueError(f"max_concurrent_rollouts must be >= 1, got {max_concurrent_rollouts}")
        if batch_size < 1:
            raise ValueError(f"batch_size (prompt groups per train step) must be >= 1, got {batch_size}")
        if max_head_offpolicyness < 0:
            raise ValueError(f"max_head_offpolicyness must be >= 0, got {max_head_offpolicyness}")
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.batch_size = batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self._version_source = version_source

        self._lock = threading.Lock()
        self._running: set = set()
        if accepted < 0:
            raise ValueError(f"accepted must be >= 0, got {accepted}")
        self._accepted = int(accepted)
        self._stale_dropped = 0
        self._rejections = {reason: 0 for reason in REJECTION_REASONS}

    # -- the rule ------------------------------------------------------------------------------

    def _version(self) -> int:
        # Read outside the lock: the source may do I/O. The version only grows, so a value read a
        # moment early can only make admission more conservative.
        version = int(self._version_source.get_version())
        if version < 0:
            raise ValueError(f"version source returned a negative version {version}")
        return version

    def _capacity_terms(self, version: int) -> tuple[int, int]:
        """(concurrency room, staleness room); the caller holds the lock."""
        running = len(self._running)
        concurrency = self.max_concurrent_rollouts - running
        allowed = (self.max_head_offpolicyness + version + 1) * self.batch_size
        staleness = allowed - (self._accepted - self._stale_dropped + running)
        return concurrency, staleness

    def capacity(self) -> int:
        """How many more rollouts could be admitted right now (may be ≤ 0)."""
        version = self._version()
        with self._lock:
            return min(self._capacity_terms(version))

    # -- events --------------------------------------------------------------------------------

    def allocate(self, qid: Hashable) -> Decision:
        """Admit rollout `qid` if capacity allows; the slot is held until `finish` or `abandon`."""
        version = self._version()
        with self._lock:
            if qid in self._running:
                reason = DUPLICATE_QID
            else:
                concurrency, staleness = self._capacity_terms(version)
                if concurrency <= 0:
                    reason = MAX_CONCURRENT
                elif staleness <= 0:
                    reason = STALENESS
                else:
                    self._running.add(qid)
                    return Decision(True, OK)
            self._rejections[reason] += 1
            return Decision(False, reason)

    def finish(self, qid: Hashable, accepted: bool) -> None:
        """Rollout `qid` ended: `accepted` if its group was pushed to the trainer, False if a
        filter dropped it (the slot is freed and the group is not counted)."""
        with self._lock:
            self._release(qid, "finish")
            if accepted:
                self._accepted += 1

    def abandon(self, qid: Hashable) -> None:
        """An in-flight rollout died without a result: free its slot, count nothing."""
        with self._lock:
            self._release(qid, "abandon")

    def _release(self, qid: Hashable, what: str) -> None:
        try:
            self._running.remove(qid)
        except KeyError:
            raise KeyError(f"{what}({qid!r}): no running rollout with this qid (never allocated, or already ended)") from None

    def set_stale_dropped(self, n: int) -> None:
        """The trainer's running total of groups dropped as too stale; each one frees capacity."""
        n = int(n)
        with self._lock:
            if n < self._stale_dropped:
                raise ValueError(
                    f"stale_dropped is a monotonic total: got {n} after {self._stale_dropped}"
                )
            self._stale_dropped = n

    # -- inspection and recovery ---------------------------------------------------------------

    def running_qids(self) -> frozenset:
        with self._lock:
            return frozenset(self._running)

    def is_running(self, qid: Hashable) -> bool:
        with self._lock:
            return qid in self._running

    def status(self) -> Dict[str, Any]:
        """Counters for `/status` and logs."""
        version = self._version()
        with self._lock:
            return {
                "version": version,
                "running": len(self._running),
                "accepted": self._accepted,
                "stale_dropped": self._stale_dropped,
                "rejections": dict(self._rejections),
                "capacity": min(self._capacity_terms(version)),
                "max_concurrent_rollouts": self.max_concurrent_rollouts,
                "batch_size": self.batch_size,
                "max_head_offpolicyness": self.max_head_offpolicyness,
            }

    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to resume; the version comes from the version source, not from here."""
        with self._lock:
            return {
                "accepted": self._accepted,
                "stale_dropped": self._stale_dropped,
                "running": sorted(self._running, key=repr),
                "rejections": dict(self._rejections),
            }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore counters saved by `state_dict`.

        In-flight qids come back as running, so capacity after a load is exactly what it was at
        save time (at the same version) and never overshoots. Rollouts that did not survive the
        restart must be released with `abandon` (e.g. for every qid in `running_qids()`); until
        then they hold their slots.
        """
        missing = {"accepted", "stale_dropped", "running"} - set(state)
        if missing:
            raise KeyError(f"admission state is missing {sorted(missing)}")
        accepted, stale_dropped = int(state["accepted"]), int(state["stale_dropped"])
        running = set(state["running"])
        if accepted < 0 or stale_dropped < 0:
            raise ValueError(f"admission state has negative counters: {state}")
        if len(running) != len(state["running"]):
            raise ValueError("admission state lists a running qid twice")
        with self._lock:
            self._accepted = accepted
            self._stale_dropped = stale_dropped
            self._running = running
            self._rejections = {r: int(state.get("rejections", {}).get(r, 0)) for r in REJECTION_REASONS}
