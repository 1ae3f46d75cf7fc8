"""Specification of the ManagerClient (realhf/system/manager_client.py) against the real manager
app over HTTP: each call of the rollout side, and errors that name the URL."""

import asyncio

import aiohttp
import pytest

from realhf.system.http_json import GenerationError, ServerUnavailableError
from realhf.system.manager_client import ManagerClient

from helpers.manager_harness import fake_servers, running_manager

pytestmark = pytest.mark.usefixtures("nr")


def _run(url, calls, timeout=10.0):
    async def main():
        async with aiohttp.ClientSession() as session:
            return await calls(ManagerClient(url, lambda: session, timeout))

    return asyncio.run(main())


def test_allocate_schedule_finish_and_abandon_round_trip():
    with fake_servers(1) as (server,), running_manager([server.url]) as m:
        async def calls(manager):
            admitted = [await manager.allocate_rollout(q, 0) for q in ("a", "b")]
            route = await manager.schedule_request("a", prompt_len=3, group_size=2, new_token_budget=8)
            await manager.finish_rollout("a", accepted=True, n_tokens=16)
            abandoned = await manager.abandon_rollouts(["b", "never-allocated"])
            return admitted, route, abandoned

        admitted, route, abandoned = _run(m.url, calls)
        assert admitted == [(True, "ok"), (True, "ok")]
        assert route == (server.url, 0)
        assert abandoned == {"abandoned": 1, "unknown": 1}
        assert m.service.status()["accepted"] == 1 and m.service.status()["running"] == 0


def test_allocate_sends_the_rank_whose_budget_admits_the_group():
    with fake_servers(1) as (server,), running_manager([server.url], n_trainer_ranks=2, groups_per_step=2,
                                                       max_head_offpolicyness=0) as m:
        async def calls(manager):
            return [await manager.allocate_rollout(q, 1) for q in ("a", "b")] + [await manager.allocate_rollout("c", 0)]

        assert _run(m.url, calls) == [(True, "ok"), (False, "staleness"), (True, "ok")]
        assert m.service.status()["per_rank"]["running"] == [1, 1]
        with pytest.raises(GenerationError, match="/allocate_rollout returned HTTP 422.*rank must be a trainer DP rank"):
            _run(m.url, lambda manager: manager.allocate_rollout("d", 2))


def test_finishing_an_unknown_rollout_raises_naming_the_endpoint():
    with fake_servers(1) as (server,), running_manager([server.url]) as m:
        with pytest.raises(GenerationError, match="/finish_rollout returned HTTP 404"):
            _run(m.url, lambda manager: manager.finish_rollout("ghost", accepted=True))


def test_an_unreachable_manager_is_reported_as_unavailable_naming_the_url():
    with pytest.raises(ServerUnavailableError, match="127.0.0.1:9/allocate_rollout"):
        _run("http://127.0.0.1:9/", lambda manager: manager.allocate_rollout("q", 0), timeout=2)
