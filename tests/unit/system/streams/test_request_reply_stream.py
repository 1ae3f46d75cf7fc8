"""Master/worker request-reply on real sockets and real Redis: routing by worker index, remote
errors, and timeouts that name the handler and the workers."""

import threading
import time

import numpy as np
import pytest

from realhf.system.streams.request_reply_stream import MasterStream, RemoteError, WorkerStream

pytestmark = pytest.mark.system


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


def test_a_wait_on_a_worker_that_never_answers_ends_when_the_master_is_asked_to_stop(rr_pair):
    # A trainer that died never replies: the master, told to stop (the launcher's SIGTERM), must
    # not wait out request_timeout — before, it outlived the launcher's 6 s grace and was killed.
    class Stop(Exception):
        pass

    asked = time.monotonic() + 0.3

    def check_stop():
        if time.monotonic() > asked:
            raise Stop

    rr_pair.check_stop = check_stop
    t0 = time.monotonic()
    with pytest.raises(Stop):
        rr_pair.call(0, "never_answered", timeout=60)
    assert time.monotonic() - t0 < 2.0
