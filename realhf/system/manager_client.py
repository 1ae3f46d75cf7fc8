"""What a rollout worker asks the GserverManager (its HTTP API: `realhf.system.gserver_manager`).

    ok, reason = await manager.allocate_rollout(qid, rank)    # admission (docs/architecture.md §4)
    url, version = await manager.schedule_request(qid, ...)   # a server for the next chunk
    await manager.finish_rollout(qid, accepted, n_tokens)     # frees the slot; counts if accepted
    r = await manager.abandon_rollouts(qids)                  # a dead incarnation's slots

Every call has the same timeout (`timeout` s), and its errors name the URL: a refused or dropped
connection and HTTP 502/503 raise `ServerUnavailableError`, any other non-200 answer (404 for a
qid the manager does not know, 409 for scheduling one that is not running) `GenerationError`.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import aiohttp

from realhf.system.http_json import GenerationError, post_json


class ManagerClient:
    def __init__(self, url: str, session: Callable[[], aiohttp.ClientSession], timeout: float = 30.0):
        """`session()` returns the kept-alive session to use (shared with the worker's other calls)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = session

    async def _post(self, endpoint: str, body: dict) -> dict:
        return await post_json(self._session(), f"{self.url}/{endpoint}", body, self.timeout)

    async def allocate_rollout(self, qid: str, rank: int) -> Tuple[bool, str]:
        """(admitted, reason) for group `qid`, to be pushed to trainer DP rank `rank` (whose budget
        admits it); the reason names the capacity term that refused it."""
        r = await self._post("allocate_rollout", {"qid": qid, "rank": int(rank)})
        return bool(r.get("success")), str(r.get("reason", ""))

    async def schedule_request(self, qid: str, prompt_len: int, group_size: int, new_token_budget: int,
                               previous_url: Optional[str] = None,
                               previous_version: Optional[int] = None) -> Tuple[str, int]:
        """(server url, trainer version) for the next request of group `qid`; the previous route
        keeps the group on its server while the version is unchanged."""
        r = await self._post("schedule_request", {
            "qid": qid, "prompt_len": prompt_len, "group_size": group_size, "new_token_budget": new_token_budget,
            "previous_server_url": previous_url, "previous_version": previous_version})
        try:
            return str(r["url"]), int(r["version"])
        except (KeyError, TypeError, ValueError):
            raise GenerationError(f"{self.url}/schedule_request answered {r!r}; expected {{url, version}}") from None

    async def finish_rollout(self, qid: str, accepted: bool, n_tokens: int = 0) -> None:
        await self._post("finish_rollout", {"qid": qid, "accepted": bool(accepted), "n_tokens": int(n_tokens)})

    async def abandon_rollouts(self, qids: List[str]) -> dict:
        """Free the slots of rollouts whose worker died; answers {abandoned, unknown}."""
        return await self._post("abandon_rollouts", {"qids": list(qids)})
