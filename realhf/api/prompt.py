"""A prompt: the dataset row (one JSONL line) and the episode's view of it.

`PromptRow` is what a dataset file holds (realhf.impl.dataset.prompt_dataset parses and checks
it); `Prompt` is the same row as an agent sees it, with the rollout's qid and the row's token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class PromptRow:
    query_id: str
    prompt: str
    solutions: Tuple[str, ...]  # reference completions; math ones end in "#### <answer>"
    task: str


@dataclass(frozen=True)
class Prompt(PromptRow):
    qid: str = ""  # the rollout's id: unique among in-flight rollouts (query_id + epoch)
    prompt_ids: Tuple[int, ...] = ()

    @classmethod
    def of(cls, row: PromptRow, qid: str, prompt_ids) -> "Prompt":
        return cls(query_id=row.query_id, prompt=row.prompt, solutions=tuple(row.solutions), task=row.task,
                   qid=qid, prompt_ids=tuple(prompt_ids))
