"""Validation during training on real processes: with exp_ctrl.eval_freq_steps=4 the launcher
starts a niced evaluator beside the other workers; it evaluates the published versions that are
multiples of 4, records them in eval_metrics.jsonl (metrics.jsonl keeps one row per train step),
the workers' end never waits for an evaluation nor leaves a process behind, and the launcher then
evaluates the last version (42, not a multiple of 4) and prints the accuracy curve. The same run
measures the accuracy before and after training (evaluation.n_prompts) into accuracy.json."""

import json

import psutil
import pytest

from helpers.training_runs import SMALL_RUN, Run, trial_processes
from realhf.system.stats.stats_logger import read_eval_metrics

STEPS, EVERY = 42, 4  # the last version is not due: the launcher evaluates it


@pytest.mark.e2e
def test_evaluator_records_accuracy_of_every_fourth_version_at_low_priority(tmp_path, no_leftover_processes):
    run = Run(
        tmp_path,
        "eval",
        *SMALL_RUN,
        f"exp_ctrl.benchmark_steps={STEPS}",
        f"exp_ctrl.eval_freq_steps={EVERY}",
        "evaluation.during_n_prompts=16",
        "evaluation.during_samples=2",
        "evaluation.n_prompts=8",
    )
    try:
        run.wait_for("the evaluator to start", lambda: "evaluating every 4 versions" in run.log("evaluator-0"), 120)
        assert psutil.Process(run.worker_pid("evaluator-0")).nice() == 10
        # Steps take a fraction of a second and an evaluation at nice 10 several: the run is long
        # enough for some, never waits for one, and versions due while one ran are skipped.
        code = run.finish(timeout=600)
    except BaseException:
        run.stop()
        raise
    out = run.output()
    assert code == 0, out[-5000:]
    assert [m["step"] for m in run.metrics()] == list(range(1, STEPS + 1))  # train rows only
    evals = read_eval_metrics(str(run.log_dir))
    versions = [e["version"] for e in evals]
    assert versions and versions == sorted(set(versions)), out[-3000:]
    assert versions[-1] == STEPS and all(v % EVERY == 0 and 0 < v < STEPS for v in versions[:-1])
    assert f"after the run, the last version: evaluated version {STEPS} (step {STEPS}): accuracy" in out
    done = set()
    for e in evals:
        assert 0 <= e["eval/accuracy"] <= e["eval/pass_at_k"] <= 1
        assert -1 <= e["eval/reward_mean"] <= 1 and e["eval/failed"] == 0  # the math agent's ±1
        assert (e["eval/k"], e["eval/n_prompts"]) == (2, 16)
        assert all(s % EVERY == 0 and s < e["version"] and s not in done for s in e["eval/skipped"])
        done.update(e["eval/skipped"] + [e["version"]])
    if len(versions) > 1:
        assert f"evaluated version {versions[0]} (step {versions[0]}): accuracy" in run.log("evaluator-0")
    assert "accuracy curve" in out and "pass@2" in out
    accuracy = json.loads((run.log_dir / "accuracy.json").read_text())
    for when in ("before", "after"):
        assert accuracy[when]["n_prompts"] == 8 and 0 <= accuracy[when]["greedy"] <= 1
        assert "answer_right" in accuracy[when]["greedy_metrics"]
    assert "before training: greedy accuracy" in out and "on 8 held-out prompts" in out
    assert run.leftovers() == [] and trial_processes(str(tmp_path)) == []


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_evaluator_is_restarted_and_carries_on_without_repeating_a_version(tmp_path, no_leftover_processes):
    import signal

    run = Run(
        tmp_path,
        "evalkill",
        *SMALL_RUN,
        "exp_ctrl.benchmark_steps=60",
        "exp_ctrl.eval_freq_steps=2",
        "evaluation.during_n_prompts=16",
        "evaluation.during_samples=2",
    )
    try:
        run.wait_for("a first evaluation", lambda: read_eval_metrics(str(run.log_dir)), 300)
        run.kill_worker("evaluator-0", signal.SIGKILL)
        code = run.finish(timeout=600)
    except BaseException:
        run.stop()
        raise
    out = run.output()
    assert code == 0, out[-5000:]
    assert "workers restarted: {'evaluator/0': 1}" in out
    versions = [e["version"] for e in read_eval_metrics(str(run.log_dir))]
    assert versions == sorted(set(versions)) and all(v % 2 == 0 for v in versions)  # none twice, all due ones
    assert "evaluating every 2 versions from version" in run.log("evaluator-0").split("restart 1 of evaluator/0")[-1]
    assert run.leftovers() == [] and trial_processes(str(tmp_path)) == []
