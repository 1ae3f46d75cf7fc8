"""Users' own data (issue 18): JSONL, parquet and HF `datasets` directories (a Dataset or a
DatasetDict split), read with the real `datasets` library and pyarrow; user column names, a
missing id column, one-string solutions, bad rows named by file, row and column, and extra
columns reaching the user's environment and reward function."""

import asyncio
import json
import os
import subprocess
import sys

import datasets
import pytest

from helpers.paths import REPO, TINY_MATH
from helpers.user_data import USER_COLUMNS, user_rows
from realhf.api.agent import load_reward_fn
from realhf.api.cli_args import EnvConfig
from realhf.api.env import EnvFactory
from realhf.impl.dataset.prompt_dataset import DatasetFormatError, count_prompts, load_jsonl_prompts, load_prompts
from realhf.plugins.agents.math_single_step import call_reward_fn

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")
N = 12


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _parquet(path, rows):
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def _saved(path, rows):
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


def _saved_dict(path, rows, bad_split_rows=None):
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(rows[:-2]), test=datasets.Dataset.from_list(bad_split_rows or rows[-2:])
    ).save_to_disk(str(path))
    return str(path)


WRITERS = {"jsonl": (_jsonl, "data.jsonl"), "parquet": (_parquet, "data.parquet"), "saved": (_saved, "saved")}


def _write(tmp_path, fmt, rows):
    writer, name = WRITERS[fmt]
    return writer(tmp_path / name, rows)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_format_loads_the_same_rows_as_the_jsonl(tmp_path, fmt):
    want = load_jsonl_prompts(TRAIN)[:N]
    raw = [r.fields for r in want]
    got = load_prompts(_write(tmp_path, fmt, raw))
    assert got == want  # ids, prompts, solutions, task
    assert [r.as_dict() for r in got] == [r.as_dict() for r in want]
    assert count_prompts(_write(tmp_path, fmt, raw)) == N


def test_a_dataset_dict_is_read_split_by_split(tmp_path):
    raw = [r.fields for r in load_jsonl_prompts(TRAIN)[:N]]
    path = _saved_dict(tmp_path / "dd", raw)
    assert [r.query_id for r in load_prompts(path)] == [r["query_id"] for r in raw[:-2]]  # default: train
    assert [r.query_id for r in load_prompts(path, split="test")] == [r["query_id"] for r in raw[-2:]]
    assert count_prompts(path, split="test") == 2
    with pytest.raises(DatasetFormatError, match=r"has no split 'validation' \(its splits: train, test\)"):
        load_prompts(path, split="validation")


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_user_column_names_string_solutions_and_made_ids(tmp_path, fmt):
    rows = user_rows(TRAIN, N)
    path = _write(tmp_path, fmt, rows)
    got = load_prompts(path, required=("solutions", "answer_number"), columns=USER_COLUMNS)
    want = load_jsonl_prompts(TRAIN)[:N]
    assert [(r.prompt, r.solutions, r.task) for r in got] == [(r.prompt, r.solutions, r.task) for r in want]
    # No id column: ids from the file name and the JSONL line (1-based) or the table row (0-based).
    first = 1 if fmt == "jsonl" else 0
    assert [r.query_id for r in got] == [f"{os.path.basename(path)}-{i + first}" for i in range(N)]
    assert [r.query_id for r in load_prompts(path, columns=USER_COLUMNS)] == [r.query_id for r in got]  # stable
    # The agent sees realhf's names for the mapped columns, and every other column as it is.
    row = got[3].as_dict()
    assert row["prompt"] == rows[3]["question"] and row["solutions"] == [rows[3]["answer"]]
    assert row["answer_number"] == rows[3]["answer_number"] and "question" not in row and "answer" not in row


def test_solutions_may_be_a_list_or_one_string_row_by_row(tmp_path):
    rows = [
        {"query_id": "a", "prompt": "p", "solutions": "#### 1"},
        {"query_id": "b", "prompt": "p", "solutions": ["#### 2", "#### 2.0"]},
    ]
    got = load_prompts(_jsonl(tmp_path / "d.jsonl", rows))
    assert [r.solutions for r in got] == [("#### 1",), ("#### 2", "#### 2.0")]
    assert got[0].as_dict()["solutions"] == ["#### 1"]


def test_chat_messages_come_through_a_parquet_file(tmp_path):
    rows = [
        {"query_id": "a", "messages": [{"role": "user", "content": "1+1?"}], "prompt": None, "solutions": ["#### 2"]},
        {"query_id": "b", "messages": None, "prompt": "Q: 2+2?\nA:", "solutions": ["#### 4"]},
    ]
    got = load_prompts(_parquet(tmp_path / "chat.parquet", rows))
    assert got[0].as_dict()["messages"] == rows[0]["messages"] and "prompt" not in got[0].fields  # null: absent
    assert got[1].prompt == "Q: 2+2?\nA:" and "messages" not in got[1].fields


# (what row 5 of the user's table holds instead, what the message says about it)
BAD = [
    ({"answer": []}, "column 'answer' (dataset.columns.solutions) is empty"),
    ({"answer": ["#### 1", None]}, "column 'answer' (dataset.columns.solutions) item 1 must be str, got NoneType"),
    ({"question": None}, "a row needs a prompt text (column 'question' (dataset.columns.prompt)) or chat messages"),
    ({"question": None}, "set dataset.columns.prompt=<column> or dataset.columns.messages=<column>"),
    ({"answer": None}, "missing column 'answer' (dataset.columns.solutions): set dataset.columns.solutions=<column>"),
    ({"answer_number": None}, "missing column 'answer_number'"),
    (
        {"kind": None, "question": None, "messages": [{"role": "user", "content": None}]},
        "column 'messages' item 0 must be an object with string 'role' and 'content'",
    ),
]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved", "saved_dict"])
@pytest.mark.parametrize("bad, what", BAD, ids=[w.split(" (")[0] for _, w in BAD])
def test_a_bad_row_is_reported_with_its_file_row_and_column(tmp_path, fmt, bad, what):
    rows = [{**r, "answer": [r["answer"]], "messages": None} for r in user_rows(TRAIN, N)]
    rows[5].update(bad)
    if fmt == "jsonl":  # a JSONL user leaves an absent field out; a table holds a null there
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
        what = what.replace("column '", "field '").replace("<column>", "<field>")  # what a JSON object has
    if fmt == "saved_dict":
        path, split, where = _saved_dict(tmp_path / "dd", rows, bad_split_rows=rows), "test", " split 'test' row 5: "
    else:
        path, split, where = _write(tmp_path, fmt, rows), "train", ":6: " if fmt == "jsonl" else " row 5: "
    with pytest.raises(DatasetFormatError) as e:
        load_prompts(path, required=("solutions", "answer_number"), columns=USER_COLUMNS, split=split)
    assert str(e.value).startswith(path + where) and what in str(e.value), str(e.value)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_duplicate_id_names_both_rows(tmp_path, fmt):
    rows = [r.fields for r in load_jsonl_prompts(TRAIN)[:N]]
    rows[7] = {**rows[7], "query_id": rows[2]["query_id"]}
    path = _write(tmp_path, fmt, rows)
    first, at = ("line 3", ":8: ") if fmt == "jsonl" else ("row 2", " row 7: ")
    with pytest.raises(
        DatasetFormatError, match=f"duplicate query_id '{rows[2]['query_id']}' \\(first on {first}\\)"
    ) as e:
        load_prompts(path)
    assert str(e.value).startswith(path + at)


def test_a_column_under_a_name_realhf_gives_another_is_refused(tmp_path):
    rows = [{**r, "prompt": "a second prompt"} for r in user_rows(TRAIN, 3)]
    path = _parquet(tmp_path / "clash.parquet", rows)
    with pytest.raises(
        DatasetFormatError, match=r"row 0: column 'prompt' clashes with dataset.columns.prompt='question'"
    ):
        load_prompts(path, columns=USER_COLUMNS)


@pytest.mark.parametrize(
    "name, content, what",
    [
        ("broken.parquet", b"not parquet", "not a readable parquet file"),
        ("plain_dir", None, "neither a directory written by datasets' save_to_disk .* nor a folder of data files"),
    ],
)
def test_what_is_no_table_is_refused_naming_the_path(tmp_path, name, content, what):
    path = tmp_path / name
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(DatasetFormatError, match=f"^{path}: {what}"):
        load_prompts(path)


def test_an_empty_table_is_an_error(tmp_path):
    path = _parquet(tmp_path / "empty.parquet", [])
    with pytest.raises(DatasetFormatError, match="the table has no rows"):
        load_prompts(path)


def _run_without_datasets(code: str) -> subprocess.CompletedProcess:
    # None in sys.modules makes `import datasets` (and pyarrow) raise ImportError, as if not installed.
    prelude = "import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.system
def test_jsonl_needs_no_datasets_and_a_table_without_it_names_the_extra(tmp_path):
    path = _parquet(tmp_path / "d.parquet", [r.fields for r in load_jsonl_prompts(TRAIN)[:3]])
    code = (
        f"from realhf.impl.dataset.prompt_dataset import load_prompts\n"
        f"assert len(load_prompts({TRAIN!r})) == 10000\n"
        f"load_prompts({path!r})\n"
    )
    proc = _run_without_datasets(code)
    assert proc.returncode == 1 and "ImportError: reading " + path in proc.stderr, proc.stderr[-2000:]
    assert "pip install 'realhf[datasets]'" in proc.stderr


def test_an_extra_column_reaches_the_users_environment_and_reward_function(tmp_path):
    path = _parquet(tmp_path / "mine.parquet", user_rows(TRAIN, N))
    envs = EnvFactory(EnvConfig(type="helpers.user_data:AnswerColumnEnv"))
    rows = load_prompts(path, required=envs.required_fields, columns=USER_COLUMNS)
    row = rows[4].as_dict()  # what the rollout worker hands the agent and the environment
    want = row["answer_number"]

    async def grade(answer):
        env = await envs.make(row)
        return (await env.step(answer))[1]

    assert asyncio.run(grade(f" ...\n#### {want}")) == 1.0 and asyncio.run(grade(f"#### {want + 1}")) == 0.0
    reward_fn = load_reward_fn("helpers.user_data:answer_column_reward")
    assert asyncio.run(call_reward_fn(reward_fn, row, f"#### {want}")) is True
    # An environment's required column missing from the data fails at load, naming it.
    with pytest.raises(DatasetFormatError, match=r"row 0: missing column 'answer_number'"):
        load_prompts(
            _parquet(
                tmp_path / "no_extra.parquet",
                [{k: v for k, v in r.items() if k != "answer_number"} for r in user_rows(TRAIN, 3)],
            ),
            required=envs.required_fields,
            columns=USER_COLUMNS,
        )
