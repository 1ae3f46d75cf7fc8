"""When does a generation server that joins late get rollouts? When it holds the current weights.

A server the manager did not start with — restarted after a crash, added by hand or by a
scale-up, or back after failing its health checks — *joins*: it is health-checked and brought to
the trainer's current version (by the trainer's next broadcast: joining servers are members of
its weight group, `GET /routed_servers` lists them as `joining`; or by the manager from disk when
that version is there), but it gets no rollouts until then:

    routed  iff  it reported a version >= the trainer's version when it was asked
            or   no other server is routed, it is at most `max_behind` (η) versions behind, so
                 the groups it makes can still be trained, and the current version is not on
                 disk (or it is, and the update from there has not succeeded within `timeout` s)

"When it was asked": the trainer announces a version after its broadcast, so a member of the
weight group always holds at least the version announced when its answer is asked for; the
manager's reading moves on while the answer travels (with steps of 0.1 s, several versions), and
comparing with that newer reading would keep a joiner that takes every broadcast waiting forever.

The `or` line keeps a run going when every server restarted at once and what they hold is
recent enough: a joiner then serves the weights it has (its tokens carry their version; the
staleness rules hold). One further behind would make only groups the trainer drops as stale;
it waits for the current version, which the trainer sends to joiners while it waits for data
(the master's `catch_up`: the trainer makes the next version only from rollouts, so the next
broadcast would never come).
Each joiner that is routed says so in one log line (server, version, seconds it waited). One
that is still waiting after `timeout` s is logged, naming what it waits for, again at 2, 4, 8, …
× `timeout`; it stays unrouted and holds nothing up: the other servers serve, the trainer trains.

Servers the manager starts with are routed at once, as before: they load the run's weights.
Pure bookkeeping, like `server_health`: the manager observes, this decides.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional


@dataclass
class Joiner:
    url: str
    version: int  # the weight version it holds, as it reports it (unknown: the initial weights, 0)
    since: float  # when it joined (the gate's clock)
    current: bool = False  # it reported the trainer's version as of when it was asked (or newer)
    warnings: int = 0  # overdue warnings logged so far

    def waited(self, now: float) -> float:
        return now - self.since


@dataclass(frozen=True)
class Routed:
    """A joiner that leaves the gate for routing."""

    url: str
    version: int
    waited_s: float
    current: bool  # False: routed behind the trainer's version (within η) because no other server is routed


class JoinGate:
    def __init__(self, timeout: float, max_behind: int, clock: Callable[[], float] = time.monotonic):
        self.timeout = timeout
        self.max_behind = max_behind
        self.clock = clock
        self.joiners: Dict[str, Joiner] = {}

    def arrive(self, url: str, version: Optional[int], asked_at: Optional[int] = None) -> None:
        """`url` answers /health and is new to routing (or back); `version`: what it reports,
        `asked_at`: the trainer's version when that was asked for."""
        self.joiners[url] = Joiner(url, _version(version), self.clock())
        self.report(url, version, asked_at)

    def report(self, url: str, version: Optional[int], asked_at: Optional[int] = None) -> None:
        """A weight version a joiner holds (a probe's answer, an update round's), and the
        trainer's version when it was asked for (None: unknown). A lower number than known
        changes nothing: a server's version never goes back."""
        j = self.joiners.get(url)
        if j is None or version is None:
            return
        j.version = max(j.version, _version(version))
        if asked_at is not None and j.version >= asked_at:
            j.current = True

    def leave(self, url: str) -> None:
        """Dropped by health checks or no longer registered: if it comes back, it joins afresh."""
        self.joiners.pop(url, None)

    def is_joining(self, url: str) -> bool:
        return url in self.joiners

    def joining(self) -> List[str]:
        return list(self.joiners)

    def admit(self, current: int, others_routed: bool, current_on_disk: bool) -> List[Routed]:
        """The joiners to route now, by the rule of the module docstring; they leave the gate.
        `others_routed`: some server that is not joining is routed; `current_on_disk`: the
        trainer's current version is published on disk, where the manager can load it from."""
        now = self.clock()
        out = []
        for url, j in list(self.joiners.items()):
            if j.current or j.version >= current:
                out.append(Routed(url, j.version, j.waited(now), True))
            elif (
                not others_routed
                and current - j.version <= self.max_behind
                and (not current_on_disk or j.waited(now) >= self.timeout)
            ):
                out.append(Routed(url, j.version, j.waited(now), False))
        for r in out:
            del self.joiners[r.url]
        return out

    def overdue(self) -> List[Joiner]:
        """Joiners whose wait just passed 1, 2, 4, … × `timeout` (each mark returned once)."""
        now = self.clock()
        out = []
        for j in self.joiners.values():
            if j.waited(now) >= self.timeout * 2**j.warnings:
                while j.waited(now) >= self.timeout * 2**j.warnings:
                    j.warnings += 1
                out.append(j)
        return out


def _version(version: Optional[int]) -> int:
    """A reported version; none (SGLang's "default", no answer) counts as the initial weights."""
    return version if isinstance(version, int) and not isinstance(version, bool) and version >= 0 else 0
