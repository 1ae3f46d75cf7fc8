"""Prompt datasets: strict loading (JSONL here; parquet, HF `datasets` directories, folders of
data files and hub dataset names through `table_formats`), user column names, sharding across rollout workers, and a seeded, restartable
epoch sampler.

A row has an id, a `prompt` text or chat `messages` ([{"role": ..., "content": ...}, ...]), and
any other fields, which travel with the row to the agent and its environment, e.g. (one JSONL line)
    {"query_id": "train-000001", "prompt": "Q: ...\\nA:", "solutions": [" 5-2=3\\n#### 3"], "task": "math"}
`dataset.columns` names the columns that hold these facts when the data calls them otherwise; the
row then reaches the agent under the names above. Without an id column, ids are
`<file name>-<line or row>`, the same in every run over the same file.

Loading is all-or-nothing: the first malformed row raises `DatasetFormatError` naming the file,
the row (JSONL: `path:line`; a table: `path row <index>`, 0-based) and the column, because a run
that silently skips rows trains on a different dataset than the one the user named.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from realhf.api.prompt import PromptRow
from realhf.impl.dataset import table_formats
from realhf.impl.dataset.table_formats import DatasetFormatError

# The facts realhf reads from a row, by the name a row carries them under inside realhf.
FIELDS = ("query_id", "prompt", "messages", "solutions", "task")


class _Columns:
    """The data's name for each of FIELDS (`dataset.columns`), renaming rows to FIELDS and naming
    columns in errors the way the user spells them."""

    def __init__(self, columns: Any, noun: str):
        self.source = {f: (getattr(columns, f) if columns is not None else f) for f in FIELDS}
        self.noun = noun  # "field" for JSON objects, "column" for tables
        self.renamable = columns is not None  # the caller reads dataset.columns (SFT's data has fixed names)
        self._field_of = {src: f for f, src in self.source.items() if src}
        self._identity = all(self.source[f] == f for f in FIELDS)

    def name(self, field: str) -> str:
        src = self.source.get(field, field)
        return f"{self.noun} {src!r}" + ("" if src == field else f" (dataset.columns.{field})")

    def missing(self, field: str, row: Dict[str, Any]) -> str:
        """Why a row lacks `field`, with the override that names the column holding it."""
        if not self.renamable:
            return f"missing {self.name(field)}; {self.listed(row)}"
        if field not in self.source:  # a field an environment requires: it has no dataset.columns key
            return f"missing {self.noun} {field!r}, which rollout.env.type requires in every row; {self.listed(row)}"
        fix = f"set dataset.columns.{field}=<{self.noun}> to the {self.noun} that holds it"
        if field == "query_id":
            fix += " (or dataset.columns.query_id='' to make ids from the file name and row)"
        return f"missing {self.name(field)}: {fix}; {self.listed(row)}"

    def listed(self, row: Dict[str, Any]) -> str:
        names = list(row)
        return f"the row's {self.noun}s: {', '.join(map(repr, names[:12]))}{', ...' if len(names) > 12 else ''}"

    def rename(self, obj: Dict[str, Any], where: str) -> Dict[str, Any]:
        if self._identity:
            return obj
        row = {}
        for key, value in obj.items():
            field = self._field_of.get(key)
            if field is None and key in self.source:
                # The data has a column under a name realhf gives to another one: one would be lost.
                if not self.source[key]:
                    raise DatasetFormatError(
                        f"{where}: the data has a {self.noun} {key!r}, but dataset.columns.{key} "
                        f"is empty (ids made from the file name and row); set it to {key!r}"
                    )
                raise DatasetFormatError(
                    f"{where}: {self.noun} {key!r} clashes with dataset.columns.{key}="
                    f"{self.source[key]!r}, whose values go by that name; rename one of them"
                )
            row[field or key] = value
        return row


def _check_messages(messages: Any, where: str, cols: _Columns) -> None:
    if not isinstance(messages, list) or not messages:
        raise DatasetFormatError(f"{where}: {cols.name('messages')} must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetFormatError(
                f"{where}: {cols.name('messages')} item {i} must be an object with string 'role' and 'content'"
            )


def _solutions(obj: Dict[str, Any], where: str, cols: _Columns) -> Tuple[str, ...]:
    solutions = obj.get("solutions", [])
    if isinstance(solutions, str):  # one reference answer, as a table column often holds it
        solutions = [solutions] if solutions else []
    if not isinstance(solutions, list):
        raise DatasetFormatError(
            f"{where}: {cols.name('solutions')} must be a list of str or a str, got {type(solutions).__name__}"
        )
    if "solutions" in obj and not solutions:
        raise DatasetFormatError(f"{where}: {cols.name('solutions')} is empty; a row needs a reference answer")
    for i, s in enumerate(solutions):
        if not isinstance(s, str):
            raise DatasetFormatError(f"{where}: {cols.name('solutions')} item {i} must be str, got {type(s).__name__}")
    obj["solutions"] = solutions
    return tuple(solutions)


def _parse_row(raw: Any, where: str, cols: _Columns, required: Sequence[str], made_id: Optional[str]) -> PromptRow:
    if not isinstance(raw, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    obj = cols.rename(raw, where)
    if made_id is not None:
        obj = {**obj, "query_id": made_id}
    for name in ("query_id", *required):
        if name not in obj:
            raise DatasetFormatError(f"{where}: {cols.missing(name, raw)}")
    qid = obj["query_id"]
    if not isinstance(qid, str) or not qid:
        raise DatasetFormatError(f"{where}: {cols.name('query_id')} must be a non-empty string")
    if "prompt" not in obj and "messages" not in obj:
        raise DatasetFormatError(
            f"{where}: a row needs a prompt text ({cols.name('prompt')}) or chat messages ({cols.name('messages')})"
            + (
                f": set dataset.columns.prompt=<{cols.noun}> or dataset.columns.messages=<{cols.noun}> to the "
                f"{cols.noun} that holds it"
                if cols.renamable
                else ""
            )
            + f"; {cols.listed(raw)}"
        )
    for name in ("prompt", "task"):
        if name in obj and not isinstance(obj[name], str):
            raise DatasetFormatError(f"{where}: {cols.name(name)} must be str, got {type(obj[name]).__name__}")
    if "messages" in obj:
        _check_messages(obj["messages"], where, cols)
    solutions = _solutions(obj, where, cols) if "solutions" in obj else ()
    return PromptRow(
        query_id=qid,
        prompt=obj.get("prompt", ""),
        solutions=solutions,
        task=obj.get("task", ""),
        fields=obj,
        source=where,
    )


def parse_row(raw: Any, required: Sequence[str] = (), where: str = "row") -> PromptRow:
    """One row given in code (not read from a file), checked as a dataset row is; `required`:
    the fields the environment needs."""
    return _parse_row(raw, where, _Columns(None, "field"), required, None)


def _collect(
    items: Iterable[Tuple[Any, str, str, int]], cols: _Columns, required: Sequence[str], id_prefix: str
) -> List[PromptRow]:
    """Rows of (raw row, where, position for a duplicate's message, number in a made id)."""
    rows: List[PromptRow] = []
    seen: Dict[str, str] = {}
    make_ids = not cols.source["query_id"]
    for raw, where, position, number in items:
        row = _parse_row(raw, where, cols, required, f"{id_prefix}-{number}" if make_ids else None)
        if row.query_id in seen:
            raise DatasetFormatError(f"{where}: duplicate query_id {row.query_id!r} (first on {seen[row.query_id]})")
        seen[row.query_id] = position
        rows.append(row)
    return rows


def _jsonl_items(path: Union[str, Path]):
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetFormatError(f"{where}: not UTF-8 (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            yield obj, where, f"line {lineno}", lineno


def load_jsonl_prompts(
    path: Union[str, Path], required: Sequence[str] = ("solutions",), columns: Any = None
) -> List[PromptRow]:
    """All rows of a JSONL prompt file, in file order. Blank lines are allowed and skipped.
    `required`: fields every row must have besides its id and prompt/messages (the math tasks
    need `solutions`; an environment names its own in `Environment.required_fields`).
    `columns`: a `DatasetColumnsConfig` (None: the names in FIELDS)."""
    rows = _collect(_jsonl_items(path), _Columns(columns, "field"), required, Path(path).name)
    if not rows:
        raise DatasetFormatError(f"{path}:1: the file has no rows")
    return rows


def load_prompts(
    path: Union[str, Path],
    required: Sequence[str] = ("solutions",),
    columns: Any = None,
    split: str = "train",
    config_name: str = "",
) -> List[PromptRow]:
    """All rows of a JSONL file, a `.parquet` file, a `datasets` directory, a folder of data files
    or a hub dataset (`split` picks one of their splits; `config_name`: a hub dataset's
    configuration), in stored order; see `load_jsonl_prompts` for `required` and `columns`.
    Raises ImportError naming the extra when a table format needs `datasets` and it is missing."""
    if not table_formats.is_table_path(path):
        return load_jsonl_prompts(path, required, columns)
    table, label = table_formats.open_table(path, split, config_name)
    prefix = Path(path).name + (f"-{split}" if label != str(path) else "")
    items = ((row, f"{label} row {i}", f"row {i}", i) for i, row in table_formats.table_rows(table, label))
    rows = _collect(items, _Columns(columns, "column"), required, prefix)
    if not rows:
        raise DatasetFormatError(f"{label}: the table has no rows")
    return rows


def count_prompts(path: Union[str, Path], split: str = "train", config_name: str = "") -> int:
    """How many rows `load_prompts` would return, without checking them (for the step plan)."""
    if table_formats.is_table_path(path):
        return table_formats.table_len(*table_formats.open_table(path, split, config_name))
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def shard(rows: Sequence[PromptRow], index: int, count: int) -> List[PromptRow]:
    """Shard `index` of `count`: strided, so shard sizes differ by at most one; the shards are
    disjoint and together hold every row, in a deterministic order."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for {count} shards")
    return list(rows[index::count])


def _fingerprint(rows: Sequence[PromptRow]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(r.query_id.encode() + b"\0")
    return h.hexdigest()[:16]


class PromptSampler:
    """Endless iteration over `rows`, reshuffled every epoch with a seed-derived order.

    The position is (epoch, index within the epoch's order); `state_dict()` captures it and
    `load_state_dict()` resumes exactly there, e.g. after a crash. The order of an epoch depends
    only on (seed, epoch), so a resumed sampler yields the same rows a never-stopped one would.
    """

    def __init__(self, rows: Sequence[PromptRow], seed: int, shuffle: bool = True):
        if not rows:
            raise ValueError("PromptSampler needs at least one row")
        self._rows = list(rows)
        # Once: the rollout worker records the sampler's state with every episode it starts.
        self._fingerprint = _fingerprint(self._rows)
        self._seed = seed
        self._shuffle = shuffle
        self.epoch = 0
        self._pos = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> List[int]:
        order = list(range(len(self._rows)))
        if self._shuffle:
            # An integer seed: str/tuple seeds would hash differently across Python versions.
            random.Random(self._seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> PromptRow:
        if self._pos == len(self._order):
            self.epoch += 1
            self._pos = 0
            self._order = self._epoch_order(self.epoch)
        row = self._rows[self._order[self._pos]]
        self._pos += 1
        return row

    def next_batch(self, n: int) -> List[PromptRow]:
        """`n` rows; a batch may straddle two epochs."""
        return [self.next() for _ in range(n)]

    def __iter__(self) -> "PromptSampler":
        return self

    def __next__(self) -> PromptRow:
        return self.next()

    def state_dict(self) -> Dict[str, Any]:
        return {
            "seed": self._seed,
            "shuffle": self._shuffle,
            "epoch": self.epoch,
            "position": self._pos,
            "n_rows": len(self._rows),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # Resuming over another dataset or seed would silently replay a different order.
        mine = self.state_dict()
        for key in ("seed", "shuffle", "n_rows", "fingerprint"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"sampler state does not match this sampler: {key} is {state.get(key)!r} in the "
                    f"state but {mine[key]!r} here (different dataset or seed?)"
                )
        epoch, pos = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= pos <= len(self._rows):
            raise ValueError(f"sampler state has an invalid position: epoch {epoch}, position {pos}")
        self.epoch, self._pos = epoch, pos
        self._order = self._epoch_order(epoch)
