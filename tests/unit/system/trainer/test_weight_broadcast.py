"""weight_sync=distributed against real servers: `python -m realhf.launch_server` subprocesses join
the trainer's gloo group through SGLang's HTTP protocol and take new weights from its broadcast;
servers killed or hung mid-broadcast cost the trainer a bounded wait, never a hang."""

import contextlib
import os
import signal
import threading
import time

import pytest
import torch

from helpers.http import http
from helpers.native_server import launch_server
from helpers.tcp_proxy import TcpProxy
from helpers.weight_checks import hf_greedy, perturbed, served
from realhf.system.trainer.weight_broadcast import Members, WeightBroadcaster, buckets

pytestmark = pytest.mark.system

FLAGS = ["--n-threads", "1", "--max-running-requests", "8", "--context-length", "128"]


@contextlib.contextmanager
def servers(n, model_path, tmp_path):
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(launch_server(tmp_path / f"s{i}.log", "--model-path", model_path, *FLAGS))
            for i in range(n)
        ]


def killing(proc, items, after):
    """`items`, the server `proc` killed once `after` of them have been taken: the broadcast is
    then between buckets, some sent and some not."""
    for i, item in enumerate(items):
        if i == after:
            proc.kill()
            proc.wait()
        yield item


def broadcaster(urls, timeout_s=20.0, bucket_bytes=1 << 16):
    return WeightBroadcaster(lambda: list(urls), "127.0.0.1", "gloo", timeout_s, bucket_bytes)


def test_buckets_bound_their_size_and_keep_order():
    ts = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    got = list(buckets(ts, bucket_bytes=25 * 4))
    assert [[n for n, _ in b] for b in got] == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]


def test_two_servers_take_the_broadcast_weights_and_answer_as_hf_does(qwen_path, tmp_path, no_leftover_processes):
    with servers(2, qwen_path, tmp_path) as launched:
        urls = [u for _, u in launched]
        before = [served(u)[1] for u in urls]
        model = perturbed(qwen_path, 1)
        expected = hf_greedy(model)
        assert before[0] != expected, "the perturbation must change the greedy answer for this test to mean anything"
        b = broadcaster(urls)
        try:
            r = b.publish(5, model.state_dict().items())
            assert r.ok, r.failed
            assert r.servers == sorted(urls) and r.rebuilt and r.n_buckets > 1
            for u in urls:
                assert served(u) == (5, expected)
            assert b.missing(5) == [] and b.missing(6) == sorted(urls)
            model2 = perturbed(qwen_path, 2)
            r = b.publish(6, model2.state_dict().items())
            assert r.ok and not r.rebuilt  # the same members: the same group
            for u in urls:
                assert served(u) == (6, hf_greedy(model2))
            # The same version again (the catch-up, for a joiner): received by every member, and a
            # member that already serves it swaps nothing, so its running requests are not aborted.
            r = b.publish(6, model2.state_dict().items())
            assert r.ok and not r.rebuilt
            for i, u in enumerate(urls):
                assert served(u) == (6, hf_greedy(model2))
                log = (tmp_path / f"s{i}.log").read_text()
                assert "weight version 6 from " in log and "already served here, nothing swapped" in log, log[-2000:]
                assert log.count("-> v6 ") == 1, log[-2000:]
            # Versions never go back: the bucket is received (the sender would wait) and refused.
            r = b.publish(4, model.state_dict().items())
            assert not r.ok and all("lower than the served version 6" in r.failed[u] for u in urls), r.failed
            assert [served(u) for u in urls] == [(6, hf_greedy(model2))] * 2
            # A server that joins now (the manager lists it) has not had version 6: what the
            # trainer sends again while it waits for data (the model worker's catch_up).
            urls.append("http://127.0.0.1:9")
            assert b.missing(6) == ["http://127.0.0.1:9"]
            # One the manager keeps out of routing (joining) although it was sent version 6: a
            # restart at the same address, say.
            b._members = lambda: Members(urls[:1], urls[1:2])
            assert b.missing(6) == [urls[1]]
        finally:
            b.close()


def test_a_server_killed_mid_broadcast_costs_one_version_not_the_run(qwen_path, tmp_path, no_leftover_processes):
    with servers(2, qwen_path, tmp_path) as launched:
        (victim, victim_url), (_, survivor) = launched
        model = perturbed(qwen_path, 3)
        # Small buckets: the broadcast takes many round trips, so the kill lands inside it.
        b = broadcaster([victim_url, survivor], timeout_s=10.0, bucket_bytes=2048)
        try:
            assert b.publish(1, model.state_dict().items()).ok
            t0 = time.monotonic()
            r = b.publish(2, killing(victim, perturbed(qwen_path, 4).state_dict().items(), after=10))
            took = time.monotonic() - t0
            assert not r.ok and r.failed, "the kill must land inside the broadcast"
            assert took < 10.0 + 5, f"a dead peer must fail the broadcast promptly, took {took:.1f}s"
            # The survivor still serves, at the last whole version (a broken broadcast swaps nothing in).
            assert served(survivor) == (1, hf_greedy(model))
            # Still routed (the manager has not noticed yet): the new group's rendezvous would wait
            # for it until the timeout, but its refused /init_weights_update_group ends the wait.
            t0 = time.monotonic()
            r = b.publish(3, perturbed(qwen_path, 5).state_dict().items())
            assert not r.ok and victim_url in r.failed and time.monotonic() - t0 < 5, (r.failed, time.monotonic() - t0)
            # The next version builds a group of whoever is routed now and gets through.
            b._members = lambda: [survivor]
            model4 = perturbed(qwen_path, 11)
            r = b.publish(4, model4.state_dict().items())
            assert r.ok and r.rebuilt and r.servers == [survivor]
            assert served(survivor) == (4, hf_greedy(model4))
        finally:
            b.close()


@pytest.mark.slow  # CI time: a stopped server costs the whole timeout; the partition test below is its fast kin
def test_a_hung_server_times_out_and_the_others_continue(qwen_path, tmp_path, no_leftover_processes):
    with servers(2, qwen_path, tmp_path) as launched:
        (hung, hung_url), (_, survivor) = launched
        model = perturbed(qwen_path, 6)
        b = broadcaster([hung_url, survivor], timeout_s=3.0)
        try:
            assert b.publish(1, model.state_dict().items()).ok
            os.kill(hung.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            r = b.publish(2, perturbed(qwen_path, 7).state_dict().items())
            took = time.monotonic() - t0
            assert not r.ok and hung_url in r.failed
            assert took < 3.0 * 3 + 5, f"bounded by the timeout, took {took:.1f}s"
            # The survivor was continued after the failed version: it generates, at version 1.
            assert served(survivor) == (1, hf_greedy(model))
        finally:
            os.kill(hung.pid, signal.SIGCONT)
            b.close()


def test_the_receiving_side_refuses_what_it_cannot_do(qwen_path, tmp_path, no_leftover_processes):
    with servers(1, qwen_path, tmp_path) as [(_, url)]:
        status, body = http(
            "POST",
            f"{url}/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2, "backend": "nccl"},
        )
        assert status == 400 and "ask for 'gloo'" in body["message"]
        status, body = http(
            "POST", f"{url}/update_weights_from_distributed", {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]]}
        )
        assert status == 400 and "no weight group 'weight_update_group'" in body["message"]
        status, body = http("POST", f"{url}/destroy_weights_update_group", {"group_name": "nope"})
        assert status == 400 and body["success"] is False and "was not joined" in body["message"]  # as SGLang


def test_a_partitioned_member_is_given_up_when_it_leaves_routing_not_at_the_timeout(
    qwen_path, tmp_path, no_leftover_processes
):
    """Its HTTP calls blackholed (its gloo connection is direct): the broadcast waits in gloo for a
    member that never joins it, so the trainer must stop waiting once the manager drops it."""
    with servers(2, qwen_path, tmp_path) as launched:
        (_, cut_url), (_, survivor) = launched
        host, port = cut_url.rsplit("/", 1)[-1].split(":")
        with TcpProxy(host, int(port)) as proxy:
            members = [proxy.url, survivor]
            b = WeightBroadcaster(lambda: list(members), "127.0.0.1", "gloo", 30.0, 1 << 20, pause=False)
            try:
                model = perturbed(qwen_path, 8)
                assert b.publish(1, model.state_dict().items()).ok
                proxy.cut("blackhole")
                threading.Timer(2.0, members.remove, args=(proxy.url,)).start()  # the manager drops it
                t0 = time.monotonic()
                r = b.publish(2, perturbed(qwen_path, 9).state_dict().items())
                took = time.monotonic() - t0
                assert not r.ok and "left routing" in r.failed[proxy.url], r.failed
                assert took < 10, f"given up {took:.1f}s after the start, want ~2 s (not the 30 s timeout)"
                model3 = perturbed(qwen_path, 10)
                r = b.publish(3, model3.state_dict().items())
                assert r.ok and r.rebuilt and r.servers == [survivor], r.failed
                assert served(survivor) == (3, hf_greedy(model3))
            finally:
                b.close()
