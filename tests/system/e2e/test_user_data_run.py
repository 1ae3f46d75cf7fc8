"""Real training runs on a user's own data (issues 18, 29): the tiny-math prompts converted to a
parquet file, or a folder of split files, with the user's column names, no id column, one-string
answers, and an extra column that only the user's environment reads — through the rollout
workers' real loading; the folder one launched by the training command from another directory."""

import json
import os
import subprocess
import sys

import datasets
import pytest

from helpers.paths import REPO, TESTS_DIR, TINY_MATH
from helpers.training_runs import SMALL_RUN, run_training, trial_log_dir
from helpers.user_data import USER_OVERRIDES, user_rows
from realhf.base.trial_files import read_metrics

STEPS = 3


@pytest.mark.e2e
@pytest.mark.slow  # ~40 s; CI reads every format through the real library in the unit tests
def test_a_run_trains_on_a_parquet_file_with_user_columns(tmp_path, no_leftover_processes):
    path = str(tmp_path / "my_math.parquet")
    datasets.Dataset.from_list(user_rows(os.path.join(TINY_MATH, "data", "train.jsonl"), 256)).to_parquet(path)
    proc, metrics, _ = run_training(
        tmp_path,
        "parquet",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        f"dataset.path={path}",
        *USER_OVERRIDES,
        "rollout.env.type=helpers.user_data:AnswerColumnEnv",
        timeout=400,
        env=dict(os.environ, PYTHONPATH=TESTS_DIR),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    # Only an environment that read each row's answer_number can have graded an answer right.
    assert any(m["success_rate"] > 0 for m in metrics), metrics


@pytest.mark.e2e
@pytest.mark.slow  # 34 s measured under load (8 steps); CI: test_data_sources.py, test_user_data_config.py, test_train_command.py
def test_the_training_command_trains_from_another_directory_on_a_folder_of_files_with_user_columns(
    tmp_path, no_leftover_processes
):
    folder = tmp_path / "my_math"
    folder.mkdir()
    for name, source, n in (("train.jsonl", "train.jsonl", 256), ("test.jsonl", "test.jsonl", 16)):
        rows = user_rows(os.path.join(TINY_MATH, "data", source), n)
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    work = tmp_path / "work"  # the user's own directory: no assets/ or training/ here
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "realhf.apps.train", "trial_name=folder", f"cluster.fileroot={tmp_path}"]
        + ["cluster.device=cpu", "exp_ctrl.benchmark_steps=8", *SMALL_RUN]
        + [f"dataset.path={folder}", f"dataset.test_path={folder}", *USER_OVERRIDES]
        + ["rollout.env.type=helpers.user_data:AnswerColumnEnv"],
        cwd=work,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR])),
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"actor.path='assets/tiny-math/sft' is not in {work}: using realhf's own copy" in out
    metrics = read_metrics(trial_log_dir(tmp_path, "folder"))
    assert [m["step"] for m in metrics] == list(range(1, 9))
    # Only an environment that read each row's answer_number column can have graded an answer right.
    assert any(m["success_rate"] > 0 for m in metrics), metrics
