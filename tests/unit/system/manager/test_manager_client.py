"""Specification of the ManagerClient (realhf/system/manager/manager_client.py) against the real manager
app over HTTP: each call of the rollout side, and errors that name the URL."""

import asyncio

import aiohttp
import pytest

from helpers.manager_harness import fake_servers, running_manager
from realhf.system.manager.manager_client import ManagerClient
from realhf.system.streams.http_json import GenerationError, ServerUnavailableError

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("nr")]


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
    with (
        fake_servers(1) as (server,),
        running_manager([server.url], n_trainer_ranks=2, groups_per_step=2, max_head_offpolicyness=0) as m,
    ):

        async def calls(manager):
            return [await manager.allocate_rollout(q, 1) for q in ("a", "b")] + [await manager.allocate_rollout("c", 0)]

        assert _run(m.url, calls) == [(True, "ok"), (False, "staleness"), (True, "ok")]
        assert m.service.status()["per_rank"]["running"] == [1, 1]
        with pytest.raises(
            GenerationError, match="/allocate_rollout returned HTTP 422.*rank must be a trainer DP rank"
        ):
            _run(m.url, lambda manager: manager.allocate_rollout("d", 2))


def test_finishing_an_unknown_rollout_raises_naming_the_endpoint():
    with fake_servers(1) as (server,), running_manager([server.url]) as m:
        with pytest.raises(GenerationError, match="/finish_rollout returned HTTP 404"):
            _run(m.url, lambda manager: manager.finish_rollout("ghost", accepted=True))


def test_an_unreachable_manager_is_reported_as_unavailable_naming_the_url():
    with pytest.raises(ServerUnavailableError, match="127.0.0.1:9/allocate_rollout"):
        _run("http://127.0.0.1:9/", lambda manager: manager.allocate_rollout("q", 0), timeout=2)


def _reconnecting(url, calls, wait_timeout, stopped=lambda: False):
    from helpers.manager_harness import EXP, TRIAL
    from realhf.base import name_resolve, names

    key = names.gserver_manager(EXP, TRIAL)

    async def main():
        async with aiohttp.ClientSession() as session:
            return await calls(
                ManagerClient(
                    url,
                    lambda: session,
                    2.0,
                    resolve=lambda: name_resolve.get(key),
                    wait_timeout=wait_timeout,
                    stopped=stopped,
                )
            )

    return asyncio.run(main())


def test_a_call_waits_for_a_restarted_manager_at_its_new_address():
    """The launcher restarts a dead manager, which may listen on another port: the call retries,
    re-reading the registered address, and reaches the new one."""
    import threading
    import time

    from helpers.manager_harness import EXP, TRIAL
    from realhf.base import name_resolve, names

    key = names.gserver_manager(EXP, TRIAL)
    with fake_servers(1) as (server,):
        with running_manager([server.url]) as old:
            dead_url = old.url
        name_resolve.add(key, dead_url, replace=True)
        restarted = {}

        def restart_later():
            time.sleep(1.0)
            restarted["cm"] = running_manager([server.url])
            m = restarted["cm"].__enter__()
            name_resolve.add(key, m.url, replace=True)
            restarted["m"] = m

        t = threading.Thread(target=restart_later)
        t.start()
        try:
            t0 = time.monotonic()
            result = _reconnecting(dead_url, lambda manager: manager.allocate_rollout("q", 0), wait_timeout=30)
            waited = time.monotonic() - t0
        finally:
            t.join()
        try:
            assert result == (True, "ok") and waited >= 1.0
            assert restarted["m"].service.status()["running"] == 1
        finally:
            restarted["cm"].__exit__(None, None, None)


def test_a_manager_gone_longer_than_the_wait_fails_naming_the_setting():
    from helpers.manager_harness import EXP, TRIAL
    from realhf.base import name_resolve, names

    name_resolve.add(names.gserver_manager(EXP, TRIAL), "http://127.0.0.1:9", replace=True)
    with pytest.raises(ServerUnavailableError, match=r"longer than rollout.manager_wait_timeout=1s"):
        _reconnecting("http://127.0.0.1:9", lambda manager: manager.allocate_rollout("q", 0), wait_timeout=1)
    # At the end of a run (stopped) nothing is retried.
    with pytest.raises(ServerUnavailableError, match="127.0.0.1:9/allocate_rollout failed"):
        _reconnecting(
            "http://127.0.0.1:9",
            lambda manager: manager.allocate_rollout("q", 0),
            wait_timeout=60,
            stopped=lambda: True,
        )
