"""Issues 14 (items 3, 5) and 16: episodes that go wrong never stop a run.

A user agent that raises for a third of the prompts and an environment that returns NaN for
another third (each such group is refused by the
trainer, or earlier by its rollout worker: either way its admission slot must come back, or the
staleness budget drains and the run stalls for ever), and one whose step hangs for a quarter of
the prompts (each such episode must be cancelled after rollout.episode_timeout and free its
slot). Both runs finish their steps, and the logs name the episodes that went wrong.

Issue 27, item 1: a synchronous reward function that blocks for an hour on a third of the prompts
used to freeze its rollout worker's event loop (no episode timeout could fire, every heartbeat
stayed alive, the run stalled until the master's one-hour data timeout). Issue 49, item 3: each
call runs in a reward process under `rollout.agent.reward_timeout` and is killed past it — the
blocked episodes fail naming the function, counted `reward_timed_out`, their slots come back,
and the run finishes with no reward process left running; a thread (reward_isolation=thread)
would have stayed stuck."""

import os
import re

import pytest

from helpers.faulty_plugins import bucket
from helpers.paths import TESTS_DIR
from helpers.training_runs import SMALL_RUN, check_accounting, run_training

STEPS = 10
ETA = "max_head_offpolicyness=1"  # little slack: leaked slots would stall the run within a few steps
ENV = dict(os.environ, PYTHONPATH=TESTS_DIR)


def _logs(log_dir) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("rollout_worker-*.log")))


@pytest.mark.e2e
def test_a_run_whose_agent_raises_and_env_returns_nan_for_two_thirds_of_the_prompts_finishes(
    tmp_path, no_leftover_processes
):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "nan",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        ETA,
        "rollout.agent.type=helpers.faulty_plugins:RaisingAgent",
        "rollout.env.type=helpers.faulty_plugins:NanRewardEnv",
        timeout=300,
        env=ENV,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    names = r"episode (\S+) \(agent helpers.faulty_plugins:RaisingAgent, env helpers.faulty_plugins:NanRewardEnv\)"
    failed = re.findall(names + r": malformed group, not pushed: samples\[0\]\.reward is nan", _logs(log_dir))
    assert failed, _logs(log_dir)[-3000:]
    assert all(bucket(qid.split("@")[0], 3) == 0 for qid in failed)
    raised = re.findall(names + r": ValueError: RaisingAgent: no answer for", _logs(log_dir))
    assert raised, _logs(log_dir)[-3000:]
    assert all(bucket(qid.split("@")[0], 3) == 1 for qid in raised)
    assert all(m["reward_mean"] == m["reward_mean"] for m in metrics)  # nothing NaN was trained
    # Every admitted group is accounted for, the failed ones by reason (realhf.system.manager.admission_ledger).
    (a,) = check_accounting(tmp_path, out)
    # (The logs also hold episodes that ended after the master's last read of the ledger.)
    assert 0 < a["ended"].get("malformed", 0) <= len(set(failed)) and 0 < a["ended"].get("failed", 0) <= len(
        set(raised)
    ), a
    assert metrics[-1]["groups_ended_malformed"] > 0 and metrics[-1]["groups_ended_failed"] > 0


@pytest.mark.e2e
def test_episodes_whose_env_hangs_time_out_free_their_slots_and_are_named(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "hang",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        ETA,
        "rollout.env.type=helpers.faulty_plugins:HangingEnv",
        "rollout.episode_timeout=3",
        timeout=300,
        env=ENV,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    timed_out = re.findall(
        r"episode (\S+) \(agent math-single-step, env helpers.faulty_plugins:HangingEnv\) ran "
        r"longer than rollout.episode_timeout=3s and was cancelled",
        _logs(log_dir),
    )
    # (A slow episode on a loaded machine may time out too: only the hanging ones are counted.)
    hung = [qid for qid in timed_out if bucket(qid.split("@")[0], 4) == 0]
    # More hung and were cancelled than one worker has slots (4), and the run still went on.
    assert len(hung) > 4, _logs(log_dir)[-3000:]
    (a,) = check_accounting(tmp_path, out)
    assert a["ended"].get("timed_out", 0) > 4, a


@pytest.mark.e2e
def test_a_run_whose_reward_fn_blocks_for_a_third_of_the_prompts_finishes_naming_the_function(
    tmp_path, no_leftover_processes
):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "blocking",
        "exp_ctrl.benchmark_steps=4",
        *SMALL_RUN,
        "max_head_offpolicyness=1",
        "rollout.env.type=none",
        "rollout.agent.reward_fn=helpers.faulty_plugins:blocking_reward",
        "rollout.agent.reward_timeout=2",
        timeout=300,
        env=ENV,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]  # and it exited: the stuck threads did not hold the workers
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    logs = _logs(log_dir)
    blocked = re.findall(
        r"rollout.agent.reward_fn=helpers.faulty_plugins:blocking_reward did not return within "
        r"rollout.agent.reward_timeout=2s for prompt '([^']+)'",
        logs,
    )
    assert blocked, logs[-3000:]
    assert all(bucket(query_id, 3) == 2 for query_id in blocked)
    assert "its process was killed" in logs
    (a,) = check_accounting(tmp_path, out)
    assert a["ended"].get("reward_timed_out", 0) >= 1, a
