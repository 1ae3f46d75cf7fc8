"""Users' own data in the experiment config (issue 18): dataset.path / dataset.test_path as
parquet and saved `datasets` directories with dataset.columns and the splits, checked before any
process starts and handed on to the rollout workers and the evaluator."""

import json
import os
import subprocess
import sys

import datasets
import pytest

from helpers.paths import REPO, TINY_MATH
from helpers.user_data import USER_COLUMNS, USER_OVERRIDES, user_rows
from realhf.api.worker_configs import EvaluatorConfig, RolloutWorkerConfig
from realhf.experiments.async_ppo import initial_setup
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validate import validate_experiment
from realhf.experiments.validation import ConfigError

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")
TEST = os.path.join(TINY_MATH, "data", "test.jsonl")


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


@pytest.fixture(scope="module")
def user_dict(tmp_path_factory):
    """The user's tiny-math as a saved DatasetDict: 'train' (200 rows) and 'heldout' (50 rows)."""
    path = tmp_path_factory.mktemp("data") / "mine"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(user_rows(TRAIN, 200)), heldout=datasets.Dataset.from_list(user_rows(TEST, 50))
    ).save_to_disk(str(path))
    return str(path)


def _parquet(tmp_path, name, bad_row=None) -> str:
    rows = user_rows(TRAIN, 60)
    if bad_row is not None:
        rows[bad_row]["answer"] = ""  # one string column: an empty answer, nothing to grade against
    path = str(tmp_path / name)
    datasets.Dataset.from_list(rows).to_parquet(path)
    return path


def _bad_parquet(tmp_path) -> str:
    """The user's train and test files (dataset.columns name both); row 41 of the train one is bad."""
    return _parquet(tmp_path, "mine.parquet", bad_row=41), _parquet(tmp_path, "heldout.parquet")


def test_a_saved_dataset_dict_with_user_columns_reaches_every_worker(user_dict):
    cfg = compose_config(
        [
            f"dataset.path={user_dict}",
            f"dataset.test_path={user_dict}",
            "dataset.test_split=heldout",
            "dataset.chat_template=off",
            "exp_ctrl.eval_freq_steps=5",
            "groups_per_step=4",
            "exp_ctrl.benchmark_steps=0",
            "exp_ctrl.total_train_epochs=2",
            *USER_OVERRIDES,
        ]
    )
    assert cfg.dataset.columns == USER_COLUMNS
    configs = [c for spec in initial_setup(cfg) for c in spec.configs]
    rollouts = [c for c in configs if isinstance(c, RolloutWorkerConfig)]
    assert rollouts and all(
        (c.dataset_path, c.dataset_columns, c.dataset_split, c.chat_template)
        == (user_dict, USER_COLUMNS, "train", "off")
        for c in rollouts
    )
    (evaluator,) = [c for c in configs if isinstance(c, EvaluatorConfig)]
    assert (evaluator.test_path, evaluator.columns, evaluator.test_split) == (user_dict, USER_COLUMNS, "heldout")
    (master,) = [c for c in configs if type(c).__name__ == "MasterWorkerConfig"]
    assert master.total_train_steps == 2 * 200 // 4  # the table's rows, counted from the train split


@pytest.mark.parametrize("field", ["dataset.path", "dataset.test_path"])
def test_a_bad_table_row_is_refused_naming_the_field_file_row_and_column(tmp_path, field):
    path, good = _bad_parquet(tmp_path)
    other = "dataset.test_path" if field == "dataset.path" else "dataset.path"
    with pytest.raises(ConfigError) as e:
        validate_experiment(compose_config([f"{field}={path}", f"{other}={good}", *USER_OVERRIDES]))
    assert str(e.value).startswith(f"{field}: {path} row 41: column 'answer' (dataset.columns.solutions) is empty")


def test_user_columns_apply_to_both_files_and_an_id_column_left_unnamed_is_refused(tmp_path):
    path = _parquet(tmp_path, "mine.parquet")  # test_path stays the tiny-math JSONL, which has query_id
    with pytest.raises(
        ConfigError,
        match=r"dataset.test_path: .*test.jsonl:1: the data has a field 'query_id', but "
        r"dataset.columns.query_id is empty",
    ):
        validate_experiment(compose_config([f"dataset.path={path}", *USER_OVERRIDES]))


def test_a_missing_split_is_refused_naming_the_splits(user_dict):
    with pytest.raises(ConfigError, match=r"dataset.test_path: .* has no split 'test' \(its splits: train, heldout\)"):
        validate_experiment(
            compose_config([f"dataset.path={user_dict}", f"dataset.test_path={user_dict}", *USER_OVERRIDES])
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dataset.columns.prompt="], "dataset.columns.prompt is empty"),
        (["dataset.columns.task=prompt"], "dataset.columns.prompt and dataset.columns.task both name column 'prompt'"),
    ],
)
def test_column_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_experiment(compose_config(overrides))


@pytest.mark.system
def test_command_line_refuses_a_bad_table_row_before_starting_anything(tmp_path):
    path, good = _bad_parquet(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "training/main_async_ppo.py",
            f"dataset.path={path}",
            f"dataset.test_path={good}",
            f"cluster.fileroot={tmp_path}",
            *USER_OVERRIDES,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"dataset.path: {path} row 41: column 'answer'" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


@pytest.mark.system
def test_a_table_without_the_datasets_extra_is_refused_naming_it(tmp_path):
    path, _ = _bad_parquet(tmp_path)
    code = (
        "import sys; sys.modules['datasets'] = None\n"  # as if not installed
        "from realhf.experiments.file_validation import load_rows\nfrom realhf.experiments.validation import ConfigError\n"
        f"try:\n    load_rows('dataset.path', {path!r})\n"
        "except ConfigError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (
        proc.stdout.strip()
        == f"dataset.path: reading {path} needs the datasets library: pip install 'realhf[datasets]'"
    ), proc.stderr[-2000:]


def test_a_folder_of_data_files_and_the_config_name_reach_every_worker(tmp_path):
    folder = tmp_path / "my_math"
    folder.mkdir()
    for name, source, n in (("train.jsonl", TRAIN, 40), ("test.jsonl", TEST, 8)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in user_rows(source, n)))
    cfg = compose_config(
        [f"dataset.path={folder}", f"dataset.test_path={folder}", "dataset.config_name=cfg", "groups_per_step=4"]
        + ["exp_ctrl.benchmark_steps=0", "exp_ctrl.total_train_epochs=1", "exp_ctrl.eval_freq_steps=5"]
        + ["rollout.env.type=helpers.user_data:AnswerColumnEnv", *USER_OVERRIDES]
    )
    configs = [c for spec in initial_setup(cfg) for c in spec.configs]
    rollouts = [c for c in configs if isinstance(c, RolloutWorkerConfig)]
    assert rollouts and all(
        (c.dataset_path, c.dataset_split, c.dataset_config_name) == (str(folder), "train", "cfg") for c in rollouts
    )
    (evaluator,) = [c for c in configs if isinstance(c, EvaluatorConfig)]
    assert (evaluator.test_path, evaluator.test_split, evaluator.config_name) == (str(folder), "test", "cfg")
    (master,) = [c for c in configs if type(c).__name__ == "MasterWorkerConfig"]
    assert master.total_train_steps == 40 // 4  # the train split's rows


@pytest.mark.parametrize("field", ["dataset.path", "dataset.test_path"])
def test_a_mistyped_local_path_is_said_to_be_missing_not_looked_up_on_the_hub(field):
    with pytest.raises(ConfigError) as e:
        validate_experiment(compose_config([f"{field}=assets/tiny-math/data/trian.jsonl"]))
    assert str(e.value).startswith(
        f"{field}='assets/tiny-math/data/trian.jsonl': assets/tiny-math/data/trian.jsonl: no such file or directory "
        f"(relative paths are from {REPO})"
    ), str(e.value)


def test_the_default_config_runs_from_any_directory_on_realhfs_own_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no assets/ here: the config's relative paths name realhf's copies
    cfg = compose_config(["evaluation.n_prompts=0"])
    validate_experiment(cfg)
    assert (cfg.actor.path, cfg.dataset.path, cfg.dataset.test_path) == (
        os.path.join(TINY_MATH, "sft"),
        TRAIN,
        TEST,
    )
    # A file of the user's under the same relative name wins over realhf's.
    mine = tmp_path / "assets" / "tiny-math" / "data" / "train.jsonl"
    mine.parent.mkdir(parents=True)
    mine.write_text("".join(json.dumps(r) + "\n" for r in user_rows(TRAIN, 20)))
    cfg = compose_config(["evaluation.n_prompts=0", "groups_per_step=4", *USER_OVERRIDES])
    cfg.dataset.test_path = str(mine)
    validate_experiment(cfg)
    assert cfg.dataset.path == "assets/tiny-math/data/train.jsonl"
