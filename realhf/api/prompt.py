"""A prompt: the dataset row (a JSONL line or a table row) as the rest of the system sees it.

`PromptRow` is what a dataset file holds (realhf.impl.dataset.prompt_dataset parses and checks
it): the fields every part of realhf relies on, and `fields`, the whole row as written (the
columns `dataset.columns` names renamed to the names below), which is what an agent and its
environment receive. A row has a `query_id` and either a `prompt` text or
chat `messages`; `solutions` and `task` are there when the task has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Tuple


@dataclass(frozen=True)
class PromptRow:
    query_id: str
    prompt: str = ""
    solutions: Tuple[str, ...] = ()  # reference completions; math ones end in "#### <answer>"
    task: str = ""
    fields: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # the whole row
    source: str = field(default="", compare=False)  # "path:line" (JSONL) or "path row <index>" it came from

    def as_dict(self) -> Dict[str, Any]:
        """Every field of the row (what an agent gets); the typed ones as parsed."""
        row = dict(self.fields)
        row.update(query_id=self.query_id, solutions=list(self.solutions), task=self.task)
        if self.prompt or "messages" not in row:
            row["prompt"] = self.prompt
        return row
