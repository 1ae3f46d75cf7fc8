"""What a rollout worker asks the GserverManager (its HTTP API: `realhf.system.manager.gserver_manager`).

    ok, reason = await manager.allocate_rollout(qid, rank)    # admission (docs/architecture.md §4)
    url, version = await manager.schedule_request(qid, ...)   # a server for the next chunk
    await manager.finish_rollout(qid, accepted, n_tokens, reason)  # frees the slot; counts if accepted
    r = await manager.abandon_rollouts(qids)                  # a dead incarnation's slots
    urls = await manager.routed_servers()                     # servers routed now

Every call has the same timeout (`timeout` s), and its errors name the URL: a refused or dropped
connection and HTTP 502/503 raise `ServerUnavailableError`, any other non-200 answer (404 for a
qid the manager does not know, 409 for scheduling one that is not running) `GenerationError`.

A manager that dies is restarted by the launcher (cluster.restart_policy.gserver_manager) and
continues from its admission ledger, possibly on another port. So with `resolve` (how to read the
manager's current URL) a call whose connection fails is retried, re-reading the URL each time, for
up to `wait_timeout` s (rollout.manager_wait_timeout) or until `stopped()` says the run ended; a
manager that answered with an HTTP error is not retried. An allocation whose first answer was
lost and whose retry is refused as a duplicate was admitted by the first: it counts as admitted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, List, Optional, Tuple

import aiohttp

from realhf.base import logging
from realhf.system.streams.http_json import GenerationError, ServerUnavailableError, request_json

logger = logging.getLogger("manager_client")

_DUPLICATE_QID = (
    "duplicate_qid"  # realhf.system.manager.staleness.DUPLICATE_QID (not imported: the wire is the contract)
)


class ManagerClient:
    def __init__(
        self,
        url: str,
        session: Callable[[], aiohttp.ClientSession],
        timeout: float = 30.0,
        *,
        resolve: Optional[Callable[[], str]] = None,
        wait_timeout: float = 0.0,
        stopped: Callable[[], bool] = lambda: False,
    ):
        """`session()` returns the kept-alive session to use (shared with the worker's other calls)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = session
        self._resolve, self._wait_timeout, self._stopped = resolve, wait_timeout, stopped
        self.n_reconnects = 0

    async def _post(self, endpoint: str, body: Optional[dict], method: str = "POST") -> Tuple[dict, bool]:
        """(answer, whether an earlier attempt of this call may have reached the manager)."""
        down_since, attempt = None, 0
        while True:
            try:
                answer = await request_json(self._session(), method, f"{self.url}/{endpoint}", self.timeout, body)
            except ServerUnavailableError as e:
                if e.status is not None or self._resolve is None or self._wait_timeout <= 0 or self._stopped():
                    raise  # it answered (overloaded, no server): the caller's to handle
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    logger.warning(
                        f"manager at {self.url} unreachable ({e}); retrying for up to "
                        f"{self._wait_timeout:.0f}s (rollout.manager_wait_timeout), re-reading its address"
                    )
                elif now - down_since > self._wait_timeout:
                    raise ServerUnavailableError(
                        f"{e} — unreachable for {now - down_since:.0f}s, longer than "
                        f"rollout.manager_wait_timeout={self._wait_timeout:g}s"
                    ) from None
                attempt += 1
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
                try:
                    self.url = self._resolve().rstrip("/")
                except Exception as re:  # noqa: BLE001 - not registered yet: keep the old one and retry
                    logger.debug(f"manager address not readable yet: {re}")
                continue
            if down_since is not None:
                self.n_reconnects += 1
                logger.info(f"manager reachable again at {self.url} after {time.monotonic() - down_since:.1f}s")
            return answer, down_since is not None

    async def allocate_rollout(self, qid: str, rank: int) -> Tuple[bool, str]:
        """(admitted, reason) for group `qid`, to be pushed to trainer DP rank `rank` (whose budget
        admits it); the reason names the capacity term that refused it."""
        r, retried = await self._post("allocate_rollout", {"qid": qid, "rank": int(rank)})
        ok, reason = bool(r.get("success")), str(r.get("reason", ""))
        if retried and not ok and reason == _DUPLICATE_QID:
            return True, "ok"  # only this worker allocates this qid: the lost answer had admitted it
        return ok, reason

    async def schedule_request(
        self,
        qid: str,
        prompt_len: int,
        group_size: int,
        new_token_budget: int,
        previous_url: Optional[str] = None,
        previous_version: Optional[int] = None,
    ) -> Tuple[str, int]:
        """(server url, trainer version) for the next request of group `qid`; the previous route
        keeps the group on its server while the version is unchanged."""
        r, _ = await self._post(
            "schedule_request",
            {
                "qid": qid,
                "prompt_len": prompt_len,
                "group_size": group_size,
                "new_token_budget": new_token_budget,
                "previous_server_url": previous_url,
                "previous_version": previous_version,
            },
        )
        try:
            return str(r["url"]), int(r["version"])
        except (KeyError, TypeError, ValueError):
            raise GenerationError(f"{self.url}/schedule_request answered {r!r}; expected {{url, version}}") from None

    async def finish_rollout(self, qid: str, accepted: bool, n_tokens: int = 0, reason: str = "filtered") -> None:
        """`reason`: why a rollout that is not accepted ended without a group
        (realhf.system.manager.admission_ledger.ENDED_REASONS); ignored when accepted."""
        await self._post(
            "finish_rollout", {"qid": qid, "accepted": bool(accepted), "n_tokens": int(n_tokens), "reason": reason}
        )

    async def routed_servers(self) -> List[str]:
        """The generation servers the manager routes to now (one it dropped after failed health
        checks is not among them)."""
        r, _ = await self._post("routed_servers", None, method="GET")
        servers = r.get("servers")
        if not isinstance(servers, list):
            raise GenerationError(f"{self.url}/routed_servers answered {r!r}; expected {{servers: [...]}}")
        return [str(u) for u in servers]

    async def abandon_rollouts(self, qids: List[str]) -> dict:
        """Free the slots of rollouts whose worker died; answers {abandoned, unknown}."""
        r, _ = await self._post("abandon_rollouts", {"qids": list(qids)})
        return r
