"""Time to accuracy (scripts/bench/time_to_accuracy.py, accuracy_curve.py, peer_trl.py) and the
training-time budget it relies on (`exp_ctrl.max_train_seconds`).

The curve logic is checked on made-up curves; the budget and the checkpoint-to-training-seconds
mapping on a real short run; the TRL driver only where its venv was already made (CI never
installs TRL).
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from helpers.training_runs import EXPERIMENT, SMALL_RUN, run_training, trial_processes
from realhf.api.cli_args import ExperimentSaveEvalControl
from realhf.base.trial_files import TrialFiles
from realhf.experiments.validation import ConfigError, check_exp_ctrl
from scripts.bench import accuracy_curve as ac
from scripts.bench import peer_trl
from scripts.bench.time_to_accuracy import summarize, tables


def _curve(*points):
    return [{"train_s": t, "accuracy": a} for t, a in points]


def test_time_to_is_the_first_checkpoint_at_or_above_the_target():
    curve = _curve((0.0, 0.33), (30.0, 0.40), (60.0, 0.52), (90.0, 0.48), (120.0, 0.55))
    assert ac.time_to(curve, 0.50) == 60.0
    assert ac.time_to(curve, 0.52) == 60.0  # reaching it exactly counts
    assert ac.time_to(curve, 0.55) == 120.0
    assert ac.time_to(curve, 0.30) == 0.0  # the SFT point already is there
    assert ac.time_to(curve, 0.60) is None
    assert ac.time_to(list(reversed(curve)), 0.50) == 60.0  # order of the list does not matter


def test_default_target_is_three_quarters_of_the_way_to_the_worst_final():
    assert ac.default_target(0.3, [0.5, 0.7, 0.6]) == pytest.approx(0.45)


def test_summary_reports_time_to_target_and_ratios_against_trl():
    runs = {
        "realhf_default": {
            "overrides": [],
            "steps": 300,
            "train_s": 372.0,
            "samples_per_s": 150.0,
            "load_before": [2.0],
            "load_after": [2.1],
            "curve": _curve((0, 0.3), (100, 0.46), (200, 0.55)),
        },
        "trl": {
            "overrides": ["trl==x"],
            "steps": 250,
            "train_s": 373.0,
            "samples_per_s": 100.0,
            "load_before": [2.0],
            "load_after": [2.0],
            "curve": _curve((0, 0.3), (100, 0.40), (200, 0.45), (300, 0.5)),
        },
    }
    s = summarize(runs, {"accuracy": 0.3}, None)
    assert s["target"] == pytest.approx(0.45)  # 0.3 + 0.75 * (0.5 - 0.3)
    assert runs["realhf_default"]["time_to_target_s"] == 100
    assert runs["trl"]["time_to_target_s"] == 200
    q = s["ratios"]["realhf_default"]
    assert q["trl_over_realhf_time_to_target"] == 2.0
    assert q["realhf_over_trl_samples_per_s"] == 1.5
    assert q["final_accuracy_diff"] == pytest.approx(0.05)
    res = {"budget_s": 372, "seed": 1, "eval_prompts": 500, "eval_samples": 4, "save_steps": 10, "runs": runs, **s}
    titles = [t for t, _, _ in tables(res)]
    assert len(titles) == 3 and "target 0.45" in titles[0]
    # An explicit target wins; a never-reached one leaves no ratio.
    s = summarize(runs, {"accuracy": 0.3}, 0.9)
    assert (
        runs["trl"]["time_to_target_s"] is None
        and s["ratios"]["realhf_default"]["trl_over_realhf_time_to_target"] is None
    )


def test_saved_at_checkpoints_reads_each_saves_own_time(tmp_path):
    for g, t in ((4, 12.5), (2, 6.0)):
        d = tmp_path / f"version{g}"
        d.mkdir()
        (d / ac.SAVED_AT).write_text(json.dumps({"train_s": t, "step": g, "version": g}))
    (tmp_path / "version9").mkdir()  # no saved_at.json: not a finished save
    got = ac.saved_at_checkpoints(str(tmp_path))
    assert [(c["train_s"], c["step"]) for c in got] == [(6.0, 2), (12.5, 4)]


def test_max_train_seconds_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"exp_ctrl\.max_train_seconds must be >= 0"):
        check_exp_ctrl(ExperimentSaveEvalControl(max_train_seconds=-1.0))
    check_exp_ctrl(ExperimentSaveEvalControl(max_train_seconds=0.0))


BUDGET_S = 5.0
SAVE_SECS = 1.0


@pytest.mark.system
@pytest.mark.e2e
def test_a_run_stops_at_its_training_time_budget_and_saves_by_steps_and_by_seconds(tmp_path, no_leftover_processes):
    """The budget and both save cadences the benchmarks use (vs_trl saves every N seconds)."""
    proc, metrics, log_dir = run_training(
        tmp_path,
        "budget",
        "exp_ctrl.benchmark_steps=1000",
        f"exp_ctrl.max_train_seconds={BUDGET_S}",
        "exp_ctrl.save_freq_steps=16",
        f"exp_ctrl.save_freq_secs={SAVE_SECS}",
        "exp_ctrl.keep_last_saves=0",
        *SMALL_RUN,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    times = [m["step_time_s"] for m in metrics]
    # It stopped after the FIRST step at which the training clock reached the budget.
    assert sum(times) >= BUDGET_S and sum(times[:-1]) < BUDGET_S, times
    assert 2 < len(metrics) < 1000
    assert "max_train_seconds" in out and "done (" in out
    files = TrialFiles(str(tmp_path), EXPERIMENT, "budget")
    saves = ac.realhf_checkpoints(files.log_dir, files.run_dir)
    steps = [c["step"] for c in saves]
    # Every 16th step and the final one, each at Σ step_time_s through the step that made it.
    assert {m["step"] for m in metrics if m["step"] % 16 == 0} | {metrics[-1]["step"]} <= set(steps)
    for c in saves:
        assert c["train_s"] == pytest.approx(sum(times[: c["step"]]), abs=0.01)
        assert os.path.isfile(os.path.join(c["path"], "model.safetensors"))
        assert os.path.isfile(os.path.join(c["path"], "tokenizer.json"))
    # By seconds: a save off the 16-step grid comes >= SAVE_SECS after the one before (the master's
    # clock and Σ step_time_s differ by bookkeeping only), and no gap between saves is much longer
    # than SAVE_SECS plus one step.
    by_secs = [c for c in saves[:-1] if c["step"] % 16]
    assert by_secs, steps
    t = [0.0] + [c["train_s"] for c in saves]
    for prev, c in zip(t, saves):
        if c in by_secs:
            assert c["train_s"] - prev >= SAVE_SECS - 0.1, (steps, t)
        assert c["train_s"] - prev <= SAVE_SECS + max(times) + 0.1, (steps, t)
    clock = ac.clock_checkpoints(saves, t0=0.0)
    assert [c["step"] for c in clock] == steps and all(c["clock_s"] > 1e9 for c in clock)  # mtimes since 1970
    assert trial_processes(str(tmp_path)) == []


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.skipif(
    not peer_trl.venv_ready(),
    reason="the TRL venv (.bench/venvs/trl) is not made: run "
    "`python -m scripts.bench.peer_trl --short` once to make it (never in CI)",
)
def test_trl_driver_short_run_saves_timestamped_checkpoints(no_leftover_processes):
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench.peer_trl", "--short"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["bench"] == "peer_trl" and r["trl"] == peer_trl.TRL_VERSION
    assert r["steps"] >= 1 and r["train_s"] >= 20.0 and r["samples_per_s"] > 0
    assert r["n_samples"] == r["steps"] * 128
    saves = r["checkpoints"]
    assert saves and saves[-1]["step"] == r["steps"]
    assert [c["train_s"] for c in saves] == sorted(c["train_s"] for c in saves)
