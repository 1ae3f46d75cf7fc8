"""The evaluator worker in this process against a fake trainer: real published directories of the
tiny-math model, pruned as the trainer prunes them, a version number in (in-memory) name resolve,
the real native engine and grader. The engine is paused to hold an evaluation "in progress"."""

import dataclasses
import json
import os
import shutil
import time

import pytest

from helpers.paths import TINY_MATH
from realhf.api.cli_args import NameResolveConfig
from realhf.api.worker_configs import EvaluatorConfig
from realhf.base import name_resolve, names
from realhf.impl.model.checkpoint import prune_versions
from realhf.system.evaluator.evaluator_worker import Evaluator
from realhf.system.stats.stats_logger import read_eval_metrics
from realhf.system.worker_base import WorkerContext

EXP, TRIAL = "eval-test", "t"


class FakeTrainer:
    """Publishes version v as the model worker does (directory first, then model_version), and
    keeps only the newest two. Versions up to `untrained_until` are the random initial weights
    (accuracy 0), later ones the warm-started model, so a result shows which weights it measured."""

    def __init__(self, run_dir, untrained_until=8):
        self.untrained_until = untrained_until
        self.root = run_dir / "published_weights" / "actor"
        self.key = names.model_version(EXP, TRIAL, "actor")

    def step_to(self, version):
        weights = "base" if version <= self.untrained_until else "sft"
        shutil.copytree(os.path.join(TINY_MATH, weights), self.root / str(version))
        prune_versions(self.root, keep=2, current=version)
        name_resolve.add(self.key, str(version), replace=True)


@pytest.fixture
def evaluator(tmp_path):
    name_resolve.reconfigure(NameResolveConfig(type="memory"))
    # nice=0: os.nice(+10) here would lower the priority of the test runner itself for good.
    cfg = EvaluatorConfig(
        eval_freq_steps=4,
        test_path=os.path.join(TINY_MATH, "data", "test.jsonl"),
        n_prompts=8,
        samples=2,
        model_path=os.path.join(TINY_MATH, "sft"),
        device="cpu",
        nice=0,
        batch_size=16,
        run_dir=str(tmp_path / "run"),
        metrics_path=str(tmp_path / "logs" / "eval_metrics.jsonl"),
        poll_interval=0.01,
    )
    w = Evaluator(WorkerContext(experiment_name=EXP, trial_name=TRIAL, worker_type="evaluator"), cfg)
    w._configure()
    yield w, FakeTrainer(tmp_path / "run"), str(tmp_path / "logs")
    w._exit_hook()
    name_resolve.reset()


def _poll_until(w, what, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        w._poll()


def _evaluate_version_4(cfg, tmp_path):
    """An evaluator of `cfg` (run_dir and metrics_path under tmp_path) while a fake trainer steps
    to version 4 (eval_freq_steps=4): until that version's row is written."""
    w = Evaluator(WorkerContext(experiment_name=EXP, trial_name=TRIAL, worker_type="evaluator"), cfg)
    w._configure()
    try:
        trainer = FakeTrainer(tmp_path / "run", untrained_until=0)
        for v in range(1, 5):
            trainer.step_to(v)
        _poll_until(w, "version 4 evaluated", lambda: len(read_eval_metrics(str(tmp_path / "logs"))) == 1)
    finally:
        w._exit_hook()
        name_resolve.reset()


@pytest.mark.system
def test_versions_taken_while_busy_survive_the_prune_and_only_the_newest_is_evaluated(evaluator):
    w, trainer, log_dir = evaluator
    w._engine.pause()  # the evaluation of version 4 will wait in the engine: "in progress"
    for v in range(1, 5):
        trainer.step_to(v)
        w._poll()
    assert w._running is not None and w._running[0].version == 4
    for v in range(5, 13):  # 8 and 12 come out while 4 is still being evaluated
        trainer.step_to(v)
        w._poll()
    assert sorted(p.name for p in trainer.root.iterdir()) == ["11", "12"]  # 4 and 8 pruned by the trainer
    assert sorted(os.listdir(w._taken)) == ["12", "4", "8"]  # ...but held by the evaluator's links
    w._engine.resume()
    _poll_until(w, "two evaluations", lambda: len(read_eval_metrics(log_dir)) == 2)
    rows = read_eval_metrics(log_dir)
    assert [r["version"] for r in rows] == [4, 12]
    assert rows[1]["eval/skipped"] == [8]
    # Each evaluation measured its own version's weights: 4 is the random init, 12 the warm start
    # (measured 0.3-0.5 on these 16 answers; all 16 wrong has probability ~1e-4).
    assert rows[0]["eval/accuracy"] == 0 and rows[1]["eval/accuracy"] > 0
    for r in rows:
        assert 0 <= r["eval/accuracy"] <= r["eval/pass_at_k"] <= 1  # pass@k >= accuracy, always
        assert (r["eval/k"], r["eval/n_prompts"]) == (2, 8) and r["eval/seconds"] > 0
    _poll_until(w, "the links released", lambda: os.listdir(w._taken) == [])


def test_stopping_abandons_an_evaluation_in_progress_at_once_and_records_nothing(evaluator):
    w, trainer, log_dir = evaluator
    w._engine.pause()
    for v in range(1, 5):
        trainer.step_to(v)
        w._poll()
    future = w._running[1]
    t0 = time.monotonic()
    w._exit_hook()
    with pytest.raises(Exception, match="abort|stopped|shutting down"):
        future.result(timeout=5)
    assert time.monotonic() - t0 < 5
    assert read_eval_metrics(log_dir) == []
    assert not w._taken.exists()


def test_a_restarted_evaluator_carries_on_after_the_last_recorded_version(evaluator, tmp_path):
    w, trainer, log_dir = evaluator
    for v in range(1, 5):
        trainer.step_to(v)
    _poll_until(w, "version 4 evaluated", lambda: len(read_eval_metrics(log_dir)) == 1)
    w._exit_hook()
    again = Evaluator(w.ctx, w.config)  # same config: the launcher's restart
    again._configure()
    try:
        assert again._schedule.evaluated == 4
        trainer.step_to(5)
        again._poll()
        assert again._running is None and os.listdir(again._taken) == []  # 4 is not evaluated twice
    finally:
        again._exit_hook()


def test_a_resumed_run_drops_the_rows_of_versions_it_trains_again(tmp_path):
    name_resolve.reconfigure(NameResolveConfig(type="memory"))  # the trainer has not republished yet
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "eval_metrics.jsonl", "w") as f:
        for v in (4, 8):
            f.write(json.dumps({"step": v, "version": v, "eval/accuracy": 0.5}) + "\n")
    cfg = EvaluatorConfig(
        eval_freq_steps=4,
        test_path=os.path.join(TINY_MATH, "data", "test.jsonl"),
        n_prompts=2,
        model_path=os.path.join(TINY_MATH, "sft"),
        device="cpu",
        nice=0,
        batch_size=4,
        run_dir=str(tmp_path / "run"),
        metrics_path=str(logs / "eval_metrics.jsonl"),
    )
    w = Evaluator(
        WorkerContext(experiment_name=EXP, trial_name=TRIAL, worker_type="evaluator"),
        dataclasses.replace(cfg, resumed_version=6),
    )  # the checkpoint of step 6: 8 is trained again
    w._configure()
    try:
        assert [r["version"] for r in read_eval_metrics(str(logs))] == [4]
        assert w._schedule.evaluated == 4
    finally:
        w._exit_hook()
        name_resolve.reset()


def test_evaluations_reach_tensorboard_when_configured(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from realhf.api.cli_args import StatsLoggingConfig

    name_resolve.reconfigure(NameResolveConfig(type="memory"))
    tb = tmp_path / "tb"
    cfg = EvaluatorConfig(
        eval_freq_steps=4,
        test_path=os.path.join(TINY_MATH, "data", "test.jsonl"),
        n_prompts=4,
        samples=2,
        model_path=os.path.join(TINY_MATH, "sft"),
        device="cpu",
        nice=0,
        batch_size=8,
        run_dir=str(tmp_path / "run"),
        metrics_path=str(tmp_path / "logs" / "eval_metrics.jsonl"),
        stats=StatsLoggingConfig(tensorboard_path=str(tb)),
        poll_interval=0.01,
    )
    _evaluate_version_4(cfg, tmp_path)
    events = EventAccumulator(str(tb))
    events.Reload()
    assert {"eval/accuracy", "eval/pass_at_k", "eval/seconds"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("eval/accuracy")] == [4]


def test_an_engine_that_does_not_answer_fails_the_evaluation_naming_the_wait():
    import asyncio

    from helpers.trajectories import TINY_SFT
    from realhf.api.cli_args import GenerationHyperparameters
    from realhf.impl.inference.factory import create_engine
    from realhf.system.rollout.engine_client import EngineGenerationClient

    engine = create_engine(TINY_SFT, max_running_requests=4).start()
    try:
        assert engine.pause().result(5) == 0  # requests queue and are never answered
        client = EngineGenerationClient(engine, answer_timeout=0.3)
        with pytest.raises(TimeoutError, match=r"answer from the in-process engine took longer than 0.3s"):
            asyncio.run(client.generate("q", [5, 6], GenerationHyperparameters(max_new_tokens=4)))
        assert isinstance(client.broken, TimeoutError)  # the engine's failure: the evaluation fails with it
    finally:
        engine.stop()


def test_a_users_own_task_is_evaluated_by_its_own_reward_not_the_math_grader(tmp_path):
    """A non-math task (rows without `solutions`) with the user's agent and environment: the
    evaluator runs them, and its numbers are the user's success, reward and metric."""
    from helpers.engine_answers import greedy_answers
    from helpers.user_agents import final_number, parity_rows
    from realhf.api.cli_args import AgentConfig, EnvConfig
    from realhf.plugins.environments.math_grader import MathGrader

    test_file = os.path.join(TINY_MATH, "data", "test.jsonl")
    rows = parity_rows(test_file, 12)
    data = tmp_path / "parity.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name_resolve.reconfigure(NameResolveConfig(type="memory"))
    cfg = EvaluatorConfig(
        eval_freq_steps=4,
        test_path=str(data),
        n_prompts=100,  # the file has 12: the evaluation says 12
        samples=2,
        temperature=0.0,  # greedy twice: the numbers can be checked against answers generated apart
        agent=AgentConfig(type="helpers.user_agents:ParityAgent"),
        env=EnvConfig(type="helpers.user_agents:ParityEnv"),
        model_path=os.path.join(TINY_MATH, "sft"),
        device="cpu",
        nice=0,
        batch_size=16,
        run_dir=str(tmp_path / "run"),
        metrics_path=str(tmp_path / "logs" / "eval_metrics.jsonl"),
        poll_interval=0.01,
    )
    _evaluate_version_4(cfg, tmp_path)
    (row,) = read_eval_metrics(str(tmp_path / "logs"))

    answers = greedy_answers(cfg.model_path, rows)
    even = [final_number(a) is not None and final_number(a) % 2 == 0 for a in answers]
    p = sum(even) / len(even)
    assert (row["eval/n_prompts"], row["eval/k"], row["eval/failed"]) == (12, 2, 0)
    assert row["eval/accuracy"] == pytest.approx(p) and row["eval/pass_at_k"] == pytest.approx(p)
    assert row["eval/reward_mean"] == pytest.approx(2.0 * p - 0.5 * (1 - p))  # the agent's own reward
    digits = [len(str(abs(final_number(a)))) if final_number(a) is not None else 0 for a in answers]
    assert row["eval/agent/digits"] == pytest.approx(sum(digits) / len(digits))
    # The math grader scores these answers otherwise (against the references the user's rows lack).
    with open(test_file) as f:
        solutions = [json.loads(next(f))["solutions"] for _ in rows]
    with MathGrader(n_workers=1) as grader:
        graded = sum(bool(grader.grade(a, s)) for a, s in zip(answers, solutions)) / len(answers)
    assert graded != pytest.approx(p), (graded, p)
