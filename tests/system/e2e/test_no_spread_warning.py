"""Issue 50, item 2: a run that cannot learn says so. With a reward that never varies within a
group (a task the model never solves, a constant reward function), every group's advantages are
0: each step logs `frac_reward_zero_std` (1.0 here), and after ten such steps the console warns
once, naming the likely causes."""

import os

import pytest

from helpers.paths import TESTS_DIR
from helpers.training_runs import SMALL_RUN, run_training


@pytest.mark.e2e
def test_a_run_with_no_reward_spread_logs_it_per_step_and_warns_once(tmp_path, no_leftover_processes):
    proc, metrics, _ = run_training(
        tmp_path,
        "nospread",
        "exp_ctrl.benchmark_steps=11",
        *SMALL_RUN,
        "rollout.env.type=none",
        "rollout.agent.reward_fn=helpers.faulty_plugins:constant_reward",
        timeout=300,
        env=dict(os.environ, PYTHONPATH=TESTS_DIR),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["frac_reward_zero_std"] for m in metrics] == [1.0] * 11
    assert "no_spread 1.00" in out  # in each step's line
    assert out.count("the last 10 steps learnt (almost) nothing") == 1, out[-3000:]
    assert "the model never (or always) solves the task" in out and "the reward is constant" in out
