"""A native generation server in the test process: the engine thread plus uvicorn on 127.0.0.1."""

import contextlib
import os
import re
import subprocess
import sys
import time

import pytest

from helpers.http import http
from helpers.wait import stop_process

# The inference tests' server: long enough that a pause can catch requests mid-answer; the slot
# cache stays small (2 layers).
CONTEXT, SLOTS = 2048, 96
# The default (security tests'): small, so fuzzed /generate bodies that fit finish in a few decode steps.
SMALL_CONTEXT, SMALL_SLOTS = 64, 8


@contextlib.contextmanager
def serve_native(model_path: str, context_length: int, slots: int):
    """(url, engine) of a native server on `model_path`, stopped on exit."""
    from realhf.impl.inference.factory import create_engine
    from realhf.system.gen_server.server_app import create_app
    from realhf.system.streams.http_thread import HttpServerThread

    engine = create_engine(model_path, max_running_requests=slots, context_length=context_length, seed=1).start()
    server = HttpServerThread(create_app(engine), "127.0.0.1", 0, name="generation-server")
    try:
        server.start(timeout=30)
        yield server.url, engine
    finally:
        server.stop()
        engine.stop()


def held_tensors(obj, path: str = "engine", _seen=None):
    """(attribute path, tensor) for every tensor reachable from `obj` through the attributes of
    realhf / torch / transformers objects, dataclasses, lists, tuples and dicts: the state an
    engine or runner keeps between steps (weights, KV cache, slots, buffers)."""
    import collections

    import torch

    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple, set, collections.deque)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("realhf", "torch", "transformers"):
        items = vars(obj).items()
    else:
        return
    for key, value in items:
        yield from held_tensors(value, f"{path}.{key}", seen)


@contextlib.contextmanager
def decode_fails_once(engine, message: str = "injected fault in the decode step"):
    """The engine's next decode step raises RuntimeError(message); later ones run normally."""
    decode = engine.runner.decode
    calls = {"n": 0}

    def failing_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError(message)
        return decode(*args, **kwargs)

    engine.runner.decode = failing_once
    try:
        yield
    finally:
        engine.runner.decode = decode


def make_decode_hang(engine, on_hang=lambda: None):
    """From now on the engine's decode steps block forever (a hung engine: the thread is alive,
    /health answers, nothing is decoded); returns an Event that releases them."""
    import threading

    release = threading.Event()
    decode = engine.runner.decode

    def hanging(*args, **kwargs):
        on_hang()
        release.wait()
        return decode(*args, **kwargs)

    engine.runner.decode = hanging
    return release


@contextlib.contextmanager
def launch_server(log_path, *args):
    """(process, url) of `python -m realhf.launch_server ARGS --port 0`, stopped on exit."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "realhf.launch_server", *args, "--host", "127.0.0.1", "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            m = re.search(r"ready at (http://127\.0\.0\.1:\d+)", log_path.read_text())
            if m:
                url = m.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"launch_server did not become ready (exit {proc.poll()}):\n{log_path.read_text()}")
            else:
                time.sleep(0.1)
        while http("GET", f"{url}/health")[0] != 200:
            assert time.monotonic() < deadline, f"{url}/health never answered 200"
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            stop_process(proc, timeout=15)
