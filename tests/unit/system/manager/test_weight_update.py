"""A weight-update round and a server that stops answering mid-update (issue 27 item 9: a
partitioned server). The round must not wait `update_timeout` on it once the manager dropped it
from routing — the other servers would keep old weights, and their groups go stale, that long —
and the server, possibly left paused, gets its continue when it is routed again."""

import asyncio
import os
import time

import aiohttp

from helpers.fake_sglang import FakeSGLangServer
from helpers.tcp_proxy import TcpProxy
from realhf.base.trial_files import published_version_dir
from realhf.system.manager.weight_update import WeightUpdater


async def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_server_dropped_mid_update_is_given_up_at_once_and_continued_when_it_is_back(tmp_path):
    run_dir = str(tmp_path)
    os.makedirs(published_version_dir(run_dir, "actor", 1))
    with FakeSGLangServer(update_delay=1.0) as a, FakeSGLangServer() as b:
        host, port = a.url.rsplit("/", 1)[-1].split(":")
        with TcpProxy(host, int(port)) as proxy:
            updater = WeightUpdater(run_dir, "actor", timeout=60.0)  # the default is 300 s
            updater.set_servers([proxy.url, b.url])

            async def scenario():
                async with aiohttp.ClientSession() as session:
                    round_ = asyncio.create_task(updater.run_round(session, lambda: 1))
                    await _until(lambda: "pause" in a.event_names(), 10, "server A paused by the round")
                    proxy.cut("blackhole")  # A's answers stop arriving: the round hangs on A
                    await asyncio.sleep(0.5)
                    assert not round_.done()
                    t_drop = time.monotonic()
                    updater.set_servers([b.url])  # the manager dropped A after its failed health checks
                    await asyncio.wait_for(round_, 5)
                    given_up_s = time.monotonic() - t_drop

                    assert updater.versions == {b.url: 1} and b.event_names() == ["pause", "update", "continue"]
                    assert updater.owes_continue == {proxy.url} and updater.n_abandoned == 1
                    assert updater.n_failures == 0 and updater.retry_at == {}  # no back-off for anyone
                    await _until(lambda: a.weight_version == 1, 10, "A to finish loading on its side")
                    assert "continue" not in a.event_names()  # A is left paused

                    proxy.heal()
                    updater.set_servers([proxy.url, b.url])
                    updater.versions[proxy.url] = a.weight_version  # what A reports when it rejoins
                    assert updater.due(1)  # nothing to load, but A owes a continue
                    await asyncio.wait_for(updater.run_round(session, lambda: 1), 10)
                    return given_up_s

            given_up_s = asyncio.run(scenario())
            assert given_up_s < 2.0, given_up_s
            assert a.event_names()[-1] == "continue" and updater.owes_continue == set()
            assert not updater.due(1)


def test_a_version_pruned_before_the_server_loaded_it_is_skipped_for_the_newest_without_back_off(tmp_path):
    """A server paused mid-update (SIGSTOP) came back to a version the trainer had since pruned;
    it then waited a back-off at old weights and everything it generated was dropped as stale
    (65 groups in one second of a chaos run). Now the next round loads the newest version."""
    run_dir = str(tmp_path)
    os.makedirs(published_version_dir(run_dir, "actor", 5))  # version 3 is already pruned
    targets = iter([3, 5, 5, 5])

    with FakeSGLangServer(check_model_path=True) as server:
        updater = WeightUpdater(run_dir, "actor", timeout=10.0)
        updater.set_servers([server.url])

        async def rounds():
            async with aiohttp.ClientSession() as session:
                await updater.run_round(session, lambda: next(targets))
                assert updater.n_failures == 0 and updater.n_superseded == 1 and updater.due(5)
                await updater.run_round(session, lambda: next(targets))

        asyncio.run(rounds())
        assert updater.versions == {server.url: 5} and server.weight_version == 5 and updater.n_failures == 0


def test_a_missing_version_that_is_still_the_newest_is_a_failure_with_back_off(tmp_path):
    with FakeSGLangServer(check_model_path=True) as server:
        updater = WeightUpdater(str(tmp_path), "actor", timeout=10.0)
        updater.set_servers([server.url])

        async def one_round():
            async with aiohttp.ClientSession() as session:
                await updater.run_round(session, lambda: 3)

        asyncio.run(one_round())
        assert updater.n_failures == 1 and not updater.due(3)
