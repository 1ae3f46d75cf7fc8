"""Repeated-addition word problems: the embedded long-reasoning task, whose answers vary in length
the way chain-of-thought does.

A problem buys `count` packs of `size` items; the answer adds them up one line per pack, each
line the packs still to add and the running total, then gives the total:

    prompt:     "Q: Max buys 4 bags of 7 apples. How many apples does he have?\\nA:"
    completion: " 3: 0+7=7\\n2: 7+7=14\\n1: 14+7=21\\n0: 21+7=28\\n#### 28"

Every line depends only on the one before it (one pack fewer, the total so far plus `size`), and
the answer ends after the line that leaves 0, so a 2-layer model can learn it (counting up to
`count` instead left it unable to tell when to stop past ten packs), while the answer's length
grows with `count`: about 8 tokens for one pack, 10 to 14 per pack beyond. `count` is drawn log-uniformly, so most
problems are short and a few are long: the long tail that makes a synchronous trainer wait for
its longest answer and pay for it in every padded row. Each line is checked by the math
environment's `check_work` (`k*size=total` must hold), so one slip anywhere costs the reward, and
long answers are harder, as long derivations are.

Splits: `train` and `test` draw `count` from 1..`max_count`; `longer` draws it from
`max_count`+1..`longer_max_count`, problems longer than any in training. Generation is a pure
function of (`LongMathConfig`, seed, split sizes).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from realhf.plugins.tasks.math_synthetic import ANSWER_MARK, NAMES, PROMPT_FORMAT

ITEMS: Tuple[str, ...] = (
    "apples", "shells", "coins", "books", "marbles", "stickers",
    "cards", "pens", "stamps", "cookies", "rocks", "toys",
)  # fmt: skip
STORY_TEMPLATES: Tuple[str, ...] = (
    "{name} buys {count} bags of {size} {item}.",
    "{name} has {count} boxes with {size} {item} in each.",
    "{name} gets {count} packs of {size} {item}.",
)
QUESTION_TEMPLATES: Tuple[str, ...] = (
    "How many {item} does {pronoun} have?",
    "How many {item} is that?",
)
_MAX_CONSECUTIVE_REPEATS = 10_000


@dataclass(frozen=True)
class LongMathConfig:
    max_count: int = 40  # packs per problem in train and test: 1..max_count, log-uniform
    longer_max_count: int = 52  # the `longer` split: max_count+1..longer_max_count, uniform
    min_size: int = 2  # items per pack
    max_size: int = 9

    def check(self) -> None:
        if self.max_count < 2:
            raise ValueError(f"max_count must be >= 2, got {self.max_count}")
        if self.longer_max_count <= self.max_count:
            raise ValueError(f"longer_max_count ({self.longer_max_count}) must exceed max_count ({self.max_count})")
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {self.min_size}, {self.max_size}")


@dataclass(frozen=True)
class LongMathProblem:
    prompt: str
    completion: str  # the reference solution, ending in "#### <answer>"
    answer: int
    count: int  # lines of work in the reference solution
    size: int


def vocabulary() -> List[str]:
    """Every word (run of letters) any prompt or completion can contain, sorted."""
    texts: List[str] = [PROMPT_FORMAT, *STORY_TEMPLATES, *QUESTION_TEMPLATES, *ITEMS]
    texts += [name for name, _ in NAMES] + [p for _, p in NAMES] + [p.capitalize() for _, p in NAMES]
    words = set()
    for text in texts:
        words.update(re.findall(r"[A-Za-z]+", re.sub(r"\{[a-z]+\}", " ", text)))
    return sorted(words)


def solution(count: int, size: int) -> str:
    lines = [f"{count - k}: {(k - 1) * size}+{size}={k * size}" for k in range(1, count + 1)]
    return " " + "\n".join(lines) + f"\n{ANSWER_MARK} {count * size}"


def log_uniform_count(rng: random.Random, high: int) -> int:
    """1..high with P(count >= c) falling as log: as many problems of 1-2 packs as of 32-64."""
    return min(high, int(math.exp(rng.uniform(0.0, math.log(high + 1)))))


def generate_problem(rng: random.Random, count: int, cfg: LongMathConfig) -> LongMathProblem:
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    size = rng.randint(cfg.min_size, cfg.max_size)
    story = rng.choice(STORY_TEMPLATES).format(name=name, count=count, size=size, item=item)
    question = rng.choice(QUESTION_TEMPLATES).format(item=item, pronoun=pronoun)
    return LongMathProblem(
        prompt=PROMPT_FORMAT.format(story=f"{story} {question}"),
        completion=solution(count, size),
        answer=count * size,
        count=count,
        size=size,
    )


def _draw(rng: random.Random, n: int, pick_count, cfg: LongMathConfig, seen: set) -> List[LongMathProblem]:
    out: List[LongMathProblem] = []
    misses = 0
    while len(out) < n:
        p = generate_problem(rng, pick_count(rng), cfg)
        if p.prompt in seen:
            misses += 1
            if misses > _MAX_CONSECUTIVE_REPEATS:
                raise ValueError(f"could only draw {len(out)} distinct problems of {n} with {cfg}")
            continue
        misses = 0
        seen.add(p.prompt)
        out.append(p)
    return out


def generate_splits(
    n_train: int, n_test: int, n_longer: int, seed: int, cfg: LongMathConfig = LongMathConfig()
) -> Dict[str, List[LongMathProblem]]:
    """Distinct `train`, `test` and `longer` problems (no prompt twice); the held-out splits are
    drawn first so their content does not depend on `n_train`."""
    cfg.check()
    rng = random.Random(seed)
    seen: set = set()
    in_dist = lambda r: log_uniform_count(r, cfg.max_count)  # noqa: E731
    longer = lambda r: r.randint(cfg.max_count + 1, cfg.longer_max_count)  # noqa: E731
    test = _draw(rng, n_test, in_dist, cfg, seen)
    longer_split = _draw(rng, n_longer, longer, cfg, seen)
    train = _draw(rng, n_train, in_dist, cfg, seen)
    return {"train": train, "test": test, "longer": longer_split}


def to_rows(problems: Sequence[LongMathProblem], split: str) -> List[Dict[str, object]]:
    """Rows in the prompt-dataset JSONL schema; `count` lets reports group accuracy by length."""
    return [
        {
            "query_id": f"{split}-{i:06d}",
            "prompt": p.prompt,
            "solutions": [p.completion],
            "task": "math",
            "count": p.count,
        }
        for i, p in enumerate(problems)
    ]
