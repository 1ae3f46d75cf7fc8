"""Which generation servers the manager may route to, from the results of its health checks.

    health = ServerHealth(initial_urls, max_failures=2)
    health.record(url, ok=False)   # … `max_failures` failures in a row: "dropped"
    health.record(url, ok=True)    # one success: "up" (back in routing)
    health.routable(registered)    # the registered servers that are in

A server is healthy from the start if it was given at start (trusted), else after its first
successful check. `max_failures` consecutive failed checks drop it; one success brings it back,
with the weight version it reported. A server that becomes healthy is routed once it holds the
trainer's current weights (`realhf.system.manager.joining`). A server no longer registered is
forgotten. Pure bookkeeping: the manager probes, this module decides.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

UP, DROPPED = "up", "dropped"


class ServerHealth:
    def __init__(self, initial_urls: Iterable[str], max_failures: int):
        self.max_failures = max_failures
        self.healthy = set(initial_urls)  # answered /health (the initial servers are trusted)
        self.failures: Dict[str, int] = {}  # url -> failed checks in a row
        self.reported_versions: Dict[str, int] = {}  # url -> weight version it reported on joining
        self.n_dropped = 0

    def routable(self, registered: Iterable[str]) -> List[str]:
        """The registered servers that may be routed to, in the given order."""
        return [u for u in registered if u in self.healthy]

    def is_joining(self, url: str) -> bool:
        """Not routed yet: a successful check should also ask which weights it holds."""
        return url not in self.healthy

    def record(self, url: str, ok: bool, weight_version: Optional[int] = None) -> Optional[str]:
        """One check's result; returns UP when the server (re)joins routing, DROPPED when it
        leaves, None when nothing changed. `weight_version`: what a joining server reported."""
        if ok:
            if isinstance(weight_version, int) and weight_version >= 0:
                self.reported_versions[url] = weight_version
            self.failures.pop(url, None)
            if url in self.healthy:
                return None
            self.healthy.add(url)
            return UP
        n = self.failures[url] = self.failures.get(url, 0) + 1
        if n >= self.max_failures and url in self.healthy:
            self.healthy.discard(url)
            self.n_dropped += 1
            return DROPPED
        return None

    def forget_unregistered(self, registered: Iterable[str]) -> None:
        """Forget servers that are no longer registered (deregistered, or their entry expired)."""
        registered = set(registered)
        for url in (self.healthy | set(self.failures)) - registered:
            self.healthy.discard(url)
            self.failures.pop(url, None)
            self.reported_versions.pop(url, None)
