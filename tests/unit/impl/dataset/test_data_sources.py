"""Data from anywhere (issue 29 item 7): a folder of jsonl/csv/parquet files split by file name,
read by the real `datasets.load_dataset`, and Hugging Face hub dataset names through the real
HF datasets cache, offline and not; all of them through the same row checks and column mapping
as a JSONL file. What is neither a file, a folder nor a hub name is "no such file", never a
request to the hub."""

import json
import os
import subprocess
import sys
import time

import datasets
import pytest

from helpers.paths import REPO, TINY_MATH
from helpers.user_data import USER_COLUMNS, user_rows
from realhf.impl.dataset.prompt_dataset import DatasetFormatError, count_prompts, load_jsonl_prompts, load_prompts
from realhf.impl.dataset.table_formats import source_kind

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")
TEST = os.path.join(TINY_MATH, "data", "test.jsonl")
N = 10


@pytest.fixture(autouse=True)
def _own_datasets_cache(tmp_path, monkeypatch):
    # A streamed folder leaves only a lock file in the cache, but not in the user's.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def _write(path, fmt, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))


# Where the split files go: the names datasets.load_dataset(folder) takes splits from.
LAYOUTS = {
    "jsonl": ("train.jsonl", "test.jsonl"),
    "csv": ("train.csv", "test.csv"),
    "parquet": ("data/train-00000-of-00001.parquet", "data/test-00000-of-00001.parquet"),
}


@pytest.mark.parametrize("fmt", sorted(LAYOUTS))
def test_a_folder_of_data_files_is_read_split_by_file_name_with_user_columns(tmp_path, fmt):
    folder = tmp_path / "my_math"
    train_name, test_name = LAYOUTS[fmt]
    _write(folder / train_name, fmt, user_rows(TRAIN, N))
    _write(folder / test_name, fmt, user_rows(TEST, 4))
    assert source_kind(folder) == "folder"
    want = load_jsonl_prompts(TRAIN)[:N]
    got = load_prompts(folder, required=("solutions", "answer_number"), columns=USER_COLUMNS)
    assert [(r.prompt, r.solutions, r.task) for r in got] == [(r.prompt, r.solutions, r.task) for r in want]
    # No id column: ids from the folder's name, the split and the row, the same in every run.
    assert [r.query_id for r in got] == [f"my_math-train-{i}" for i in range(N)]
    assert got[2].as_dict()["answer_number"] == user_rows(TRAIN, N)[2]["answer_number"]
    held_out = load_prompts(folder, columns=USER_COLUMNS, split="test")
    assert [r.prompt for r in held_out] == [r.prompt for r in load_jsonl_prompts(TEST)[:4]]
    assert count_prompts(folder, split="test") == 4
    with pytest.raises(DatasetFormatError, match=r"has no split 'validation' \(its splits: train, test\)"):
        load_prompts(folder, columns=USER_COLUMNS, split="validation")


def test_chat_rows_and_a_bad_row_in_a_folder_are_checked_as_in_a_jsonl_file(tmp_path):
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "1+1?"}], "answer": "#### 2"},
        {"id": "b", "question": "Q: 2+2?\nA:", "answer": "#### 4"},
    ]
    folder = tmp_path / "chat"
    _write(folder / "train.jsonl", "jsonl", rows)
    columns = type(USER_COLUMNS)(query_id="id", prompt="question", solutions="answer")
    got = load_prompts(folder, columns=columns)
    assert got[0].as_dict()["messages"] == rows[0]["messages"] and "prompt" not in got[0].fields
    assert got[1].prompt == rows[1]["question"] and "messages" not in got[1].fields
    _write(folder / "train.jsonl", "jsonl", [*rows, {"id": "c", "question": "Q", "answer": ""}])
    with pytest.raises(DatasetFormatError) as e:
        load_prompts(folder, columns=columns)
    assert str(e.value) == (
        f"{folder} split 'train' row 2: column 'answer' (dataset.columns.solutions) is empty; a row needs a "
        "reference answer"
    )


def test_what_a_path_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("{}\n")
    (tmp_path / "t.parquet").write_bytes(b"")
    datasets.Dataset.from_list([{"a": 1}]).save_to_disk("saved")
    datasets.DatasetDict(train=datasets.Dataset.from_list([{"a": 1}])).save_to_disk("saved_dict")
    os.mkdir("data")
    assert [source_kind(p) for p in ("d.jsonl", "t.parquet", "saved", "saved_dict", "data")] == [
        "jsonl",
        "parquet",
        "saved",
        "saved",
        "folder",
    ]
    assert source_kind("openai/gsm8k") == "hub"
    # Mistyped local paths are said to be missing, not looked up on the hub.
    for typo in ("data/trian", "d2.jsonl", "gsm8k", "me/data.jsonl", "./x/y", "a/b/c"):
        with pytest.raises(DatasetFormatError, match=f"^{typo}: no such file or directory \\(relative paths are from"):
            source_kind(typo)


# Run in a fresh interpreter: HF_HOME and HF_DATASETS_OFFLINE are read when `datasets` is imported.
HUB_SCRIPT = """
import json, os, sys, time
import datasets
from datasets.packaged_modules.json.json import Json
from realhf.api.cli_args import DatasetColumnsConfig
from realhf.impl.dataset.prompt_dataset import DatasetFormatError, load_prompts

train, test, populate = sys.argv[1:4]
cache = str(datasets.config.HF_DATASETS_CACHE)
if populate == "1":
    # What loading the hub dataset `realhf-test/tiny_math` leaves in the cache: its files as
    # prepared by the packaged json builder, under <owner>___<name>/<config>/<version>/<hash>.
    Json(cache_dir=cache, dataset_name="tiny_math", config_id="default", hash="0123456789abcdef",
         data_files={"train": train, "test": test}).download_and_prepare()
    os.rename(os.path.join(cache, "tiny_math"), os.path.join(cache, "realhf-test___tiny_math"))
out = {"cache": cache}
try:
    rows = load_prompts("realhf-test/tiny_math", split="test",
                        columns=DatasetColumnsConfig(query_id="", prompt="question", solutions="answer", task="kind"))
    out["rows"] = [[r.query_id, r.prompt, list(r.solutions)] for r in rows]
except DatasetFormatError as e:
    out["cached_error"] = str(e)
start = time.monotonic()
try:
    load_prompts("realhf-test/not_cached_anywhere", config_name="main")
except DatasetFormatError as e:
    out["error"], out["seconds"] = str(e), time.monotonic() - start
print(json.dumps(out))
"""


def _hub(tmp_path, populate, **env):
    train, test = tmp_path / "tr.jsonl", tmp_path / "te.jsonl"
    _write(train, "jsonl", user_rows(TRAIN, 6))
    _write(test, "jsonl", user_rows(TEST, 3))
    env = {**os.environ, "PYTHONPATH": REPO, "HF_HOME": str(tmp_path / "hf"), **env}
    env.pop("HF_DATASETS_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, str(train), str(test), populate],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.system
def test_a_hub_name_offline_comes_from_the_cache_and_one_not_cached_is_refused_saying_how_to_get_it(tmp_path):
    out = _hub(tmp_path, "1", HF_DATASETS_OFFLINE="1")
    assert out["cache"] == str(tmp_path / "hf" / "datasets")
    # Cached: read offline, through the same column mapping as a file (ids from the name and split).
    want = load_jsonl_prompts(TEST)[:3]
    assert out["rows"] == [[f"tiny_math-test-{i}", r.prompt, list(r.solutions)] for i, r in enumerate(want)]
    error = out["error"]
    assert error.startswith(
        "'realhf-test/not_cached_anywhere' (dataset.config_name=main) is neither a local file or folder"
    ), error
    assert f"not in the datasets cache {out['cache']}" in error and "HF_DATASETS_OFFLINE=1" in error
    assert "datasets.load_dataset('realhf-test/not_cached_anywhere', 'main')" in error
    assert ".save_to_disk(DIR) and set dataset.path=DIR" in error
    assert out["seconds"] < 5  # offline: no network wait at all


@pytest.mark.system
def test_a_hub_name_the_hub_cannot_serve_fails_within_the_timeout_naming_the_cache(tmp_path):
    # Online, but the hub's address refuses connections (as on a machine without network).
    start = time.monotonic()
    out = _hub(tmp_path, "0", HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="0", HF_DATASETS_OFFLINE="0")
    assert time.monotonic() - start < 60 and out["seconds"] < 15
    assert "is not in the datasets cache" in out["cached_error"]  # nothing cached in this HF_HOME
    error = out["error"]
    assert "'realhf-test/not_cached_anywhere'" in error and "the hub is unreachable (" in error
    assert "HF_DATASETS_OFFLINE=0" in error and f"not in the datasets cache {out['cache']}" in error


def test_a_folder_file_that_does_not_parse_is_named(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "Q", "solutions": ["#### 1"]}\n{not json\n')
    with pytest.raises(DatasetFormatError, match=f"^{folder} split 'train' row 0: the data files cannot be read"):
        load_prompts(folder)
