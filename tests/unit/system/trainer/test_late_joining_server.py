"""A generation server that joins a run late — started by hand after the trainer published versions,
or restarted after a kill — gets no rollouts until it holds the trainer's current weights (issue
31). Real processes: `python -m realhf.launch_server` servers, the real manager app and watcher,
the trainer's WeightBroadcaster asking that manager for its weight group, Redis name resolve.

A sampler polls, in this order, the manager's version c, its routed servers R and the late
server's own weight version v. A server's version only grows, so "late server in R and v < c"
would be a real moment where it was routed behind the trainer: it must never be seen."""

import contextlib
import logging
import threading
import time

import pytest

from helpers.http import http
from helpers.manager_harness import EXP, TRIAL, running_manager, set_version
from helpers.native_server import launch_server
from helpers.wait import wait_for
from helpers.weight_checks import hf_greedy, perturbed, served, served_version
from realhf.base import name_resolve, names
from realhf.base.trial_files import published_version_dir
from realhf.system.trainer.weight_broadcast import WeightBroadcaster

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("nr")]

FLAGS = ["--n-threads", "1", "--max-running-requests", "8", "--context-length", "128"]
FAST = {"health_check_interval": 0.2, "health_timeout": 2.0, "max_health_failures": 2}


class RoutingSampler(threading.Thread):
    """Samples (manager version, late server routed?, its weight version) until stopped."""

    def __init__(self, manager_url, url):
        super().__init__(daemon=True)
        self.manager_url, self.url = manager_url, url
        self.samples, self._halt = [], threading.Event()

    def run(self):
        while not self._halt.is_set():
            try:
                current = http("GET", f"{self.manager_url}/status", timeout=5)[1]["version"]
                routed = self.url in http("GET", f"{self.manager_url}/routed_servers", timeout=5)[1]["servers"]
                version = served_version(self.url)
            except Exception:  # noqa: BLE001 - a server that is just starting or stopping
                continue
            self.samples.append((current, routed, version))
            time.sleep(0.02)

    def stop(self):
        self._halt.set()
        self.join(10)

    def routed_behind(self):
        return [s for s in self.samples if s[1] and s[2] < s[0]]


@contextlib.contextmanager
def sampling(manager_url, url):
    sampler = RoutingSampler(manager_url, url)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def register(url):
    """What a GenerationServer worker does once it serves: its keep-alive entry under gen_servers/."""
    return name_resolve.add_subentry(names.gen_servers(EXP, TRIAL), url, keepalive_ttl=30)


def routed(manager_url):
    return http("GET", f"{manager_url}/routed_servers")[1]


def test_a_server_started_late_is_routed_only_once_the_next_broadcast_brings_it_to_the_current_version(
    qwen_path, tmp_path, no_leftover_processes
):
    with (
        launch_server(tmp_path / "a.log", "--model-path", qwen_path, *FLAGS) as (_, a_url),
        running_manager([a_url], weight_sync="distributed", run_dir=str(tmp_path), **FAST) as m,
    ):
        b = WeightBroadcaster(lambda: b.ask_manager(m.url), "127.0.0.1", "gloo", 20.0, 1 << 20, pause=False)
        try:
            for v in (1, 2):  # versions broadcast before the late server exists; none on disk
                assert b.publish(v, perturbed(qwen_path, v).state_dict().items()).ok
                set_version(v)
            with launch_server(tmp_path / "late.log", "--model-path", qwen_path, *FLAGS) as (_, late):
                with sampling(m.url, late) as sampler:
                    t0 = time.monotonic()
                    register(late)
                    wait_for(lambda: routed(m.url)["joining"] == [late], 10, f"the manager to list {late} as joining")
                    time.sleep(1.0)  # five health checks: it stays out while it serves version 0
                    assert routed(m.url) == {"servers": [a_url], "joining": [late]}
                    joining = http("GET", f"{m.url}/status")[1]["joining"]
                    assert [(j["url"], j["version"]) for j in joining] == [(late, 0)]
                    # The trainer's next version: the late server is in the weight group and gets it.
                    model3 = perturbed(qwen_path, 3)
                    r = b.publish(3, model3.state_dict().items())
                    assert r.ok and r.rebuilt and r.servers == sorted([a_url, late]), r.failed
                    set_version(3)
                    wait_for(lambda: late in routed(m.url)["servers"], 10, f"{late} to be routed at version 3")
                    waited = time.monotonic() - t0
                    assert routed(m.url)["joining"] == []
                    assert served(late) == (3, hf_greedy(model3))
                    # The group is not rebuilt when a joiner becomes a routed server.
                    assert not b.publish(4, perturbed(qwen_path, 4).state_dict().items()).rebuilt
                    set_version(4)
                    time.sleep(0.3)
            status = http("GET", f"{m.url}/status")[1]
        finally:
            b.close()
    assert sampler.routed_behind() == [], sampler.routed_behind()[:5]
    # Out of routing while it served version 0 (and for a poll or two after version 3 reached it).
    assert len([s for s in sampler.samples if not s[1] and s[2] == 0]) >= 10, sampler.samples[:20]
    assert any(s[1] and s[2] == 3 for s in sampler.samples)
    assert status["servers_joined"] == 1
    print(f"late server routed {waited:.1f}s after registering (version 3 was broadcast ~1 s after it)")


def test_a_restarted_server_in_disk_mode_is_updated_from_disk_before_it_is_routed(
    qwen_path, tmp_path, no_leftover_processes, caplog
):
    run_dir = str(tmp_path / "run")
    model2 = perturbed(qwen_path, 2)
    model2.save_pretrained(published_version_dir(run_dir, "actor", 2), safe_serialization=True)
    with (
        launch_server(tmp_path / "a.log", "--model-path", qwen_path, *FLAGS) as (_, a_url),
        launch_server(tmp_path / "b.log", "--model-path", qwen_path, *FLAGS) as (victim, b_url),
        running_manager([a_url], weight_sync="disk", run_dir=run_dir, **FAST) as m,
    ):
        key = register(b_url)
        wait_for(lambda: sorted(routed(m.url)["servers"]) == sorted([a_url, b_url]), 20, "both servers routed")
        set_version(2)
        wait_for(lambda: served_version(a_url) == served_version(b_url) == 2, 20, "both servers at version 2")
        victim.kill()
        victim.wait()
        name_resolve.delete(key)  # its keep-alive entry would expire; the launcher's restart registers anew
        wait_for(lambda: routed(m.url)["servers"] == [a_url], 10, "the manager to drop the killed server")
        # Restarted from the base model (as one started by hand would be): version 0.
        with launch_server(tmp_path / "b2.log", "--model-path", qwen_path, *FLAGS) as (_, restarted):
            with caplog.at_level(logging.INFO), sampling(m.url, restarted) as sampler:
                register(restarted)
                wait_for(lambda: restarted in routed(m.url)["servers"], 20, f"{restarted} to be routed at version 2")
                wait_for(lambda: any(s[1] for s in sampler.samples), 5, "the sampler to see it routed")
            assert served(restarted) == (2, hf_greedy(model2))
    assert sampler.routed_behind() == [], sampler.routed_behind()[:5]
    # The manager's account, in order: held back, updated from disk, then routed.
    lines = [r.getMessage() for r in caplog.records if restarted in r.getMessage()]
    order = [
        next(i for i, x in enumerate(lines) if pattern in x)
        for pattern in ("not routed until it holds the trainer's version 2", "now at version 2", "routed after waiting")
    ]
    assert order == sorted(order), lines


def test_a_joiner_that_cannot_take_a_broadcast_costs_one_version_then_sits_out_and_stays_unrouted(
    qwen_path, tmp_path, no_leftover_processes
):
    """A stand-in server without the weight-group endpoints joins: the version it breaks goes to
    disk (the trainer's rule for any failed broadcast); the next one reaches the routed server
    without it, and it is never routed."""
    from helpers.manager_harness import fake_servers

    with (
        launch_server(tmp_path / "a.log", "--model-path", qwen_path, *FLAGS) as (_, a_url),
        fake_servers(1) as (broken,),
        running_manager([a_url], weight_sync="distributed", run_dir=str(tmp_path), **FAST) as m,
    ):
        # A short timeout: the routed server waits that long in the broken group's rendezvous
        # (harmlessly: it serves and joins the next group), and its shutdown waits for it.
        b = WeightBroadcaster(lambda: b.ask_manager(m.url), "127.0.0.1", "gloo", 4.0, 1 << 20, pause=False)
        try:
            assert b.publish(1, perturbed(qwen_path, 1).state_dict().items()).ok
            set_version(1)
            register(broken.url)
            wait_for(lambda: routed(m.url)["joining"] == [broken.url], 10, "the broken server to join")
            r = b.publish(2, perturbed(qwen_path, 2).state_dict().items())
            assert not r.ok and broken.url in r.failed, r.failed
            assert b._sit_out.sitting_out() == [broken.url]
            model3 = perturbed(qwen_path, 3)
            r = b.publish(3, model3.state_dict().items())
            assert r.ok and r.servers == [a_url], r.failed
            set_version(3)
            assert served(a_url) == (3, hf_greedy(model3))
            assert routed(m.url) == {"servers": [a_url], "joining": [broken.url]}
        finally:
            b.close()
