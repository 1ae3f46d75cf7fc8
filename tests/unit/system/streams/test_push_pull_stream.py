"""The trajectory stream on real sockets: the grouping of pushers to pullers (docs/architecture.md
§6), PUSH/PULL across processes, garbage on the wire, registration, and send timeouts."""

import json
import os
import subprocess
import sys

import pytest
import zmq

from helpers.paths import TESTS_DIR
from realhf.base import name_resolve, names
from realhf.system.streams.push_pull_stream import NameResolvingZmqPuller, ZMQPuller, ZMQPusher, grouping
from realhf.system.trainer.stream_dataset import StreamDataset

# ---- grouping (docs/architecture.md §6) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_senders, n_receivers, expected",
    [
        (5, 2, {0: [0, 1, 4], 1: [2, 3]}),
        (4, 2, {0: [0, 1], 1: [2, 3]}),
        (1, 1, {0: [0]}),
        (3, 3, {0: [0], 1: [1], 2: [2]}),
        (7, 3, {0: [0, 1, 6], 1: [2, 3], 2: [4, 5]}),
        (8, 3, {0: [0, 1, 6], 1: [2, 3, 7], 2: [4, 5]}),
    ],
)
def test_grouping_gives_contiguous_blocks_then_the_remainder_one_each(n_senders, n_receivers, expected):
    assert grouping(n_senders, n_receivers) == expected


def test_grouping_refuses_receivers_without_a_sender():
    with pytest.raises(ValueError, match="every receiver"):
        grouping(1, 2)
    with pytest.raises(ValueError):
        grouping(3, 0)


# ---- PUSH/PULL across processes ----------------------------------------------------------------


def _spawn(args):
    env = dict(os.environ, PYTHONPATH=TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "helpers.stream_procs", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.system
def test_four_pusher_processes_reach_two_puller_processes_exactly_once_in_order(
    redis_url, tmp_path, no_leftover_processes
):
    n_pushers, n_pullers, n_msgs = 4, 2, 300
    exp, trial = "streams", f"t{os.getpid()}"
    groups = grouping(n_pushers, n_pullers)
    pullers = [
        _spawn(["puller", redis_url, exp, trial, r, len(groups[r]) * n_msgs, tmp_path / f"p{r}.json"])
        for r in range(n_pullers)
    ]
    pushers = [_spawn(["pusher", redis_url, exp, trial, i, n_pushers, n_pullers, n_msgs]) for i in range(n_pushers)]
    try:
        for p in pushers + pullers:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out.decode()[-3000:]
    finally:
        for p in pushers + pullers:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in range(n_pullers):
        result = json.loads((tmp_path / f"p{r}.json").read_text())
        assert result["malformed"] == 0 and result["extra"] == 0
        order = result["order"]
        assert sorted({p for p, _ in order}) == groups[r]  # only its own pushers
        for pusher in groups[r]:
            seqs = [s for p, s in order if p == pusher]
            assert seqs == list(range(n_msgs)), f"pusher {pusher} → puller {r}: lost, duplicated or reordered"


def test_puller_counts_and_drops_garbage_and_keeps_delivering():
    puller = ZMQPuller()
    dataset = StreamDataset(puller)
    pusher = ZMQPusher(puller.address)
    try:
        pusher.push({"n": 1})
        pusher.push_bytes(b"\xc1 definitely not msgpack")
        import pickle

        pusher.push_bytes(pickle.dumps({"evil": True}))
        pusher.push({"n": 2})
        items = dataset.get(2, timeout=10)
        assert [it["n"] for it in items] == [1, 2]
        assert puller.n_malformed == 2
    finally:
        pusher.close()
        dataset.close()


@pytest.mark.system
def test_name_resolving_puller_registers_and_deregisters(redis_name_resolve):
    puller = NameResolvingZmqPuller("streams", "reg", 1)
    assert name_resolve.get(names.stream_puller("streams", "reg", 1)) == puller.address
    assert name_resolve.get_subtree(names.stream_pullers("streams", "reg")) == ["1"]
    puller.close()
    assert name_resolve.find_subtree(names.trial_root("streams", "reg")) == []


def test_push_times_out_naming_the_puller_when_nobody_receives():
    ctx = zmq.Context.instance()
    sink = ctx.socket(zmq.PULL)  # bound but never read, tiny buffers: the pusher must block
    sink.setsockopt(zmq.RCVHWM, 1)
    sink.setsockopt(zmq.RCVBUF, 4096)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    pusher = ZMQPusher(f"127.0.0.1:{port}", send_timeout=0.5, hwm=1)
    try:
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
            for _ in range(10000):
                pusher.push_bytes(b"x" * 65536)
    finally:
        pusher._sock.setsockopt(zmq.LINGER, 0)
        pusher.close()
        sink.close(linger=0)


def test_a_message_over_the_receivers_limit_is_refused_at_the_sender_and_never_sent():
    from realhf.system.streams.push_pull_stream import MessageTooLarge

    puller = ZMQPuller(max_message_bytes=4096)
    pusher = ZMQPusher(puller.address, max_message_bytes=4096)
    try:
        # Before: the receiving libzmq dropped it without a word (and the sender's connection).
        with pytest.raises(MessageTooLarge, match=r"a message of \d+ bytes exceeds cluster.max_message_bytes=4096"):
            pusher.push({"qid": "huge", "tokens": list(range(20000))})
        pusher.push({"qid": "small"})
        assert puller.pull(timeout=10)["qid"] == "small"
        with pytest.raises(TimeoutError):
            puller.pull(timeout=0.3)  # nothing else was sent
    finally:
        pusher.close()
        puller.close()
