"""A user's own data, as a user would bring it: the tiny-math prompts as a table with its own
column names (`question`, `answer` holding one string, `kind`), no id column, and an extra
column `answer_number` that only the user's environment and reward function read."""

import json
import re

from realhf.api.cli_args import DatasetColumnsConfig
from realhf.api.env import Environment

# How the user tells realhf where its facts are (the command line: dataset.columns.prompt=question ...).
USER_COLUMNS = DatasetColumnsConfig(query_id="", prompt="question", solutions="answer", task="kind")
USER_OVERRIDES = [
    "dataset.columns.query_id=",
    "dataset.columns.prompt=question",
    "dataset.columns.solutions=answer",
    "dataset.columns.task=kind",
]


def final_number(text: str):
    found = re.search(r"####\s*(-?\d+)", text)
    return found.group(1) if found else None


def user_rows(jsonl_path: str, n: int = 0) -> list:
    """The first n (0: all) rows of a tiny-math JSONL file, renamed the user's way."""
    rows = []
    with open(jsonl_path) as f:
        for line in f:
            row = json.loads(line)
            rows.append(
                {
                    "question": row["prompt"],
                    "answer": row["solutions"][0],
                    "kind": row["task"],
                    "answer_number": int(final_number(row["solutions"][0])),
                }
            )
            if len(rows) == n:
                break
    return rows


class AnswerColumnEnv(Environment):
    """Reward 1 when the answer's `#### N` equals the row's `answer_number` column."""

    required_fields = ("answer_number",)  # an extra column: checked in every row before the run starts

    async def step(self, action):
        right = final_number(action) == str(self.row["answer_number"])
        return None, float(right), True, {}


def answer_column_reward(prompt: str, completion: str, answer_number: int, **row) -> bool:
    """A reward function reading the same extra column."""
    return final_number(completion) == str(answer_number)
