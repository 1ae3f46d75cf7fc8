"""The whole system on real processes: Redis, a native generation server, the manager, two
rollout workers, a model worker and the master, driven by training/main_async_ppo.py. The runs
at DP=2 and DP=3 (GRPO as shipped, a critic, LoRA): test_data_parallel_runs.py."""

import asyncio
import json
import os
import re

import pytest

from helpers.paths import TESTS_DIR, TINY_MATH
from helpers.training_runs import CRITIC_RUN, check_finished_run, reward_gain, run_training
from helpers.training_runs import trial_processes as _trial_processes
from realhf.base.trial_files import read_completions
from realhf.plugins.environments.math_env import MathEnv
from realhf.system.stats.completion_log import console_lines


@pytest.mark.e2e
def test_synchronous_baseline_trains_only_on_the_current_version(tmp_path, no_leftover_processes):
    steps = 10
    proc, metrics, log_dir = run_training(
        tmp_path,
        "sync",
        f"exp_ctrl.benchmark_steps={steps}",
        "max_head_offpolicyness=0",
        "ppo.use_decoupled_loss=false",
        "evaluation.n_prompts=0",
        "stats.log_completions=2",
    )
    check_finished_run(proc, metrics, steps, 0, tmp_path)
    assert all(m["head_offpolicyness_max"] == 0 for m in metrics)
    check_logged_completions(proc.stdout, log_dir, steps, per_step=2)


async def _graded(row: dict, text: str) -> float:
    env = MathEnv(row, check_work=True)
    try:
        return (await env.step(text))[1]
    finally:
        await env.aclose()


def check_logged_completions(stdout: str, log_dir, steps: int, per_step: int) -> None:
    """stats.log_completions: `per_step` rows a step in completions.jsonl, each the decoded text
    of a trained sample — its prompt is the dataset row's, and grading its completion as the
    environment did (check_work, as the shipped config) gives its reward — and on the console
    under the step's line, as `console_lines` cuts them."""
    rows = read_completions(log_dir)
    assert [r["step"] for r in rows] == [s for s in range(1, steps + 1) for _ in range(per_step)]
    with open(os.path.join(TINY_MATH, "data", "train.jsonl")) as f:
        dataset = {r["query_id"]: r for r in map(json.loads, f)}
    for r in rows:
        row = dataset[r["qid"].rsplit("@", 1)[0]]
        assert r["prompt"] == row["prompt"] and r["completion"].strip(), r
        # Synchronous: every token of a step's samples is from the version just before it.
        assert r["version_start"] == r["version_end"] == r["step"] - 1, r
        assert (r["reward"] > 0) == (asyncio.run(_graded(row, r["completion"])) > 0), r
    for step in range(1, steps + 1):
        lines = console_lines([r for r in rows if r["step"] == step])
        at = stdout.index(f"step {step} v{step} | ")
        below = stdout[at:].split("\n")[1 : 1 + 2 * per_step]  # the launcher's own lines may come between
        assert [line for line in below if line.startswith("  completion ")][:per_step] == lines, stdout[at : at + 2000]


@pytest.mark.e2e
@pytest.mark.slow
def test_async_run_raises_the_reward(tmp_path, no_leftover_processes):
    steps = 300
    proc, metrics, _ = run_training(
        tmp_path, "learn", f"exp_ctrl.benchmark_steps={steps}", "evaluation.n_prompts=0", timeout=1800
    )
    check_finished_run(proc, metrics, steps, 4, tmp_path)
    # NOTES' criterion: mean reward of the last 20 steps ≥ mean of the first 20 + 0.08.
    first, final = reward_gain(metrics)
    assert final >= first + 0.08, f"reward did not rise: first 20 steps {first:+.3f}, last 20 {final:+.3f}"


@pytest.mark.e2e
@pytest.mark.slow
def test_keeping_running_requests_across_weight_updates_trains_and_aborts_nothing(tmp_path, no_leftover_processes):
    steps = 150
    proc, metrics, log_dir = run_training(
        tmp_path,
        "keep",
        f"exp_ctrl.benchmark_steps={steps}",
        "evaluation.n_prompts=0",
        "gen_server.native.keep_running_on_update=true",
        timeout=1200,
    )
    check_finished_run(proc, metrics, steps, 4, tmp_path)
    server_log = (log_dir / "generation_server-0.log").read_text()
    swaps = re.findall(r"weights v\d+ -> v\d+ from .*?; (\d+) running requests aborted", server_log)
    assert len(swaps) >= steps - 1 and set(swaps) == {"0"}, swaps[:10]
    first, final = reward_gain(metrics)
    assert final >= first + 0.04, f"reward did not rise: first 20 steps {first:+.3f}, last 20 {final:+.3f}"


@pytest.mark.e2e
@pytest.mark.slow
def test_ppo_with_a_critic_raises_the_success_rate(tmp_path, no_leftover_processes):
    steps = 150
    proc, metrics, _ = run_training(
        tmp_path,
        "critic-learn",
        f"exp_ctrl.benchmark_steps={steps}",
        *CRITIC_RUN,
        "ppo.critic_warmup_steps=10",
        timeout=1800,
    )
    check_finished_run(proc, metrics, steps, 4, tmp_path)
    first = sum(m["success_rate"] for m in metrics[:20]) / 20
    final = sum(m["success_rate"] for m in metrics[-20:]) / 20
    print(f"success rate with a critic (gae): first 20 steps {first:.3f}, last 20 {final:.3f}")
    assert final >= first + 0.05, (first, final)


@pytest.mark.e2e
def test_a_failing_worker_stops_the_whole_run_and_names_itself(tmp_path, no_leftover_processes):
    # A user environment that raises when it starts: the rollout workers fail after the config
    # check passed; with restarts off the first death ends the run, naming worker, file and line.
    env = dict(os.environ, PYTHONPATH=TESTS_DIR)
    proc, metrics, log_dir = run_training(
        tmp_path,
        "fail",
        "rollout.env.type=helpers.broken_env:BrokenEnv",
        "cluster.restart_policy.rollout_worker=false",
        "evaluation.n_prompts=0",
        timeout=300,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rollout_worker/" in out and "failed" in out
    assert 'broken_env.py", line 9' in out and "failed to start (on purpose)" in out  # the log tail
    assert metrics == []
    assert _trial_processes(str(tmp_path)) == []
