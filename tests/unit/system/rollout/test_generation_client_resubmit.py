"""The rollout side of a dying generation server, on real HTTP: the manager drops a server that
stops answering /health, and the GenerationClient resubmits the request elsewhere keeping the
tokens it already has; with no server at all it waits (bounded) instead of failing."""

import asyncio
import threading
import time

import pytest

from helpers.fake_sglang import FakeSGLangServer
from helpers.manager_harness import EXP, TRIAL, running_manager
from realhf.api.cli_args import GenerationHyperparameters
from realhf.base import name_resolve, names
from realhf.system.rollout.generation_client import GenerationClient
from realhf.system.streams.http_json import GenerationError

pytestmark = pytest.mark.system

FAST_HEALTH = {"health_check_interval": 0.1, "health_timeout": 1.0, "max_health_failures": 2}


def _routed(m):
    return m.service.router.servers()


def test_a_server_killed_between_chunks_is_dropped_and_the_answer_completes_elsewhere_with_its_tokens(nr):
    gconfig = GenerationHyperparameters(max_new_tokens=16)
    a = FakeSGLangServer(token_delay=0.02).start()
    b = FakeSGLangServer(token_delay=0.02).start()
    try:
        with running_manager([a.url, b.url], **FAST_HEALTH) as m:

            def kill_a_after_its_first_chunk():
                while not a.requests:
                    time.sleep(0.005)
                a.stop()

            async def main():
                async with GenerationClient(m.url, new_tokens_per_chunk=4, server_wait_timeout=30) as client:
                    await client.manager.allocate_rollout("g", 0)
                    killer = threading.Thread(target=kill_a_after_its_first_chunk)
                    killer.start()
                    # Round robin: the group's first request goes to the first server, a.
                    r = await client.generate("g", [3, 5], gconfig)
                    killer.join()
                    return r, client.n_unavailable

            r, n_unavailable = asyncio.run(main())
            deadline = time.monotonic() + 10
            while a.url in _routed(m) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _routed(m) == [b.url]  # dropped from routing
            assert m.service.status()["servers_dropped"] == 1
    finally:
        a.stop()
        b.stop()
    assert len(r.output_ids) == 16 and len(r.logprobs) == 16 and r.versions == [0] * 16
    assert n_unavailable >= 1
    # b continued from where a stopped: its first request already carried a's tokens.
    assert b.requests and b.requests[0]["input_len"] >= 2 + 4


def test_with_no_live_server_requests_wait_and_resume_when_one_comes_back(nr):
    gconfig = GenerationHyperparameters(max_new_tokens=8)
    a = FakeSGLangServer().start()
    b = FakeSGLangServer()
    try:
        with running_manager([a.url], **FAST_HEALTH) as m:
            a.stop()
            deadline = time.monotonic() + 10
            while _routed(m) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _routed(m) == []  # nothing alive: /schedule_request answers 503

            def bring_b_up_later():
                time.sleep(1.0)
                b.start()
                name_resolve.add_subentry(names.gen_servers(EXP, TRIAL), b.url)

            async def main():
                async with GenerationClient(m.url, server_wait_timeout=60) as client:
                    await client.manager.allocate_rollout("g", 0)
                    t = threading.Thread(target=bring_b_up_later)
                    t.start()
                    r = await client.generate("g", [1, 2], gconfig)
                    t.join()
                    return r, client.n_unavailable

            r, n_unavailable = asyncio.run(main())
    finally:
        a.stop()
        b.stop()
    assert len(r.output_ids) == 8 and n_unavailable >= 1 and len(b.requests) == 1


def test_waiting_for_a_server_is_bounded_and_the_error_says_so(nr):
    gconfig = GenerationHyperparameters(max_new_tokens=8)
    a = FakeSGLangServer().start()
    try:
        with running_manager([a.url], **FAST_HEALTH) as m:
            a.stop()

            async def main():
                async with GenerationClient(m.url, server_wait_timeout=1.0) as client:
                    await client.manager.allocate_rollout("g", 0)
                    await client.generate("g", [1, 2], gconfig)

            with pytest.raises(GenerationError, match="server_wait_timeout=1s"):
                asyncio.run(main())
    finally:
        a.stop()
