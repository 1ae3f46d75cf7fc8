"""Issue 27 item 9: a network partition between one of two generation servers and the rest of
the run, then healed.

How it is simulated: the run's manager and rollout workers reach a generation server only at the
URL it registered under `gen_servers/` (the manager health-checks and updates it there, and hands
it to rollout workers, which POST /generate to it). The test starts a TCP proxy
(`helpers.tcp_proxy`) in front of server 0 and rewrites that server's own registration entry to
the proxy's URL (the value only: the server's keep-alive goes on extending the entry's TTL and
never rewrites its value). The manager then forgets the direct URL and routes through the proxy,
so every HTTP path to server 0 — health checks, weight updates, generation — crosses it. Cutting
the proxy is a partition of that server's HTTP port only: its link to Redis and the launcher
stays up (its heartbeat lives, so the launcher rightly does not restart it), as when a firewall
rule drops the traffic to one server. "blackhole" drops (connections hang, nothing answers);
"reset" rejects (every connection reset).

What must happen: the manager drops the partitioned server from routing after its failed health
checks (and its weight-update round gives it up, `realhf/system/manager/weight_update.py`), training goes
on with the other server, and after the heal the server passes its checks, rejoins routing, is
updated to the trainer's weights, and the run finishes with exit 0 and every step.

Requests already sent to the server when its connections start hanging are given up as soon as
the manager has dropped it (checked every 2 s: `GenerationClient._unless_dropped`) and resubmitted
to the other server. Before that they waited out `rollout.request_timeout` (300 s), holding every
rollout slot: training stalled ~300 s (measured: 10 steps 304 s after the cut).
"""

import re
import time

import pytest

from helpers.tcp_proxy import TcpProxy
from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run, check_accounting
from realhf.base import names

STEPS = 300


def _routed(run: Run):
    s = run.manager_status()
    return None if s is None else {x["url"] for x in s["servers"]}


def _partition_and_heal(tmp_path, mode: str, *overrides: str):
    run = Run(
        tmp_path,
        f"partition-{mode}",
        "allocation_mode=native.d2m1p1+d1m1p1",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        *overrides,
    )
    proxy = None
    report = {}
    try:
        run.wait_steps(2, timeout=180)
        direct, other = run.server_url(0), run.server_url(1)
        run.wait_for("the manager routing to both servers", lambda: _routed(run) == {direct, other}, 60)
        host, port = direct.rsplit("/", 1)[-1].split(":")
        proxy = TcpProxy(host, int(port)).start()

        # Server 0's registration entry now names the proxy (its TTL kept: the server's keep-alive
        # extends it as before).
        key = names.gen_servers(EXPERIMENT, run.trial)
        redis = run.redis()
        entries = [k for k in redis.scan_iter(match=key + "/*") if redis.get(k) == direct]
        assert len(entries) == 1, entries
        assert redis.set(entries[0], proxy.url, xx=True, keepttl=True)
        run.wait_for(
            "the manager routing to server 0 through the proxy", lambda: _routed(run) == {proxy.url, other}, 60
        )
        run.wait_for("generation traffic through the proxy", lambda: proxy.stats()["bytes_down"] > 10_000, 60)

        proxy.cut(mode)
        t_cut, steps_at_cut = time.monotonic(), len(run.metrics())
        run.wait_for(
            "the manager to drop the partitioned server from routing", lambda: _routed(run) == {other}, 60, interval=0.2
        )
        report["dropped_after_s"] = time.monotonic() - t_cut
        steps_at_drop = len(run.metrics())
        run.wait_for(
            "10 train steps with the other server alone", lambda: len(run.metrics()) >= steps_at_drop + 10, 120
        )
        report["steps_while_cut"] = len(run.metrics()) - steps_at_cut
        report["cut_s"] = time.monotonic() - t_cut

        proxy.heal()
        t_heal, bytes_at_heal = time.monotonic(), proxy.stats()["bytes_down"]
        run.wait_for("the healed server back in routing", lambda: _routed(run) == {proxy.url, other}, 60, interval=0.2)
        report["rejoined_after_s"] = time.monotonic() - t_heal
        trainer_version = run.manager_status()["version"]

        def updated():
            s = run.manager_status()
            return s and any(x["url"] == proxy.url and (x["version"] or 0) >= trainer_version for x in s["servers"])

        run.wait_for(f"the healed server updated to version {trainer_version}", updated, 60, interval=0.2)
        run.wait_for(
            "generation traffic through the healed proxy",
            lambda: proxy.stats()["bytes_down"] > bytes_at_heal + 10_000,
            60,
        )
        steps_at_heal = len(run.metrics())
        code = run.finish()
    finally:
        run.stop()
        if proxy is not None:
            proxy.close()
    out = run.output()
    print(mode, report)
    assert code == 0, out[-5000:]
    assert steps_at_heal < STEPS  # the heal was checked while the run was still training
    assert [m["step"] for m in run.metrics()] == list(range(1, STEPS + 1)), out[-3000:]
    manager_log = run.log("gserver_manager-0")
    assert f"generation server {proxy.url} failed 2 health checks in a row; dropped from routing" in manager_log
    assert f"generation server {proxy.url} is up" in manager_log
    assert "workers restarted" not in out, out[-2000:]  # a partition is not a death
    # Requests that were on the partitioned server were resubmitted, not failed.
    rollout_logs = run.log("rollout_worker-0") + run.log("rollout_worker-1")
    if "weight_sync=disk" in overrides:
        # Distributed (the default): a version's swap aborts running requests everywhere every
        # step, so whether any request is caught on the server at the cut is timing; none failed
        # either way.
        assert "resubmitting in" in rollout_logs
    assert not re.search(r"episode \S+ failed", rollout_logs), rollout_logs[-3000:]
    check_accounting(tmp_path, out)
    assert run.leftovers() == []
    return report


@pytest.mark.e2e
@pytest.mark.parametrize(
    "weight_sync",
    [
        # disk: the manager updates one server at a time; the requests caught on the partitioned
        # server at the cut are the ones resubmitted. --runslow for CI time (66 s): in CI,
        # tests/unit/system/trainer/test_weight_broadcast.py partitions a server behind a TCP proxy and
        # test_generation_client.py resubmits a request from a server the manager drops.
        pytest.param("disk", marks=pytest.mark.slow),
        # distributed: the trainer's broadcast gives up on the partitioned member once the
        # manager drops it (~12 s; before that fix the broadcast waited out gloo's 60 s).
        pytest.param("distributed", marks=pytest.mark.slow),
    ],
)
def test_a_blackholed_server_is_dropped_training_goes_on_and_it_rejoins_when_healed(
    tmp_path, no_leftover_processes, weight_sync
):
    report = _partition_and_heal(tmp_path, "blackhole", f"weight_sync={weight_sync}")
    # The 10 steps with one server came within a minute of the cut, not after request_timeout (300 s).
    assert report["cut_s"] < 60, report


@pytest.mark.e2e
@pytest.mark.slow
def test_a_server_whose_connections_are_reset_is_dropped_and_rejoins_when_healed(tmp_path, no_leftover_processes):
    _partition_and_heal(tmp_path, "reset")
