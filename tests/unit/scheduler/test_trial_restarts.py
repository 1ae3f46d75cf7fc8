"""When a trial restarts itself (realhf.scheduler.trial_restarts): which deaths qualify, the
budget within its window, and the crash loop — the same process dying again before a new
recovery checkpoint."""

import pytest

from realhf.api.cli_args import RestartPolicyConfig
from realhf.scheduler.trial_restarts import Death, TrialRestarts, death_of
from realhf.scheduler.worker_spec import LauncherError, RedisLostError, WorkerFailedError


def failed(worker, repeats=False):
    return WorkerFailedError(worker, "exited with code -9 (SIGKILL)", "/log", "", repeats=repeats)


def test_the_deaths_a_restart_may_cure_are_a_vital_worker_or_redis():
    policy = RestartPolicyConfig()
    assert death_of(failed("model_worker/1"), policy) == Death("model_worker/1", "exited with code -9 (SIGKILL)")
    assert death_of(failed("master_worker/0"), policy).who == "master_worker/0"
    assert death_of(failed("node_worker/0"), policy).who == "node_worker/0"
    assert death_of(RedisLostError("redis-server at x died"), policy) == Death("redis", "redis-server at x died")
    # Not: a user's code failing the same way every time, a worker type restarted on its own (its
    # budget ran out), a launcher error that is not a death (a config the cluster cannot run).
    assert death_of(failed("model_worker/0", repeats=True), policy) is None
    assert death_of(failed("rollout_worker/0"), policy) is None
    assert death_of(failed("generation_server/0"), policy) is None
    assert death_of(failed("model_worker/0"), RestartPolicyConfig(model_worker=True)) is None
    assert death_of(LauncherError("trial did not finish within 5s"), policy) is None


def test_the_budget_counts_restarts_within_the_window(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("realhf.scheduler.trial_restarts.time.monotonic", lambda: now[0])
    r = TrialRestarts(RestartPolicyConfig(trial_restarts=2, trial_restart_window=100))
    assert r.refusal(Death("model_worker/0", "a"), 2) is None
    assert r.counted() == "trial restart 1 (of at most 2 within 100 s)"
    assert r.refusal(Death("master_worker/0", "b"), 4) is None
    refused = r.refusal(Death("redis", "c"), 6)
    assert "2 trial restart(s) within 100 s already" in refused and "trial_restarts=2" in refused
    now[0] += 101  # both have left the window
    assert r.refusal(Death("redis", "c"), 6) is None
    assert r.history == ["model_worker/0: a", "master_worker/0: b", "redis: c"]


@pytest.mark.parametrize("step", [0, 5])
def test_the_same_process_dying_again_before_a_new_checkpoint_is_a_crash_loop(step):
    r = TrialRestarts(RestartPolicyConfig(trial_restarts=10))
    assert r.refusal(Death("model_worker/0", "exited with code 1"), step) is None
    refused = r.refusal(Death("model_worker/0", "exited with code 1"), step)
    assert refused.startswith("a crash loop: model_worker/0 died again before a new recovery checkpoint")
    assert (f"still step {step}" if step else "still none") in refused
    # Progress (a newer checkpoint), or another process: not a loop.
    assert r.refusal(Death("model_worker/0", "exited with code 1"), step + 2) is None
    assert r.refusal(Death("master_worker/0", "exited with code 1"), step + 2) is None


def test_zero_restarts_refuses_every_one():
    assert TrialRestarts(RestartPolicyConfig(trial_restarts=0)).refusal(Death("redis", "x"), 3) == (
        "cluster.restart_policy.trial_restarts=0"
    )
