"""Issue 14 item 5: a dead Redis or a lost key ends the run with exit status 1 and a message naming
Redis — never exit 0 with fewer steps than asked — and leaves no process behind. Today's bug was
that a missing experiment_status key read as "stop": every worker exited 0 and so did the run."""

import os
import signal

import pytest
import redis
from omegaconf import OmegaConf

from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run
from realhf.base import names

# Without whole-trial restarts a lost Redis ends the run (with them it heals: faults/test_trial_restart.py).
NO_TRIAL_RESTART = "cluster.restart_policy.trial_restarts=0"


def _redis_url(run) -> str:
    return OmegaConf.load(run.log_dir / "configs" / "master_worker-0.yaml").context.name_resolve.redis_url


def _fails_naming_redis(run, *expected):
    code = run.finish(timeout=120)
    out = run.output()
    assert code == 1, out[-4000:]
    failed = [line for line in out.splitlines() if line.startswith("run failed (exit 1):")]
    assert failed and "Redis" in failed[-1], out[-4000:]
    for text in expected:
        assert text in failed[-1], failed[-1]
    assert "run complete" not in out
    assert run.leftovers() == []
    return failed[-1]


@pytest.mark.e2e
def test_a_dead_redis_ends_the_run_with_exit_1_naming_redis(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "redisdead", "exp_ctrl.benchmark_steps=1000", *SMALL_RUN, NO_TRIAL_RESTART)
    try:
        run.wait_steps(1)
        password = redis.Redis.from_url(_redis_url(run)).connection_pool.connection_kwargs["password"]
        redis_pids = [pid for pid, (cmd, _) in run.seen.items() if "redis-server" in cmd]
        assert redis_pids, run.seen
        os.kill(redis_pids[0], signal.SIGKILL)
        line = _fails_naming_redis(run, "redis-server", "died")
    finally:
        run.stop()
    assert password not in run.output()  # the URL is named with its password redacted
    assert "redis://:***@127.0.0.1:" in line


@pytest.mark.e2e
def test_a_lost_experiment_status_key_ends_the_run_with_exit_1_not_0(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "keylost", "exp_ctrl.benchmark_steps=1000", *SMALL_RUN, NO_TRIAL_RESTART)
    try:
        run.wait_steps(1)
        client = redis.Redis.from_url(_redis_url(run))
        assert client.delete(names.experiment_status(EXPERIMENT, "keylost")) == 1
        client.close()
        _fails_naming_redis(run, "experiment status key", "missing from Redis")
    finally:
        run.stop()
    # Whether a worker or the launcher notices first is a race; that a worker fails (exit 1,
    # naming Redis) rather than reading the missing key as "stop" is tests/unit/system/test_worker_base.py.
