"""Prompt datasets: strict JSONL loading, sharding across rollout workers, and a seeded,
restartable epoch sampler.

One row per line, a JSON object with a `query_id` and a `prompt` text or chat `messages`
([{"role": ..., "content": ...}, ...]); any other fields travel with the row to the agent and
its environment, e.g.
    {"query_id": "train-000001", "prompt": "Q: ...\\nA:", "solutions": [" 5-2=3\\n#### 3"], "task": "math"}

Loading is all-or-nothing: the first malformed row raises `DatasetFormatError` naming the file
and line, because a run that silently skips rows trains on a different dataset than the one
the user named.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

from realhf.api.prompt import PromptRow

class DatasetFormatError(ValueError):
    """A dataset file that does not follow the JSONL prompt schema; the message is `path:line: what`."""


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DatasetFormatError(f"{where}: field 'messages' must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetFormatError(f"{where}: messages[{i}] must be an object with string 'role' and 'content'")


def _parse_row(obj: Any, where: str, seen: Dict[str, int], required: Sequence[str]) -> PromptRow:
    if not isinstance(obj, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in ("query_id", *required):
        if name not in obj:
            raise DatasetFormatError(f"{where}: missing field {name!r}")
    qid = obj["query_id"]
    if not isinstance(qid, str) or not qid:
        raise DatasetFormatError(f"{where}: field 'query_id' must be a non-empty string")
    if "prompt" not in obj and "messages" not in obj:
        raise DatasetFormatError(f"{where}: a row needs a 'prompt' text or chat 'messages'")
    if "prompt" in obj and not isinstance(obj["prompt"], str):
        raise DatasetFormatError(f"{where}: field 'prompt' must be str, got {type(obj['prompt']).__name__}")
    if "messages" in obj:
        _check_messages(obj["messages"], where)
    if "task" in obj and not isinstance(obj["task"], str):
        raise DatasetFormatError(f"{where}: field 'task' must be str, got {type(obj['task']).__name__}")
    solutions = obj.get("solutions", [])
    if not isinstance(solutions, list):
        raise DatasetFormatError(f"{where}: field 'solutions' must be list, got {type(solutions).__name__}")
    if "solutions" in obj and not solutions:
        raise DatasetFormatError(f"{where}: field 'solutions' is empty; a row needs a reference answer")
    for i, s in enumerate(solutions):
        if not isinstance(s, str):
            raise DatasetFormatError(f"{where}: solutions[{i}] must be str, got {type(s).__name__}")
    if qid in seen:
        raise DatasetFormatError(f"{where}: duplicate query_id {qid!r} (first on line {seen[qid]})")
    return PromptRow(query_id=qid, prompt=obj.get("prompt", ""), solutions=tuple(solutions),
                     task=obj.get("task", ""), fields=obj, source=where)


def load_jsonl_prompts(path: Union[str, Path], required: Sequence[str] = ("solutions",)) -> List[PromptRow]:
    """All rows of a JSONL prompt file, in file order. Blank lines are allowed and skipped.
    `required`: fields every row must have besides query_id and prompt/messages (the math tasks
    need `solutions`; an environment names its own in `Environment.required_fields`)."""
    rows: List[PromptRow] = []
    seen: Dict[str, int] = {}
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
            row = _parse_row(obj, where, seen, required)
            seen[row.query_id] = lineno
            rows.append(row)
    if not rows:
        raise DatasetFormatError(f"{path}:1: the file has no rows")
    return rows


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
