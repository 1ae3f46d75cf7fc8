"""JSONL prompt loading (errors name file:line), sharding, and the restartable sampler."""

import json

import pytest

from realhf.api.cli_args import DatasetColumnsConfig
from realhf.api.prompt import PromptRow
from realhf.impl.dataset.prompt_dataset import (
    DatasetFormatError,
    PromptSampler,
    load_jsonl_prompts,
    shard,
)


def _row(i: int, **over) -> dict:
    row = {"query_id": f"q{i}", "prompt": f"Q: {i}?\nA:", "solutions": [f" {i}\n#### {i}"], "task": "math"}
    row.update(over)
    return row


def _write(tmp_path, lines) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_loads_rows_in_file_order(tmp_path):
    path = _write(tmp_path, [json.dumps(_row(i)) for i in range(3)] + [""])
    rows = load_jsonl_prompts(path)
    assert rows == [PromptRow(f"q{i}", f"Q: {i}?\nA:", (f" {i}\n#### {i}",), "math") for i in range(3)]
    assert rows[1].source == f"{path}:2"


def test_a_row_reaches_the_agent_whole_and_may_hold_chat_messages_instead_of_a_prompt(tmp_path):
    chat = {"query_id": "c", "messages": [{"role": "user", "content": "2+2?"}], "answer": 4, "meta": {"level": 1}}
    path = _write(tmp_path, [json.dumps(_row(0, hint="add")), json.dumps(chat)])
    rows = load_jsonl_prompts(path, required=())
    assert rows[0].as_dict()["hint"] == "add" and rows[0].as_dict()["solutions"] == [" 0\n#### 0"]
    whole = rows[1].as_dict()
    assert whole["messages"] == chat["messages"] and whole["answer"] == 4 and whole["meta"] == {"level": 1}
    assert "prompt" not in whole and rows[1].task == ""
    with pytest.raises(DatasetFormatError, match=f"{path}:2: missing field 'solutions'"):
        load_jsonl_prompts(path)  # the math tasks need solutions (Environment.required_fields)


# (bad third line, expected message fragment)
MALFORMED = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('"text"', "expected a JSON object, got str"),
    (
        json.dumps({k: v for k, v in _row(2).items() if k != "prompt"}),
        "a row needs a prompt text (field 'prompt') or chat messages (field 'messages')",
    ),
    (json.dumps({k: v for k, v in _row(2).items() if k != "query_id"}), "missing field 'query_id'"),
    (json.dumps(_row(2, prompt=3)), "field 'prompt' must be str, got int"),
    (json.dumps(_row(2, query_id=2)), "field 'query_id' must be a non-empty string"),
    (json.dumps(_row(2, query_id="")), "field 'query_id' must be a non-empty string"),
    (json.dumps(_row(2, messages=[])), "field 'messages' must be a non-empty list"),
    (
        json.dumps(_row(2, messages=[{"role": "user"}])),
        "field 'messages' item 0 must be an object with string 'role' and 'content'",
    ),
    (json.dumps(_row(2, solutions=2)), "field 'solutions' must be a list of str or a str, got int"),
    (json.dumps(_row(2, solutions=[])), "field 'solutions' is empty"),
    (json.dumps(_row(2, solutions=["#### 2", 2])), "field 'solutions' item 1 must be str, got int"),
    (json.dumps(_row(2, task=None)), "field 'task' must be str, got NoneType"),
    (json.dumps(_row(0)), "duplicate query_id 'q0' (first on line 1)"),
    (json.dumps({k: v for k, v in _row(2).items() if k != "solutions"}), "missing field 'solutions'"),
]


@pytest.mark.parametrize("bad_line, what", MALFORMED, ids=[w for _, w in MALFORMED])
def test_malformed_row_names_file_and_line(tmp_path, bad_line, what):
    path = _write(tmp_path, [json.dumps(_row(0)), json.dumps(_row(1)), bad_line, json.dumps(_row(3))])
    with pytest.raises(DatasetFormatError) as e:
        load_jsonl_prompts(path)
    assert str(e.value).startswith(f"{path}:3: ")
    assert what in str(e.value)


def test_every_missing_column_names_the_override_that_finds_it(tmp_path):
    """A column realhf reads is missing: the message says which `dataset.columns.<name>=` names the
    column that holds it, and lists the row's columns to choose from."""
    row = {"id": "q0", "question": "Q: 1?\nA:", "answer": ["#### 1"]}
    path = _write(tmp_path, [json.dumps(row)])
    with pytest.raises(DatasetFormatError) as e:
        load_jsonl_prompts(path, columns=DatasetColumnsConfig())
    assert str(e.value) == (
        f"{path}:1: missing field 'query_id': set dataset.columns.query_id=<field> to the field that holds it (or "
        "dataset.columns.query_id='' to make ids from the file name and row); the row's fields: 'id', 'question', "
        "'answer'"
    )
    columns = DatasetColumnsConfig(query_id="id", prompt="question")
    with pytest.raises(DatasetFormatError) as e:
        load_jsonl_prompts(path, required=("solutions",), columns=columns)
    assert "missing field 'solutions': set dataset.columns.solutions=<field> to the field that holds it" in str(e.value)
    with pytest.raises(DatasetFormatError) as e:
        load_jsonl_prompts(path, required=(), columns=DatasetColumnsConfig(query_id="id"))
    assert "set dataset.columns.prompt=<field> or dataset.columns.messages=<field>" in str(e.value)
    with pytest.raises(DatasetFormatError, match="missing field 'level', which rollout.env.type requires"):
        load_jsonl_prompts(path, required=("level",), columns=columns)
    # A caller without dataset.columns (training/main_sft.py's fixed format) has no override to offer.
    with pytest.raises(DatasetFormatError, match=r"missing field 'query_id'; the row's fields: 'id', 'question'"):
        load_jsonl_prompts(path)


def test_non_utf8_line_names_file_and_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps(_row(0)).encode() + b"\n\xff\xfe\n")
    with pytest.raises(DatasetFormatError, match=rf"^{path}:2: not UTF-8"):
        load_jsonl_prompts(path)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetFormatError, match=rf"^{path}:1: the file has no rows"):
        load_jsonl_prompts(path)


def _rows(n: int):
    return [PromptRow(f"q{i}", "p", ("s",), "math") for i in range(n)]


@pytest.mark.parametrize("n, count", [(10, 3), (7, 7), (3, 5), (100, 4), (1, 1)])
def test_shards_are_disjoint_covering_balanced_and_deterministic(n, count):
    rows = _rows(n)
    shards = [shard(rows, i, count) for i in range(count)]
    ids = [r.query_id for s in shards for r in s]
    assert sorted(ids) == sorted(r.query_id for r in rows) and len(ids) == len(set(ids))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert shards == [shard(rows, i, count) for i in range(count)]


@pytest.mark.parametrize("index, count", [(3, 3), (-1, 3), (0, 0)])
def test_shard_out_of_range_is_rejected(index, count):
    with pytest.raises(ValueError, match="out of range"):
        shard(_rows(5), index, count)


def test_sampler_visits_every_row_once_per_epoch_in_a_new_order():
    rows = _rows(50)
    s = PromptSampler(rows, seed=1)
    epoch0 = [s.next().query_id for _ in range(50)]
    assert s.epoch == 0
    epoch1 = [s.next().query_id for _ in range(50)]
    assert s.epoch == 1
    assert sorted(epoch0) == sorted(epoch1) == sorted(r.query_id for r in rows)
    assert epoch0 != epoch1 and epoch0 != [r.query_id for r in rows]
    assert [r.query_id for r in PromptSampler(rows, seed=1).next_batch(50)] == epoch0
    assert [r.query_id for r in PromptSampler(rows, seed=2).next_batch(50)] != epoch0


def test_sampler_without_shuffle_keeps_file_order():
    rows = _rows(5)
    assert PromptSampler(rows, seed=1, shuffle=False).next_batch(7) == rows + rows[:2]


@pytest.mark.parametrize("stop_at", [0, 1, 37, 50, 73, 149])
def test_sampler_resumes_exactly_where_its_state_was_taken(stop_at):
    rows = _rows(50)
    reference = [r.query_id for r in PromptSampler(rows, seed=3).next_batch(200)]
    first = PromptSampler(rows, seed=3)
    first.next_batch(stop_at)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON round trip
    resumed = PromptSampler(rows, seed=3)
    resumed.load_state_dict(state)
    assert [r.query_id for r in resumed.next_batch(200 - stop_at)] == reference[stop_at:]


def test_sampler_refuses_state_of_another_dataset_or_seed():
    state = PromptSampler(_rows(10), seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(_rows(10), seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="n_rows"):
        PromptSampler(_rows(11), seed=1).load_state_dict(state)
    other = [PromptRow(f"x{i}", "p", ("s",), "math") for i in range(10)]
    with pytest.raises(ValueError, match="fingerprint"):
        PromptSampler(other, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="invalid position"):
        PromptSampler(_rows(10), seed=1).load_state_dict({**state, "position": 11})
