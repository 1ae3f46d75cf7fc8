"""A real training run on a user's own data (issue 18): the tiny-math prompts converted to a
parquet file with the user's column names, no id column, one-string answers, and an extra
column that only the user's environment reads — through the rollout workers' real loading."""

import os

import datasets
import pytest

from helpers.paths import TESTS_DIR, TINY_MATH
from helpers.training_runs import SMALL_RUN, run_training
from helpers.user_data import USER_OVERRIDES, user_rows

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
