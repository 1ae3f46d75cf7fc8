"""Helpers of the rollout tests: fake SGLang servers, an in-process GserverManager, plain HTTP."""

import contextlib
import json
import time
import urllib.error
import urllib.request

from helpers.fake_sglang import FakeSGLangServer
from realhf.api.worker_configs import GserverManagerConfig
from realhf.base import name_resolve, names
from realhf.system.gserver_manager import serve_manager

EXP, TRIAL = "rollout-test", "t0"


@contextlib.contextmanager
def running_manager(urls, **overrides):
    """The real manager app (HTTP server + watcher) on 127.0.0.1, over the given server URLs."""
    config = GserverManagerConfig(**{"poll_interval": 0.05, "n_servers": len(urls), **overrides})
    server = serve_manager(config, EXP, TRIAL, server_urls=list(urls))
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def fake_servers(n, **kw):
    servers = [FakeSGLangServer(**kw).start() for _ in range(n)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def http(method: str, url: str, body=None, timeout: float = 10.0):
    """(status, parsed JSON or text) of one real HTTP call."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def set_version(v: int, role: str = "actor"):
    name_resolve.add(names.model_version(EXP, TRIAL, role), v, replace=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")

