"""Issue 27 items 4 and 9: two runs on one external Redis (cluster.name_resolve.redis_url).

Two trials of one experiment run at the same time on one Redis: both finish with all their steps,
and neither sees the other's keys (each manager routes to its own generation server only). Two
launches of the SAME trial on one Redis whose lock files cannot see each other (other fileroots,
as on two machines): the second is refused by the trial's lease in Redis naming the first, which
goes on to finish with all its steps."""

import json
import secrets
import socket

import pytest

from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run, run_training
from realhf.base import names
from realhf.base.redis_server import RedisServer

STEPS, LIVE_STEPS = 3, 30


@pytest.fixture
def shared_redis():
    """An external redis-server, like one a cluster provides: (url, client)."""
    import redis

    with RedisServer(password=secrets.token_hex(8)) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            yield server.url, client
        finally:
            client.close()


def _overrides(url, steps=STEPS):
    return [f"cluster.name_resolve.redis_url={url}", *SMALL_RUN, f"exp_ctrl.benchmark_steps={steps}"]


def _routed_servers(runs):
    """The URLs each run's manager routes to, read from its /status while both runs live."""
    seen = {}

    def servers(run: Run):
        try:
            status = run.manager_status()
        except AssertionError:  # not serving yet (no URL in its log)
            return None
        return status and [s["url"] for s in status["servers"]]

    def every_run_seen():
        for run in runs:
            run.track()
            if run.trial not in seen:
                if run.proc.poll() is not None:
                    raise AssertionError(
                        f"run {run.trial} ended (code {run.proc.returncode}) before its manager's "
                        f"/status was read:\n{run.output()[-3000:]}"
                    )
                seen[run.trial] = servers(run)
                if not seen[run.trial]:
                    del seen[run.trial]
        return len(seen) == len(runs)

    runs[0].wait_for("every run's manager /status listing a generation server", every_run_seen, timeout=300)
    return [seen[run.trial] for run in runs]


def _finished_with_every_step(run: Run, code: int, steps: int = STEPS):
    assert code == 0, run.output()[-4000:]
    assert [m["step"] for m in run.metrics()] == list(range(1, steps + 1)), run.output()[-3000:]
    assert run.leftovers() == []


@pytest.mark.e2e
def test_two_trials_on_one_redis_run_side_by_side_without_seeing_each_other(
    tmp_path, shared_redis, no_leftover_processes
):
    url, client = shared_redis
    runs = [Run(tmp_path, trial, *_overrides(url)) for trial in ("left", "right")]
    try:
        routed = _routed_servers(runs)
        own = [run.server_url(0) for run in runs]
        assert own[0] != own[1]
        # Each manager found its own server under its own trial's keys, not the other's.
        assert routed == [[own[0]], [own[1]]], (routed, own)
        codes = [run.finish(timeout=600) for run in runs]
    finally:
        for run in runs:
            run.stop()
    for run, code in zip(runs, codes):
        _finished_with_every_step(run, code)
    # Each launcher released its lease at its normal end, and left none of its trial's keys.
    assert [client.get(names.trial_lease(EXPERIMENT, run.trial)) for run in runs] == [None, None]
    assert client.keys(f"{EXPERIMENT}/*") == []


@pytest.mark.e2e
@pytest.mark.slow  # CI time; the same-file-system refusal (test_overwrite_live_trial.py) stays in CI
def test_a_second_launch_of_a_live_trial_on_another_file_system_is_refused_by_the_redis_lease(
    tmp_path, shared_redis, no_leftover_processes
):
    url, client = shared_redis
    for machine in ("machine-a", "machine-b"):
        (tmp_path / machine).mkdir()
    # Long enough to outlive the second launch (~8 s to its refusal on 2 loaded cores).
    first = Run(tmp_path / "machine-a", "same", *_overrides(url, LIVE_STEPS))
    try:
        # The lease is taken before the launcher starts (and so before it clears the trial's keys).
        lease = first.wait_for(
            "the first launch's lease in Redis", lambda: client.get(names.trial_lease(EXPERIMENT, "same")), timeout=120
        )
        assert json.loads(lease)["pid"] == first.proc.pid
        # Its own lock file (another fileroot) is free: only the lease can refuse it.
        second, _, second_log_dir = run_training(
            tmp_path / "machine-b", "same", *_overrides(url), "overwrite=true", timeout=300
        )
        assert first.proc.poll() is None, "the first run ended before the second launch was refused: nothing tested"
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert (
            f"config error: this trial is already running: pid {first.proc.pid} on host {socket.gethostname()}"
        ) in second.stderr, second.stderr[-2000:]
        assert "lease expires in " in second.stderr and url not in second.stderr  # its password redacted
        assert "deleting the files" not in second.stdout and not second_log_dir.exists()
        # Had the second cleared the trial's keys, the first would fail (its status key gone).
        code = first.finish(timeout=600)
    finally:
        first.stop()
    _finished_with_every_step(first, code, LIVE_STEPS)
    assert client.get(names.trial_lease(EXPERIMENT, "same")) is None


@pytest.mark.e2e
def test_a_lease_taken_by_another_launch_during_the_evaluation_stops_the_run_in_one_line(
    tmp_path, shared_redis, no_leftover_processes
):
    # The lease is held from before the evaluation that precedes training; there no launcher
    # watches yet, so the entry point itself stops, and its one line must not offer to resume a
    # trial that another launch now owns. Small evaluation batches keep the evaluation going for
    # many renewals (TTL 3 s: renewed every second).
    url, client = shared_redis
    key = names.trial_lease(EXPERIMENT, "taken")
    overrides = [o for o in _overrides(url) if not o.startswith("evaluation.n_prompts=")]
    run = Run(tmp_path, "taken", *overrides, "evaluation.batch_size=4", "cluster.name_resolve.keepalive_ttl=3")
    other = json.dumps({"host": "elsewhere", "pid": 4242, "started": 0, "cmdline": "the other launch"})
    try:
        run.wait_for("the evaluation's engine", lambda: "evaluation: static_kv runner" in run.output(), 120, 0.05)
        assert json.loads(client.get(key))["pid"] == run.proc.pid
        client.set(key, other, ex=60)  # as if it had expired in a stall and another launch took it
        code = run.finish(timeout=60)
    finally:
        run.stop()
    out = run.output()
    assert code == 143, out[-4000:]
    assert "stopping this run: the trial's lease" in out and "taken by pid 4242 on host elsewhere" in out, out[-3000:]
    line = "run interrupted (exit 143): SIGTERM during the evaluation before training; every process stopped; "
    assert line + "the trial is the other launch's now; logs in " in out, out[-3000:]
    assert "recover_mode=auto" not in out and "Traceback" not in out, out[-3000:]
    assert client.get(key) == other  # the other launch's lease, neither renewed nor deleted by this run
    assert run.leftovers() == []
