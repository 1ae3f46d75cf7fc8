"""Issue 14, item 5 (last clause): the manager's state is read and written under one lock.

The GserverManager worker's main thread logs `service.status()` while the HTTP thread's event
loop admits, routes and finishes rollouts and records health checks. Without the lock, status()
iterated the throughput deque and the health-failure dict while the loop changed them
("deque mutated during iteration", "dictionary changed size during iteration"). A tiny GIL switch
interval makes the interleavings that a long run meets by chance happen within seconds.
"""

import sys
import threading
import time

import pytest

from helpers.http import http
from helpers.manager_harness import manager_config, running_manager


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


class Hammer:
    """Calls `fn` in a loop in its own thread; keeps the first exception."""

    def __init__(self, fn):
        self.fn, self.error, self.calls = fn, None, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.fn()
                self.calls += 1
            except Exception as e:  # noqa: BLE001 - the assertion below names it
                self.error = e
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def test_status_from_another_thread_while_requests_flow(nr, fast_switching):
    """The real app: rollouts allocated, scheduled and finished over HTTP (event-loop thread)
    while this process's other thread reads status() as GserverManager._poll does."""
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(4)]
    with running_manager(
        urls,
        max_concurrent_rollouts=10**6,
        groups_per_step=10**6,
        max_head_offpolicyness=10**6,
        health_check_interval=3600,
    ) as server:
        base, service = server.url, server.service
        with Hammer(service.status) as hammer:
            deadline = time.monotonic() + 6
            i = 0
            while time.monotonic() < deadline and hammer.error is None:
                qid = f"q{i}"
                assert http("POST", f"{base}/allocate_rollout", {"qid": qid, "rank": 0})[0] == 200
                assert (
                    http(
                        "POST",
                        f"{base}/schedule_request",
                        {"qid": qid, "prompt_len": 3, "group_size": 1, "new_token_budget": 4},
                    )[0]
                    == 200
                )
                assert http("POST", f"{base}/finish_rollout", {"qid": qid, "accepted": True, "n_tokens": 7})[0] == 200
                i += 1
        assert hammer.error is None, f"status() from another thread raised {hammer.error!r} after {i} rollouts"
        assert hammer.calls > 0
        s = service.status()
        assert s["running"] == 0 and s["throughput"]["finished"] == i


def test_status_while_health_checks_and_routing_change(fast_switching):
    """The watcher's writes (health results of flapping servers, routed set changes, admission)
    from one thread, status() from another: status never raises and always adds up."""
    from realhf.system.manager.manager_service import ManagerService

    urls = [f"http://127.0.0.1:{1000 + i}" for i in range(64)]
    service = ManagerService(
        manager_config(
            max_concurrent_rollouts=10**6, groups_per_step=10**6, max_head_offpolicyness=10**6, max_health_failures=1
        ),
        urls,
    )
    bad = []

    def read():
        s = service.status()
        if s["running"] != sum(s["per_rank"]["running"]):
            bad.append(s)

    with Hammer(read) as hammer:
        deadline = time.monotonic() + 4
        n = 0
        while time.monotonic() < deadline and hammer.error is None:
            for j, url in enumerate(urls):
                service.observe_health(url, ok=(n + j) % 3 == 0)
            service.observe_servers(urls[: 1 + n % len(urls)])
            service.forget_unregistered(urls[: 1 + n % len(urls)])
            qid = f"q{n}"
            service.allocate(qid, 0)
            service.finish(qid, True, 3)
            n += 1
    assert hammer.error is None, f"status() from another thread raised {hammer.error!r} after {n} rounds"
    assert not bad, bad[0]
