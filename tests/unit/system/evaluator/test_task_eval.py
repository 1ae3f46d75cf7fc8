"""Evaluation through the task (realhf/system/evaluator/task_eval.py): the rules that turn episodes into
numbers, the built-in math task's numbers being its grader's, a user's non-math task evaluated
before and after training by its own reward, and held-out rows the task cannot evaluate refused
with the way out. (The evaluator worker's run of a user's task: test_evaluator_worker.py.)"""

import importlib.util
import json
import os

import pytest

from helpers.engine_answers import greedy_answers
from helpers.paths import REPO, TINY_MATH
from helpers.user_agents import final_number, parity_rows
from realhf.api.agent import Outcome
from realhf.api.cli_args import EnvConfig
from realhf.api.worker_configs import EvaluatorConfig
from realhf.system.evaluator.task_eval import (
    Episode,
    EvaluationError,
    eval_line,
    eval_row,
    evaluate_weights,
    load_eval_rows,
    summarize,
)

TEST_FILE = os.path.join(TINY_MATH, "data", "test.jsonl")
SFT = os.path.join(TINY_MATH, "sft")
USER_TASK = [
    "rollout.agent.type=helpers.user_agents:ParityAgent",
    "rollout.env.type=helpers.user_agents:ParityEnv",
]


def _ok(reward, success=None, **info):
    return Episode(Outcome(reward, success=success, info=info), new_tokens=4)


def test_success_is_the_agents_rule_a_failed_episode_counts_unsuccessful_and_a_dropped_one_not_at_all():
    per_row = [
        [_ok(1.0), _ok(-1.0)],  # reward > 0 is a success when the agent does not say
        [_ok(0.5, success=False, turns=2), Episode(error="q2: ValueError: boom")],  # the agent says
        [Episode(new_tokens=3), _ok(2.0, turns=4)],  # None: dropped by the agent
    ]
    r = summarize(per_row, temperature=1.0)
    assert r["accuracy"] == pytest.approx(2 / 5)  # 2 successes of 5 counted (4 scored + 1 failed)
    assert r["reward_mean"] == pytest.approx((1.0 - 1.0 + 0.5 + 2.0) / 4)  # scored episodes only
    assert r["pass_at_k"] == pytest.approx(2 / 3) and r["k"] == 2 and r["n_prompts"] == 3
    assert (r["n"], r["failed"], r["dropped"]) == (6, 1, 1)
    assert r["metrics"] == {"turns": 3.0}
    # The rewards' distribution beside the mean: sorted [-1, 0.5, 1, 2], each at its nearest rank.
    assert r["reward_quantiles"] == [-1.0, 0.5, 1.0, 1.0, 2.0]
    assert r["frac_reward_zero_std"] == 0.0  # the one prompt with two scored answers had two rewards
    flat = summarize([[_ok(-0.5), _ok(-0.5)], [_ok(-0.5), _ok(1.0)], [_ok(1.0)]], temperature=1.0)
    assert flat["frac_reward_zero_std"] == 0.5
    line = eval_line(eval_row(3, flat, 1.0, 4, []))
    assert "min/median/max -0.500/-0.500/+1.000" in line and "50% of prompts with one reward for all answers" in line


def test_nothing_measured_is_an_error_naming_why():
    with pytest.raises(EvaluationError, match="2 failed .first: q: TypeError: x"):
        summarize([[Episode(error="q: TypeError: x"), Episode(error="q: TypeError: y")]], 0.0)
    with pytest.raises(EvaluationError, match="dropped every sample"):
        summarize([[Episode()]], 0.0)


@pytest.mark.parametrize("check_work", [False, True])
def test_the_math_tasks_accuracy_is_its_environments_grade(check_work):
    """The built-in agent and `math` environment: accuracy is the grader's verdict on the final
    answer (and, with check_work, on the worked lines too); the final answer alone is answer_right."""
    from realhf.plugins.environments.math_answer import work_lines_correct
    from realhf.plugins.environments.math_grader import MathGrader

    n = 24
    cfg = EvaluatorConfig(
        test_path=TEST_FILE, model_path=SFT, device="cpu", batch_size=n, env=EnvConfig(check_work=check_work)
    )
    (result,) = evaluate_weights(cfg, SFT, [(0.0, 1)], n)
    rows = [r.as_dict() for r in load_eval_rows(cfg, n)]
    answers = greedy_answers(SFT, rows)
    with MathGrader(n_workers=1) as grader:
        right = [bool(grader.grade(a, r["solutions"])) for a, r in zip(answers, rows)]
    success = [ok and (work_lines_correct(a) or not check_work) for ok, a in zip(right, answers)]
    assert result["accuracy"] == pytest.approx(sum(success) / n)
    assert result["metrics"]["answer_right"] == pytest.approx(sum(right) / n)
    assert result["reward_mean"] == pytest.approx(2 * sum(success) / n - 1)  # the math agent's ±1


def _main():
    spec = importlib.util.spec_from_file_location("main_async_ppo", os.path.join(REPO, "training", "main_async_ppo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_before_and_after_training_a_users_task_is_evaluated_on_the_rows_there_are(tmp_path, monkeypatch):
    from realhf.experiments.config_loading import compose_config

    monkeypatch.chdir(REPO)
    rows = parity_rows(TEST_FILE, 6)
    data = tmp_path / "parity.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main = _main()
    cfg = compose_config([*USER_TASK, f"dataset.test_path={data}", "evaluation.n_prompts=500", "cluster.device=cpu"])
    result = main.evaluate(SFT, cfg)
    even = [final_number(a) is not None and final_number(a) % 2 == 0 for a in greedy_answers(SFT, rows)]
    assert result["n_prompts"] == 6  # not the 500 asked for: the file has 6
    assert result["greedy"] == pytest.approx(sum(even) / 6)
    assert result["greedy_reward_mean"] == pytest.approx((2.0 * sum(even) - 0.5 * (6 - sum(even))) / 6)
    line = main.evaluation_line("before training:", result, None, cfg)
    assert "on 6 held-out prompts" in line and "agent helpers.user_agents:ParityAgent" in line
    assert "digits " in line  # the agent's own metric
    # The reward-function route names the user's function, not the built-in math agent it runs in.
    cfg.rollout.agent.type, cfg.rollout.agent.reward_fn = "math-single-step", "my_rewards.py:reverse_reward"
    line = main.evaluation_line("before training:", result, None, cfg)
    assert "the success rate of your reward function my_rewards.py:reverse_reward" in line and "agent " not in line


def test_held_out_rows_the_task_cannot_evaluate_are_refused_naming_the_way_out(tmp_path, monkeypatch):
    from realhf.experiments.config_loading import compose_config
    from realhf.experiments.file_validation import check_eval_rows
    from realhf.experiments.validation import ConfigError

    monkeypatch.chdir(REPO)
    parity = tmp_path / "parity.jsonl"
    parity.write_text("".join(json.dumps(r) + "\n" for r in parity_rows(TEST_FILE, 4)))
    check_eval_rows(compose_config([*USER_TASK, f"dataset.test_path={parity}"]))  # a non-math task's own rows
    with pytest.raises(ConfigError) as e:  # the math task on rows without references
        check_eval_rows(compose_config([f"dataset.test_path={parity}"]))
    message = str(e.value)
    assert "missing field 'solutions'" in message and "rows of the training task" in message
    assert "evaluation.n_prompts=0" in message and "exp_ctrl.eval_freq_steps=0" in message
    # The evaluator, given such rows all the same, says the same.
    cfg = EvaluatorConfig(test_path=str(parity), model_path=SFT)
    with pytest.raises(ValueError, match=r"missing field 'solutions'.*evaluation.n_prompts=0"):
        load_eval_rows(cfg, 4)
