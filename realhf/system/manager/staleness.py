"""The staleness rule: when may one more rollout (prompt group) start? (docs/architecture.md §4)

With a trainer of D data-parallel ranks, B prompt groups per train step of which rank r trains
share_r (`dp_shares(B, D)`), staleness bound η and trainer version v, a rollout whose worker
pushes to rank r is admitted iff `capacity_r > 0`, where

    capacity_r = min(max_concurrent_rollouts − running,
                     (η + v + 1)·share_r − (accepted_r − stale_dropped_r + running_r))

`running` counts all admitted groups still in flight, `running_r` those of rank r, `accepted_r`
the groups that finished and were pushed to rank r, `stale_dropped_r` the pushed groups rank r
later dropped as too stale (reported back as a monotonic total per rank). A group dropped by a
filter, or a rollout that died, frees its slot and is not counted. With D = 1 (share_0 = B) this
is the single-budget rule.

Why per rank: every rollout worker pushes to one DP head, and a train step needs share_r groups
from every rank. With one global budget a fast worker's rank could take the whole budget while a
slow rank stays short: the version never advances, nothing becomes stale, nothing is freed — a
permanent deadlock. Per-rank budgets keep room for every rank.

The manager depends on the rest of the system only through `VersionSource.get_version()`; all
counters live behind one lock, so many request handlers may call it concurrently.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Optional, Protocol, Sequence

OK = "ok"
MAX_CONCURRENT = "max_concurrent_rollouts"
STALENESS = "staleness"
DUPLICATE_QID = "duplicate_qid"
REJECTION_REASONS = (MAX_CONCURRENT, STALENESS, DUPLICATE_QID)


def dp_shares(batch_size: int, dp_size: int) -> List[int]:
    """Groups each DP rank contributes to a step: B // dp, the remainder one each to ranks 0, 1, …"""
    if dp_size < 1:
        raise ValueError(f"dp_size (trainer DP ranks) must be >= 1, got {dp_size}")
    if batch_size < dp_size:
        raise ValueError(
            f"batch_size {batch_size} < dp_size {dp_size}: every DP rank needs at least one group per step"
        )
    k, rest = divmod(batch_size, dp_size)
    return [k + (1 if r < rest else 0) for r in range(dp_size)]


def resumed_accepted(shares: Sequence[int], trained_groups: int) -> List[int]:
    """Per-rank `accepted` of a run resumed after `trained_groups` were trained: each completed
    step trained exactly share_r groups from rank r."""
    batch_size = sum(shares)
    if trained_groups < 0 or trained_groups % batch_size:
        raise ValueError(
            f"trained_groups_at_start={trained_groups} is not a whole number of steps of B={batch_size} groups"
        )
    return [trained_groups // batch_size * s for s in shares]


class VersionSource(Protocol):
    def get_version(self) -> int:
        """The trainer's current version: completed actor train steps (0 for the initial model)."""
        ...


@dataclass(frozen=True)
class Decision:
    success: bool
    reason: str  # "ok", or one of REJECTION_REASONS


class StalenessManager:
    """Admission control for rollouts under `max_head_offpolicyness` (η), one budget per DP rank."""

    def __init__(
        self,
        max_concurrent_rollouts: int,
        shares: Sequence[int],
        max_head_offpolicyness: int,
        version_source: VersionSource,
        accepted: Optional[Sequence[int]] = None,
    ):
        """`shares[r]`: groups DP rank r trains per step (`dp_shares`). `accepted[r]`: groups of
        rank r accepted before this manager started — on a resumed run, the groups already
        trained (`resumed_accepted`) — so that capacity continues from where the checkpoint left it."""
        # max_concurrent_rollouts >= 1 and max_head_offpolicyness >= 0 are the config's rules,
        # checked at start and at the manager's entry; `shares` and `accepted` are derived here.
        shares = [int(s) for s in shares]
        if not shares or min(shares) < 1:
            raise ValueError(f"shares (prompt groups per train step of each DP rank) must be >= 1 each, got {shares}")
        accepted = [0] * len(shares) if accepted is None else [int(a) for a in accepted]
        if len(accepted) != len(shares) or min(accepted) < 0:
            raise ValueError(f"accepted must be one count >= 0 per DP rank ({len(shares)}), got {accepted}")
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.shares = shares
        self.batch_size = sum(shares)
        self.max_head_offpolicyness = max_head_offpolicyness
        self._version_source = version_source

        self._lock = threading.Lock()
        self._running: Dict[Hashable, int] = {}  # qid -> the rank it was admitted for
        self._running_r = [0] * len(shares)
        self._accepted = accepted
        self._stale_dropped = [0] * len(shares)
        self._rejections = {reason: 0 for reason in REJECTION_REASONS}

    @property
    def n_ranks(self) -> int:
        return len(self.shares)

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.n_ranks:
            raise ValueError(f"rank must be a trainer DP rank in [0, {self.n_ranks}), got {rank!r}")
        return rank

    # -- the rule ------------------------------------------------------------------------------

    def _version(self) -> int:
        # Read outside the lock: the source may do I/O. The version only grows, so a value read a
        # moment early can only make admission more conservative.
        version = int(self._version_source.get_version())
        if version < 0:
            raise ValueError(f"version source returned a negative version {version}")
        return version

    def _concurrency(self) -> int:
        return self.max_concurrent_rollouts - len(self._running)

    def _staleness(self, version: int, rank: int) -> int:
        """Rank `rank`'s staleness room; the caller holds the lock."""
        allowed = (self.max_head_offpolicyness + version + 1) * self.shares[rank]
        return allowed - (self._accepted[rank] - self._stale_dropped[rank] + self._running_r[rank])

    def _capacities(self, version: int) -> List[int]:
        concurrency = self._concurrency()
        return [min(concurrency, self._staleness(version, r)) for r in range(self.n_ranks)]

    def _total_capacity(self, version: int) -> int:
        # A rank over its budget does not take room from the others: only positive rooms add up.
        rooms = sum(max(0, self._staleness(version, r)) for r in range(self.n_ranks))
        return min(self._concurrency(), rooms)

    def capacity(self, rank: Optional[int] = None) -> int:
        """How many more rollouts of `rank` (of any rank if None) could be admitted right now."""
        version = self._version()
        with self._lock:
            if rank is None:
                return self._total_capacity(version)
            return self._capacities(version)[self._check_rank(rank)]

    # -- events --------------------------------------------------------------------------------

    def allocate(self, qid: Hashable, rank: int) -> Decision:
        """Admit rollout `qid`, whose group will be pushed to DP rank `rank`, if that rank's
        capacity allows; the slot is held until `finish` or `abandon`."""
        self._check_rank(rank)
        version = self._version()
        with self._lock:
            if qid in self._running:
                reason = DUPLICATE_QID
            elif self._concurrency() <= 0:
                reason = MAX_CONCURRENT
            elif self._staleness(version, rank) <= 0:
                reason = STALENESS
            else:
                self._running[qid] = rank
                self._running_r[rank] += 1
                return Decision(True, OK)
            self._rejections[reason] += 1
            return Decision(False, reason)

    def finish(self, qid: Hashable, accepted: bool) -> None:
        """Rollout `qid` ended: `accepted` if its group was pushed to the trainer, False if a
        filter dropped it (the slot is freed and the group is not counted)."""
        with self._lock:
            rank = self._release(qid, "finish")
            if accepted:
                self._accepted[rank] += 1

    def abandon(self, qid: Hashable) -> None:
        """An in-flight rollout died without a result: free its slot, count nothing."""
        with self._lock:
            self._release(qid, "abandon")

    def _release(self, qid: Hashable, what: str) -> int:
        try:
            rank = self._running.pop(qid)
        except KeyError:
            raise KeyError(
                f"{what}({qid!r}): no running rollout with this qid (never allocated, or already ended)"
            ) from None
        self._running_r[rank] -= 1
        return rank

    def set_stale_dropped(self, per_rank: Sequence[int]) -> None:
        """Each DP rank's running total of groups dropped as too stale; each one frees capacity
        of that rank."""
        per_rank = [int(n) for n in per_rank]
        if len(per_rank) != self.n_ranks:
            raise ValueError(f"stale_dropped must have one total per trainer DP rank ({self.n_ranks}), got {per_rank}")
        with self._lock:
            for rank, (old, new) in enumerate(zip(self._stale_dropped, per_rank)):
                if new < old:
                    raise ValueError(f"stale_dropped of rank {rank} is a monotonic total: got {new} after {old}")
            self._stale_dropped = per_rank

    # -- inspection and recovery ---------------------------------------------------------------

    def running_qids(self) -> frozenset:
        with self._lock:
            return frozenset(self._running)

    def rank_of(self, qid: Hashable) -> int:
        """The DP rank running rollout `qid` was admitted for (KeyError if it is not running)."""
        with self._lock:
            if qid not in self._running:
                raise KeyError(f"{qid!r}: no running rollout with this qid (never allocated, or already ended)")
            return self._running[qid]

    def is_running(self, qid: Hashable) -> bool:
        with self._lock:
            return qid in self._running

    def stale_dropped(self) -> List[int]:
        with self._lock:
            return list(self._stale_dropped)

    def status(self) -> Dict[str, Any]:
        """Counters for `/status` and logs: totals, and per DP rank under `per_rank`."""
        version = self._version()
        with self._lock:
            return {
                "version": version,
                "running": len(self._running),
                "accepted": sum(self._accepted),
                "stale_dropped": sum(self._stale_dropped),
                "rejections": dict(self._rejections),
                "capacity": self._total_capacity(version),
                "per_rank": {
                    "share": list(self.shares),
                    "running": list(self._running_r),
                    "accepted": list(self._accepted),
                    "stale_dropped": list(self._stale_dropped),
                    "capacity": self._capacities(version),
                },
                "max_concurrent_rollouts": self.max_concurrent_rollouts,
                "batch_size": self.batch_size,
                "max_head_offpolicyness": self.max_head_offpolicyness,
            }

    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to resume; the version comes from the version source, not from here."""
        with self._lock:
            return {
                "accepted": list(self._accepted),
                "stale_dropped": list(self._stale_dropped),
                "running": sorted(([qid, rank] for qid, rank in self._running.items()), key=repr),
                "rejections": dict(self._rejections),
            }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore counters saved by `state_dict` (of a manager with the same number of ranks).

        In-flight qids come back as running, so capacity after a load is exactly what it was at
        save time (at the same version) and never overshoots. Rollouts that did not survive the
        restart must be released with `abandon` (e.g. for every qid in `running_qids()`); until
        then they hold their slots.
        """
        missing = {"accepted", "stale_dropped", "running"} - set(state)
        if missing:
            raise KeyError(f"admission state is missing {sorted(missing)}")
        accepted = [int(a) for a in state["accepted"]]
        stale_dropped = [int(n) for n in state["stale_dropped"]]
        for key, counts in (("accepted", accepted), ("stale_dropped", stale_dropped)):
            if len(counts) != self.n_ranks:
                raise ValueError(f"admission state {key} has {len(counts)} ranks, this manager {self.n_ranks}")
            if min(counts) < 0:
                raise ValueError(f"admission state {key} has negative counters: {counts}")
        running: Dict[Hashable, int] = {}
        for qid, rank in state["running"]:
            if qid in running:
                raise ValueError(f"admission state lists running qid {qid!r} twice")
            running[qid] = self._check_rank(rank)
        running_r = [0] * self.n_ranks
        for rank in running.values():
            running_r[rank] += 1
        with self._lock:
            self._accepted = accepted
            self._stale_dropped = stale_dropped
            self._running = running
            self._running_r = running_r
            self._rejections = {r: int(state.get("rejections", {}).get(r, 0)) for r in REJECTION_REASONS}
