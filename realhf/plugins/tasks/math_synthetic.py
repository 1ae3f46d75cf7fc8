"""Synthetic arithmetic word problems: the tiny task that lets RL be measured on 2 CPU cores.

A problem is a short story about one person's items, changed by 1..`steps` additions or
subtractions, and a question about the final count:

    prompt:     "Q: Max has 5 shells. He loses 2. How many shells does he have now?\\nA:"
    completion: " 5-2=3\\n#### 3"

With several operations the completion works one line per operation
(" 5-2=3\\n3+4=7\\n#### 7") so the model never has to hold an unwritten intermediate result.
The count never goes below zero. Stories are built from a closed word list (`vocabulary()`), so a
word-level tokenizer covers every prompt with no unknown token.

Generation is a pure function of (`GeneratorConfig`, seed, split sizes): the same call always
yields the same rows, on any machine and Python hash seed.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# (name, subject pronoun). The pronoun agrees with the name so stories read naturally.
NAMES: Tuple[Tuple[str, str], ...] = (
    ("Max", "he"), ("Tom", "he"), ("Ben", "he"), ("Sam", "he"), ("Leo", "he"), ("Jack", "he"),
    ("Ann", "she"), ("Sue", "she"), ("Eva", "she"), ("Mia", "she"), ("Lily", "she"), ("Zoe", "she"),
)  # fmt: skip
# Plural nouns only: the count may be 1 ("1 shells"); a second form per item would double the
# item vocabulary for no gain in what the model has to learn.
ITEMS: Tuple[str, ...] = (
    "shells", "apples", "coins", "books", "marbles", "stickers",
    "cards", "pens", "stamps", "cookies", "rocks", "toys",
)  # fmt: skip
START_TEMPLATES: Tuple[str, ...] = ("{name} has {n} {item}.", "{name} starts with {n} {item}.")
ADD_TEMPLATES: Tuple[str, ...] = ("{who} finds {n} more.", "{who} buys {n} more.", "{who} gets {n} more.")
SUB_TEMPLATES: Tuple[str, ...] = ("{who} loses {n}.", "{who} gives away {n}.", "{who} sells {n}.")
QUESTION_TEMPLATES: Tuple[str, ...] = (
    "How many {item} does {name} have now?",
    "How many {item} does {pronoun} have now?",
)
# Operations after the first start with this word, so a story reads as a sequence of events.
THEN = "Then"

PROMPT_FORMAT = "Q: {story}\nA:"
_MAX_CONSECUTIVE_REPEATS = 10_000
ANSWER_MARK = "####"


@dataclass(frozen=True)
class GeneratorConfig:
    """Difficulty knobs. The defaults are the measured easy setting (see NOTES, tiny task)."""

    digits: int = 1  # digits per operand: 1 -> 1..9, 2 -> 10..99
    max_operand: int = 0  # upper bound of an operand; 0: the largest `digits`-digit number
    steps: int = 2  # each problem draws 1..steps add/subtract operations

    def operand_range(self) -> Tuple[int, int]:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        low = 1 if self.digits == 1 else 10 ** (self.digits - 1)
        high = self.max_operand if self.max_operand > 0 else 10**self.digits - 1
        if high < low:
            raise ValueError(f"max_operand={self.max_operand} is below the smallest {self.digits}-digit operand {low}")
        return low, high


@dataclass(frozen=True)
class MathProblem:
    prompt: str
    completion: str  # the reference solution, ending in "#### <answer>"
    answer: int
    start: int
    ops: Tuple[Tuple[str, int], ...]  # ("+" | "-", operand) in story order


def vocabulary() -> List[str]:
    """Every word (maximal run of letters) any prompt or completion can contain, sorted.

    Derived from the template constants so a new template can never be missed by the tokenizer.
    """
    texts: List[str] = [PROMPT_FORMAT, THEN, *START_TEMPLATES, *ADD_TEMPLATES, *SUB_TEMPLATES]
    texts += QUESTION_TEMPLATES
    texts += [name for name, _ in NAMES] + list(ITEMS)
    for _, pronoun in NAMES:
        texts += [pronoun, pronoun.capitalize()]
    words = set()
    for text in texts:
        # Placeholders are not words of the output.
        words.update(re.findall(r"[A-Za-z]+", re.sub(r"\{[a-z]+\}", " ", text)))
    return sorted(words)


def _work_lines(start: int, ops: Sequence[Tuple[str, int]]) -> Tuple[List[str], int]:
    lines, value = [], start
    for op, n in ops:
        new = value + n if op == "+" else value - n
        lines.append(f"{value}{op}{n}={new}")
        value = new
    return lines, value


def generate_problem(rng: random.Random, cfg: GeneratorConfig = GeneratorConfig()) -> MathProblem:
    low, high = cfg.operand_range()
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    start = rng.randint(low, high)
    sentences = [rng.choice(START_TEMPLATES).format(name=name, n=start, item=item)]

    ops: List[Tuple[str, int]] = []
    value = start
    for i in range(rng.randint(1, cfg.steps)):
        # Subtract only when some operand keeps the count >= 0; otherwise the story must add.
        can_subtract = value >= low
        op = rng.choice("+-") if can_subtract else "+"
        n = rng.randint(low, high) if op == "+" else rng.randint(low, min(high, value))
        value = value + n if op == "+" else value - n
        ops.append((op, n))
        template = rng.choice(ADD_TEMPLATES if op == "+" else SUB_TEMPLATES)
        who = pronoun.capitalize() if i == 0 else f"{THEN} {pronoun}"
        sentences.append(template.format(who=who, n=n))

    sentences.append(rng.choice(QUESTION_TEMPLATES).format(item=item, name=name, pronoun=pronoun))
    lines, answer = _work_lines(start, ops)
    completion = " " + "\n".join(lines) + f"\n{ANSWER_MARK} {answer}"
    prompt = PROMPT_FORMAT.format(story=" ".join(sentences))
    return MathProblem(prompt=prompt, completion=completion, answer=answer, start=start, ops=tuple(ops))


def _draw_unique(rng: random.Random, cfg: GeneratorConfig, n: int, exclude: Iterable[str] = ()) -> List[MathProblem]:
    seen = set(exclude)
    out: List[MathProblem] = []
    # Stop when new prompts have become rare, so that a tiny problem space (max_operand=1,
    # steps=1) fails loudly instead of looping for ever.
    misses = 0
    while len(out) < n:
        p = generate_problem(rng, cfg)
        if p.prompt in seen:
            misses += 1
            if misses > _MAX_CONSECUTIVE_REPEATS:
                raise ValueError(
                    f"could only draw {len(out)} distinct problems of {n} with {cfg}: "
                    "the problem space is too small; raise max_operand, digits or steps"
                )
            continue
        misses = 0
        seen.add(p.prompt)
        out.append(p)
    return out


def generate_splits(
    n_train: int, n_test: int, seed: int, cfg: GeneratorConfig = GeneratorConfig()
) -> Tuple[List[MathProblem], List[MathProblem]]:
    """Distinct train and test problems; no prompt appears twice in either or in both.

    The test split is drawn first so its content does not depend on `n_train`.
    """
    rng = random.Random(seed)
    test = _draw_unique(rng, cfg, n_test)
    train = _draw_unique(rng, cfg, n_train, exclude=(p.prompt for p in test))
    return train, test


def story(problem: MathProblem) -> str:
    """The problem's text without the "Q: ... A:" frame of the completion-style prompt."""
    head, tail = PROMPT_FORMAT.split("{story}")
    return problem.prompt[len(head) : len(problem.prompt) - len(tail)]


def to_rows(
    problems: Sequence[MathProblem], split: str, chat_instruction: Optional[str] = None
) -> List[Dict[str, object]]:
    """Rows in the prompt-dataset JSONL schema (see `prompt_dataset.load_jsonl_prompts`): a
    completion-style `prompt`, or with `chat_instruction` one user message (the story, then the
    instruction) for an instruction-tuned model's chat template."""
    rows: List[Dict[str, object]] = []
    for i, p in enumerate(problems):
        row: Dict[str, object] = {"query_id": f"{split}-{i:06d}"}
        if chat_instruction is None:
            row["prompt"] = p.prompt
        else:
            row["messages"] = [{"role": "user", "content": f"{story(p)} {chat_instruction}".strip()}]
        row.update(solutions=[p.completion], task="math")
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[Dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)  # readers never see a half-written file
