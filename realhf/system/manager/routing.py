"""Which generation server gets a prompt group? (docs/architecture.md §5)

Rule, in order:
  1. Affinity: if the group's previous server is still known and the weights have not changed
     since (`previous_version == current_version`), keep it, so the server's prefix cache holds
     the prompt and the tokens generated so far. All samples of a group go to one server.
  2. Otherwise pick by policy:
       - `round_robin`:       the next server in turn;
       - `least_requests`:    the fewest in-flight generation requests;
       - `least_token_usage`: the fewest reserved tokens.
     Ties go to the server listed first.

Loads are tracked per qid, so they cannot drift: each qid's load is recorded once, scheduling it
again first takes its recorded load off its old server (then adds the new load where it goes),
`release(qid)` takes it off. Per-server totals are integer sums of exactly these recorded loads.
The load of one qid on its server is
    requests = group_size                                   (one generation request per sample)
    tokens   = group_size · (prompt_len + new_token_budget)  (KV-cache tokens it may occupy)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Hashable, Iterable, List, Optional

from realhf.api.choices import SCHEDULE_POLICIES as POLICIES


@dataclass(frozen=True)
class ServerLoad:
    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class _Assignment:
    url: str
    load: ServerLoad


class Router:
    def __init__(self, policy: str, server_urls: Iterable[str]):
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; valid policies: {', '.join(POLICIES)}")
        self.policy = policy
        self._lock = threading.Lock()
        self._servers: List[str] = []
        self._assignments: Dict[Hashable, _Assignment] = {}
        self._totals: Dict[str, ServerLoad] = {}
        self._next_rr = 0
        self.set_servers(server_urls)

    # -- servers -------------------------------------------------------------------------------

    def set_servers(self, urls: Iterable[str]) -> None:
        """Replace the server list. Qids on removed servers lose their load and are moved to a
        live server on their next `schedule`."""
        urls = list(urls)
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate generation server urls: {urls}")
        with self._lock:
            self._servers = urls
            self._assignments = {q: a for q, a in self._assignments.items() if a.url in urls}
            self._totals = {url: self._totals.get(url, ServerLoad()) for url in urls}

    def servers(self) -> List[str]:
        with self._lock:
            return list(self._servers)

    # -- scheduling ----------------------------------------------------------------------------

    def schedule(
        self,
        qid: Hashable,
        prompt_len: int,
        group_size: int,
        new_token_budget: int,
        previous_url: Optional[str] = None,
        previous_version: Optional[int] = None,
        current_version: Optional[int] = None,
    ) -> str:
        """The server for (the next chunk of) group `qid`; records its load there.

        `prompt_len` counts the tokens sent (prompt plus anything generated so far).
        """
        if prompt_len < 0 or new_token_budget < 0 or group_size < 1:
            raise ValueError(
                f"schedule({qid!r}): need prompt_len >= 0, new_token_budget >= 0, group_size >= 1; "
                f"got {prompt_len}, {new_token_budget}, {group_size}"
            )
        load = ServerLoad(requests=group_size, tokens=group_size * (prompt_len + new_token_budget))
        with self._lock:
            if not self._servers:
                raise RuntimeError(f"cannot schedule {qid!r}: no generation servers are registered")
            # The qid's own old load must not count against the server it is leaving.
            self._unassign(qid)
            if previous_url in self._totals and previous_version == current_version:
                url = previous_url
            else:
                url = self._pick()
            self._assign(qid, _Assignment(url, load))
            return url

    def _pick(self) -> str:
        if self.policy == "round_robin":
            url = self._servers[self._next_rr % len(self._servers)]
            self._next_rr = (self._next_rr + 1) % len(self._servers)
            return url
        loads = self._totals
        if self.policy == "least_requests":
            key = lambda url: (loads[url].requests, loads[url].tokens)  # noqa: E731
        else:
            key = lambda url: (loads[url].tokens, loads[url].requests)  # noqa: E731
        return min(self._servers, key=key)  # min keeps the first of equals

    def release(self, qid: Hashable) -> None:
        """The group is done (or gone): drop its load. Releasing twice is harmless."""
        with self._lock:
            self._unassign(qid)

    def _assign(self, qid: Hashable, a: _Assignment) -> None:
        self._assignments[qid] = a
        total = self._totals[a.url]
        self._totals[a.url] = ServerLoad(total.requests + a.load.requests, total.tokens + a.load.tokens)

    def _unassign(self, qid: Hashable) -> None:
        a = self._assignments.pop(qid, None)
        if a is not None:
            total = self._totals[a.url]
            self._totals[a.url] = ServerLoad(total.requests - a.load.requests, total.tokens - a.load.tokens)

    # -- inspection ----------------------------------------------------------------------------

    def server_of(self, qid: Hashable) -> Optional[str]:
        with self._lock:
            a = self._assignments.get(qid)
            return None if a is None else a.url

    def loads(self) -> Dict[str, ServerLoad]:
        """Per server: in-flight requests and reserved tokens, summed over its qids."""
        with self._lock:
            return {url: self._totals[url] for url in self._servers}
