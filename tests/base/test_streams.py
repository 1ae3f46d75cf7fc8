"""Trajectory stream (PUSH/PULL + StreamDataset) and master/worker request-reply, on real sockets."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from realhf.base import name_resolve, names
from realhf.system.push_pull_stream import NameResolvingZmqPuller, ZMQPuller, ZMQPusher, grouping
from realhf.system.request_reply_stream import MasterStream, RemoteError, WorkerStream
from realhf.system.stream_dataset import StreamDataset, StreamDatasetError, StreamTimeoutError

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    return subprocess.Popen([sys.executable, "-m", "helpers.stream_procs", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_four_pusher_processes_reach_two_puller_processes_exactly_once_in_order(
        redis_url, tmp_path, no_leftover_processes):
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


def test_stream_dataset_hands_out_parsed_items_and_drops_what_the_parser_rejects():
    def parse(item):
        if "n" not in item:
            raise ValueError("missing n")
        return item["n"] * 10

    puller = ZMQPuller()
    dataset = StreamDataset(puller, parse=parse)
    pusher = ZMQPusher(puller.address)
    try:
        for obj in ({"n": 1}, {"m": 0}, {"n": 2}):
            pusher.push(obj)
        assert dataset.get(2, timeout=10) == [10, 20]
        assert dataset.n_invalid == 1
    finally:
        pusher.close()
        dataset.close()


def test_stream_dataset_get_times_out_saying_how_many_it_had_and_loses_nothing():
    puller = ZMQPuller()
    dataset = StreamDataset(puller)
    pusher = ZMQPusher(puller.address)
    try:
        for n in range(3):
            pusher.push({"n": n})
        with pytest.raises(StreamTimeoutError, match="got 3 of 5") as e:
            dataset.get(5, timeout=1.0)
        assert e.value.n_have == 3
        pusher.push({"n": 3})
        assert [it["n"] for it in dataset.get(4, timeout=10)] == [0, 1, 2, 3]  # same order, none lost
    finally:
        pusher.close()
        dataset.close()


class _DyingPuller:
    def __init__(self):
        self.closed = False

    def pull(self, timeout):
        raise OSError("socket exploded")

    def close(self):
        self.closed = True


def test_stream_dataset_raises_the_pull_thread_error_to_the_caller():
    dataset = StreamDataset(_DyingPuller())
    time.sleep(0.2)
    with pytest.raises(StreamDatasetError, match="socket exploded"):
        dataset.get(1, timeout=1)
    dataset.close()


def test_stream_dataset_close_stops_its_thread_and_refuses_later_gets():
    puller = ZMQPuller()
    dataset = StreamDataset(puller)
    dataset.close()
    assert not dataset._thread.is_alive()
    with pytest.raises(StreamDatasetError, match="closed"):
        dataset.get(1, timeout=0.5)


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


# ---- request / reply ---------------------------------------------------------------------------


def _serve(stream: WorkerStream, stop: threading.Event):
    while not stop.is_set():
        req = stream.poll(0.1)
        if req is None:
            continue
        if req.handle_name == "echo":
            stream.reply(req, {"worker": stream.index, "got": req.data})
        elif req.handle_name == "boom":
            try:
                raise ValueError("bad batch")
            except ValueError as e:
                stream.reply_error(req, e)
        elif req.handle_name == "slow":
            time.sleep(1.0)
            stream.reply(req, "late")


@pytest.fixture
def rr_pair(redis_name_resolve):
    master = MasterStream("rr", "t", n_workers=2)
    workers = [WorkerStream("rr", "t", i, discovery_timeout=10) for i in range(2)]
    stop = threading.Event()
    threads = [threading.Thread(target=_serve, args=(w, stop), daemon=True) for w in workers]
    for t in threads:
        t.start()
    master.wait_for_workers(timeout=10)
    yield master
    stop.set()
    for t in threads:
        t.join(timeout=5)
    for w in workers:
        w.close()
    master.close()


def test_request_reply_routes_by_worker_index_and_matches_request_ids(rr_pair):
    master = rr_pair
    assert master.call(1, "echo", {"x": np.arange(3)}, timeout=10)["worker"] == 1
    replies = master.call_all("echo", per_worker_data={0: "a", 1: "b"}, timeout=10)
    assert [(r["worker"], r["got"]) for r in replies] == [(0, "a"), (1, "b")]


def test_remote_exception_is_reraised_on_the_master_with_type_and_worker(rr_pair):
    with pytest.raises(RemoteError) as e:
        rr_pair.call(1, "boom", timeout=10)
    assert e.value.type == "ValueError" and e.value.worker == 1 and "bad batch" in e.value.message
    assert rr_pair.call(1, "echo", 5, timeout=10)["got"] == 5  # the stream is still usable


def test_request_timeout_names_the_handler_and_worker(rr_pair):
    with pytest.raises(TimeoutError, match="slow@worker0"):
        rr_pair.call(0, "slow", timeout=0.2)


def test_master_times_out_naming_workers_that_never_connected(redis_name_resolve):
    master = MasterStream("rr", "lonely", n_workers=2)
    try:
        with pytest.raises(TimeoutError, match=r"model workers \[0, 1\]"):
            master.wait_for_workers(timeout=0.5)
    finally:
        master.close()
