"""The trainer-side staleness guard (docs/architecture.md §4) and the FIFO of groups a DP head may train on.

A model worker never trains a group whose `version_start < v − η`: such groups are dropped and
counted, the master publishes each rank's count as `stale_dropped` (a per-rank list), and the
GserverManager subtracts it from that rank's `accepted` so that a drop frees admission capacity
instead of starving the trainer. The version only grows, so the guard is re-applied to the whole
buffer at every look.

A group whose qid this buffer has already held is refused and counted (`n_duplicates`), not
trained twice: a rollout worker killed between its push and its record of the push runs the
group again under the same qid. A duplicate does not free admission capacity (the manager
counted only one of the two copies as accepted).
"""

from __future__ import annotations

import collections
from typing import Deque, Iterable, List

from realhf.api.trajectory import Trajectory


class TrajectoryBuffer:
    def __init__(self, max_head_offpolicyness: int):
        # >= 0: checked once, at start (realhf.experiments.validation) and at the worker's entry.
        self.eta = max_head_offpolicyness
        self._groups: Deque[Trajectory] = collections.deque()
        self.n_added = 0
        self.n_stale_dropped = 0
        self.n_taken = 0
        self.n_duplicates = 0
        self._seen: set = set()  # every qid added in this trainer incarnation

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, groups: Iterable[Trajectory]) -> List[Trajectory]:
        """Append the groups; returns the duplicates refused."""
        refused = []
        for g in groups:
            if g.qid in self._seen:
                self.n_duplicates += 1
                refused.append(g)
                continue
            self._seen.add(g.qid)
            self._groups.append(g)
            self.n_added += 1
        return refused

    def is_stale(self, group: Trajectory, version: int) -> bool:
        return group.version_start < version - self.eta

    def drop_stale(self, version: int) -> List[Trajectory]:
        """Remove (and count) every group too old to train at `version`; returns them."""
        dropped = [g for g in self._groups if self.is_stale(g, version)]
        if dropped:
            self._groups = collections.deque(g for g in self._groups if not self.is_stale(g, version))
            self.n_stale_dropped += len(dropped)
        return dropped

    def take(self, n: int, version: int) -> List[Trajectory]:
        """The `n` oldest trainable groups; raises if fewer are buffered (nothing is taken then)."""
        self.drop_stale(version)
        if n > len(self._groups):
            raise ValueError(f"asked for {n} groups but only {len(self._groups)} are buffered")
        taken = [self._groups.popleft() for _ in range(n)]
        self.n_taken += n
        return taken
