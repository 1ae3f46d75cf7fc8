"""No pickle is ever loaded from a socket, an HTTP body or a checkpoint path (issue 6, bullet 6).

The payload is a pickle whose loading would create a marker file (`open(marker, "w")` via
`__reduce__`). It is sent, in every pickle protocol, to every receiver realhf has: the
trajectory PULL socket behind a StreamDataset, the master's ROUTER and a model worker's DEALER,
and every HTTP endpoint of the GserverManager and of the native generation server — including
`/update_weights_from_disk` pointed at a directory whose `pytorch_model.bin` is that pickle.
Each receiver must count/refuse it, keep working, and the marker must never appear.
"""

import os
import pickle
import threading
import time

import pytest
import requests
import torch
import zmq

from realhf.api.trajectory import Sample, Trajectory
from realhf.base import name_resolve, names, serialization
from realhf.system.streams.push_pull_stream import ZMQPuller
from realhf.system.streams.request_reply_stream import MasterStream, WorkerStream
from realhf.system.trainer.stream_dataset import StreamDataset


class _Evil:
    """Unpickling this calls open(marker, "w"): the file appears iff something unpickled it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payloads(marker):
    return [pickle.dumps(_Evil(marker), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "PWNED"
    # Self-check: the payload really does create the file when unpickled.
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Evil(probe)))
    assert probe.exists()
    yield path
    assert not path.exists(), f"a pickle payload was executed: {path} exists"


def _trajectory(qid="q0"):
    return Trajectory(qid=qid, prompt_ids=[1, 2], samples=[Sample([3, 4], [-0.5, -0.25], [0, 0], 1.0)])


def test_trajectory_puller_counts_pickles_and_still_delivers(marker):
    puller = ZMQPuller()
    dataset = StreamDataset(puller, parse=Trajectory.from_msg)
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{puller.address}")
    try:
        payloads = _payloads(marker)
        for p in payloads:
            push.send(p)
        push.send(serialization.dumps(_trajectory("after").to_msg()))
        [item] = dataset.get(1, timeout=10)
        assert item.qid == "after"
        assert puller.n_malformed + dataset.n_invalid == len(payloads)
    finally:
        push.close()
        dataset.close()


def test_master_router_counts_pickles_and_still_serves_its_workers(marker, redis_name_resolve):
    master = MasterStream("nopickle", "t", n_workers=1)
    worker = WorkerStream("nopickle", "t", 0, discovery_timeout=10)
    ctx = zmq.Context.instance()
    intruder = ctx.socket(zmq.DEALER)
    intruder.setsockopt(zmq.LINGER, 0)
    try:
        master.wait_for_workers(timeout=10)
        intruder.connect(f"tcp://{master.address}")
        payloads = _payloads(marker)
        for p in payloads:
            intruder.send(p)
        deadline = time.monotonic() + 10
        while master.n_malformed < len(payloads) and time.monotonic() < deadline:
            master._receive(0.1)
        stop = threading.Event()

        def serve():
            while not stop.is_set():
                req = worker.poll(0.1)
                if req is not None:
                    worker.reply(req, {"echo": req.data})

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            assert master.call(0, "echo", [1, 2], timeout=10) == {"echo": [1, 2]}
        finally:
            stop.set()
            t.join(timeout=5)
        assert master.n_malformed == len(payloads)
    finally:
        intruder.close()
        worker.close()
        master.close()


def test_model_worker_dealer_drops_pickled_requests_and_takes_the_next_one(marker, redis_name_resolve):
    # Play the master: bind a ROUTER where the worker will look for it.
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    name_resolve.add(names.request_reply_master("nopickle", "w"), f"127.0.0.1:{port}", replace=True)
    worker = WorkerStream("nopickle", "w", 3, discovery_timeout=10)
    try:
        assert router.poll(10000), "the worker's hello did not arrive"
        identity, _ = router.recv_multipart()
        payloads = _payloads(marker)
        for p in payloads:
            router.send_multipart([identity, p])
        router.send_multipart(
            [identity, serialization.dumps({"request_id": "r1", "handler": 3, "handle_name": "ping", "data": None})]
        )
        got = None
        for _ in range(len(payloads) + 5):
            got = worker.poll(2.0)
            if got is not None:
                break
        assert got is not None and got.request_id == "r1" and got.handle_name == "ping"
        assert worker.n_malformed == len(payloads)
    finally:
        worker.close()
        router.close()
        name_resolve.delete(names.request_reply_master("nopickle", "w"))


def _endpoints(base_url):
    spec = requests.get(f"{base_url}/openapi.json", timeout=10).json()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


def _send_everywhere(base_url, payloads):
    """Every endpoint × payload × content type; returns (method, path, status) of the answers."""
    answers = []
    for method, path in _endpoints(base_url):
        for p in payloads:
            for ctype in ("application/octet-stream", "application/python-pickle", "application/json"):
                r = requests.request(method, f"{base_url}{path}", data=p, headers={"Content-Type": ctype}, timeout=30)
                answers.append((method, path, r.status_code))
    return answers


def test_every_manager_endpoint_refuses_pickle_bodies(marker, manager_server):
    url, service = manager_server
    answers = _send_everywhere(url, _payloads(marker))
    assert not [a for a in answers if a[2] >= 500], answers
    assert all(400 <= s < 500 for m, _, s in answers if m == "POST"), answers
    assert requests.post(f"{url}/allocate_rollout", json={"qid": "after-pickle", "rank": 0}, timeout=10).json()[
        "success"
    ]


def test_every_native_server_endpoint_refuses_pickle_bodies(marker, native_server):
    url, engine = native_server
    answers = _send_everywhere(url, _payloads(marker))
    requests.post(f"{url}/continue_generation", timeout=10)
    assert not [a for a in answers if a[2] >= 500], answers
    # Every POST that reads a body refuses it; the two body-less commands just run.
    assert all(
        400 <= s < 500 for m, p, s in answers if m == "POST" and p not in ("/continue_generation", "/flush_cache")
    ), answers
    r = requests.post(
        f"{url}/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}, timeout=30
    )
    assert r.status_code == 200, r.text


def test_update_weights_refuses_a_pickle_checkpoint(marker, native_server, tiny_model_path, tmp_path):
    """A directory with config.json and a pytorch_model.bin that is the payload: refused, not loaded."""
    url, engine = native_server
    bad = tmp_path / "pickled_ckpt"
    bad.mkdir()
    with open(os.path.join(tiny_model_path, "config.json")) as f:
        (bad / "config.json").write_text(f.read())
    torch.save({"model": _Evil(marker)}, bad / "pytorch_model.bin")
    before = engine.weight_version
    r = requests.post(
        f"{url}/update_weights_from_disk", json={"model_path": str(bad), "weight_version": 99}, timeout=60
    )
    assert 400 <= r.status_code < 500 and r.json()["success"] is False
    assert "safetensors" in r.json()["message"]
    assert engine.weight_version == before


def test_no_code_moves_python_objects_between_ranks_with_pickle():
    """torch.distributed's *_object helpers pickle what they send (and unpickle what a peer
    sends); between ranks the project moves msgpack bytes as uint8 tensors instead
    (realhf.system.trainer.group_exchange, realhf.impl.engine.pipeline_calls)."""
    import re
    from pathlib import Path

    from helpers.paths import REPO

    pickling = re.compile(
        r"\b(send_object_list|recv_object_list|broadcast_object_list|all_gather_object|gather_object|scatter_object_list)\b|\bimport pickle\b|\bpickle\.loads?\b|torch\.load\("
    )
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((Path(REPO) / "realhf").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pickling.search(line) and not line.lstrip().startswith("#") and "weights_only=True" not in line
    ]  # torch.load(weights_only=True) of the run's own files unpickles tensors and plain types only
    assert found == [], "\n".join(found)
