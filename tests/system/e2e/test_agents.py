"""Agents through the real system (issue 16), each training for a few steps: agent code written
against the OpenAI client, the tool agent on the embedded tool task, and (slow) the multi-turn
math agent, the custom-agent example and a reward function without an environment."""

import os
import re

import pytest

from helpers.paths import TESTS_DIR
from helpers.training_runs import SMALL_RUN, run_training

STEPS = 8
ENV = dict(os.environ, PYTHONPATH=TESTS_DIR)


def _generations_per_episode(log_dir) -> list:
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("rollout_worker-*.log")))
    return [float(x) for x in re.findall(r"at exit: .*generations/episode ([\d.]+)", logs)]


@pytest.mark.e2e
@pytest.mark.slow  # CI: the tool agent's run below is multi-turn through the same path
def test_the_multi_turn_math_agent_trains_through_the_real_system(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "multiturn",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        "rollout.agent.type=math-multi-turn",
        "rollout.agent.num_turns=3",
        "ppo.gen.max_new_tokens=16",
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    # Wrong first answers (most, at the start) got a feedback turn and another try.
    per_episode = _generations_per_episode(log_dir)
    assert per_episode and all(1.0 < g <= 3.0 for g in per_episode), per_episode


@pytest.mark.e2e
@pytest.mark.slow  # CI: the unit tests of reward_fn and of the example cover them
def test_a_reward_function_without_an_environment_trains(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "rewardfn",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        "rollout.agent.reward_fn=helpers.user_agents:answer_matches",
        "rollout.env.type=none",
        timeout=400,
        env=ENV,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert any(m["success_rate"] > 0 for m in metrics) and any(m["success_rate"] < 1 for m in metrics)
    assert _generations_per_episode(log_dir) == [1.0]  # one rollout worker (SMALL_RUN)


@pytest.mark.e2e
@pytest.mark.slow  # CI: the unit tests of reward_fn and of the example cover them
def test_the_custom_agent_example_trains(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "custom",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        "rollout.agent.type=examples.custom_agent.agent:RetryAgent",
        "rollout.env.type=examples.custom_agent.agent:ExactAnswerEnv",
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(1.0 <= g <= 2.0 for g in _generations_per_episode(log_dir))


@pytest.mark.e2e
def test_agent_code_written_against_the_openai_client_trains(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "openai",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        "rollout.agent.type=openai-agent",
        "rollout.env.type=none",
        "+rollout.agent.args.workflow=helpers.user_agents:openai_math",
        timeout=400,
        env=ENV,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert any(m["success_rate"] > 0 for m in metrics)
    assert _generations_per_episode(log_dir) == [1.0]  # one rollout worker (SMALL_RUN)


@pytest.mark.e2e
@pytest.mark.slow  # CI: test_tool_runs.py trains the same tool agent on the same task twice (MCP, sandbox)
def test_the_tool_agent_trains_on_the_embedded_tool_task(tmp_path, no_leftover_processes):
    # examples/run_tool_agent.sh, shortened: the warm-started model calls the calculator through
    # the real system (chat template, tool-call parsing, the tool's result appended off the loss).
    import subprocess
    import sys

    from helpers.paths import REPO

    data = tmp_path / "task"
    subprocess.run(
        [
            sys.executable,
            "scripts/make_tool_task.py",
            "--out",
            str(data),
            "--data-only",
            "--n-train",
            "400",
            "--n-test",
            "20",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc, metrics, log_dir = run_training(
        tmp_path,
        "tools",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        "actor.path=assets/tiny-tools/sft",
        f"dataset.path={data}/data/train.jsonl",
        f"dataset.test_path={data}/data/test.jsonl",
        "dataset.chat_template=on",
        "rollout.agent.type=tool-agent",
        "+rollout.agent.args.max_turns=2",
        "rollout.env.check_work=false",
        "ppo.gen.max_new_tokens=64",
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert any(m["success_rate"] > 0 for m in metrics)
    # The agent's own numbers (Outcome.info) reach the metrics, averaged per step.
    assert all(0.0 <= m["agent/tool_calls"] <= 2.0 and "agent/tool_errors" in m for m in metrics), metrics[-1]
    # Most episodes called the tool once, then answered.
    assert all(1.5 < g <= 2.0 for g in _generations_per_episode(log_dir)), _generations_per_episode(log_dir)
