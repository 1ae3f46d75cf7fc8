"""The embedded code task through the real system (issue 29, item 9): examples/run_code_task.sh
shortened. The warm-started model writes functions, the code environment runs them on hidden
tests in its sandbox, and the evaluation before and after training runs through that environment."""

import json

import pytest

from helpers.training_runs import SMALL_RUN, run_training
from scripts.make_code_task import main as make_code_task

STEPS = 8
OUTCOMES = ("syntax_error", "forbidden", "timeout", "runtime_error")


@pytest.mark.e2e
def test_the_code_task_trains_with_rewards_from_the_sandbox(tmp_path, no_leftover_processes):
    assert make_code_task(["--out", str(tmp_path / "task"), "--data-only", "--n-train", "400", "--n-test", "16"]) == 0
    data = tmp_path / "task" / "data"
    proc, metrics, log_dir = run_training(
        tmp_path,
        "code",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *[o for o in SMALL_RUN if not o.startswith(("evaluation.n_prompts=", "ppo.gen.max_new_tokens="))],
        "actor.path=assets/tiny-code/sft",
        f"dataset.path={data}/train.jsonl",
        f"dataset.test_path={data}/test.jsonl",
        "rollout.env.type=code",
        "ppo.gen.max_new_tokens=16",
        "evaluation.max_new_tokens=16",
        "evaluation.n_prompts=16",
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    # The rewards are the sandbox's verdicts: some functions pass every hidden test, some do not,
    # and the environment's numbers reach the per-step metrics through the agent.
    assert any(m["success_rate"] > 0 for m in metrics) and any(m["success_rate"] < 1 for m in metrics)
    for m in metrics:
        assert 0.0 <= m["agent/tests_passed"] <= 1.0 and all(f"agent/{k}" in m for k in OUTCOMES), m
    assert any(0.0 < m["agent/tests_passed"] < 1.0 for m in metrics)
    # Before and after: the code environment's grades (no math grader has a tests_passed).
    accuracy = json.loads((log_dir / "accuracy.json").read_text())
    for when in ("before", "after"):
        for run in ("greedy", "sampled"):
            assert 0.0 <= accuracy[when][run] <= 1.0
            assert set(accuracy[when][f"{run}_metrics"]) == {"tests_passed", *OUTCOMES}, accuracy[when]
    assert 0.0 < accuracy["before"]["greedy"] < 1.0  # the warm start solves some held-out prompts, not all
    assert "with env code" in out
