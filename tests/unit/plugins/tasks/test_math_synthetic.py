"""The synthetic arithmetic generator: deterministic, correct, never negative, disjoint splits."""

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realhf.plugins.tasks.math_synthetic import (
    ADD_TEMPLATES,
    SUB_TEMPLATES,
    GeneratorConfig,
    generate_problem,
    generate_splits,
    to_rows,
    vocabulary,
)

_ADD_VERBS = {t.split()[1] for t in ADD_TEMPLATES}  # finds, buys, gets
_SUB_VERBS = {t.split()[1] for t in SUB_TEMPLATES}  # loses, gives, sells


def _story_ops(prompt: str):
    """Read the start count and the (sign, operand) events back from the prompt text."""
    sentences = re.findall(r"[^.?]+[.?]", prompt.split("Q: ", 1)[1])
    start = int(re.search(r"\d+", sentences[0]).group())
    ops = []
    for s in sentences[1:-1]:
        words = s.split()
        verb = words[2] if words[0] == "Then" else words[1]  # "[Then] <pronoun> <verb> ..."
        assert verb in _ADD_VERBS | _SUB_VERBS, s
        ops.append(("+" if verb in _ADD_VERBS else "-", int(re.search(r"\d+", s).group())))
    return start, ops


def _check_problem(p, cfg: GeneratorConfig) -> None:
    low, high = cfg.operand_range()
    assert p.prompt.startswith("Q: ") and p.prompt.endswith("\nA:")
    start, ops = _story_ops(p.prompt)
    assert (start, tuple(ops)) == (p.start, p.ops)
    assert 1 <= len(ops) <= cfg.steps
    assert all(low <= n <= high for n in [start] + [n for _, n in ops])

    # The completion is one "a<op>b=c" line per event, chained, then "#### answer".
    lines = p.completion.lstrip(" ").split("\n")
    assert p.completion.startswith(" ") and lines[-1] == f"#### {p.answer}"
    value = start
    for line, (op, n) in zip(lines[:-1], ops, strict=True):
        a, b, c = map(int, re.fullmatch(rf"(\d+)\{op}(\d+)=(\d+)", line).groups())
        assert (a, b) == (value, n)
        value = a + b if op == "+" else a - b
        assert c == value >= 0  # never below zero, at any step
    # The answer is the story's expression evaluated left to right.
    expression = str(start) + "".join(f"{op}{n}" for op, n in ops)
    assert p.answer == value == eval(expression)


def test_default_problems_are_correct_and_never_negative():
    rng = random.Random(0)
    cfg = GeneratorConfig()
    for _ in range(3000):
        _check_problem(generate_problem(rng, cfg), cfg)


def test_the_example_from_the_notes_has_this_exact_shape():
    rng = random.Random(0)
    p = next(p for p in (generate_problem(rng) for _ in range(10_000)) if p.ops == (("-", 2),) and p.start == 5)
    assert p.completion == " 5-2=3\n#### 3"
    assert re.fullmatch(
        r"Q: \w+ (has|starts with) 5 \w+\. (He|She) \w+( away)? 2\. How many \w+ does \w+ have now\?\nA:", p.prompt
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    digits=st.integers(1, 3),
    steps=st.integers(1, 4),
    cap=st.integers(0, 50),
)
def test_knobs_bound_operands_and_steps(seed, digits, steps, cap):
    low = 1 if digits == 1 else 10 ** (digits - 1)
    cfg = GeneratorConfig(digits=digits, max_operand=cap if cap >= low else 0, steps=steps)
    rng = random.Random(seed)
    for _ in range(30):
        _check_problem(generate_problem(rng, cfg), cfg)


def test_two_digit_knob_uses_two_digit_operands():
    cfg = GeneratorConfig(digits=2)
    assert cfg.operand_range() == (10, 99)
    rng = random.Random(1)
    operands = [n for p in (generate_problem(rng, cfg) for _ in range(200)) for n in [p.start] + [n for _, n in p.ops]]
    assert min(operands) >= 10 and max(operands) <= 99 and max(operands) > 50


def test_bad_knobs_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="max_operand=5 is below"):
        GeneratorConfig(digits=2, max_operand=5).operand_range()
    with pytest.raises(ValueError, match="steps"):
        GeneratorConfig(steps=0).operand_range()
    with pytest.raises(ValueError, match="too small"):
        generate_splits(5000, 10, seed=0, cfg=GeneratorConfig(max_operand=1, steps=1))


def test_generation_is_deterministic_given_the_seed():
    a = generate_splits(300, 50, seed=7)
    b = generate_splits(300, 50, seed=7)
    c = generate_splits(300, 50, seed=8)
    assert a == b
    assert a != c


def test_test_split_does_not_depend_on_train_size():
    assert generate_splits(10, 40, seed=3)[1] == generate_splits(500, 40, seed=3)[1]


def test_splits_are_disjoint_and_free_of_duplicates():
    train, test = generate_splits(3000, 300, seed=1)
    train_prompts = {p.prompt for p in train}
    test_prompts = {p.prompt for p in test}
    assert len(train_prompts) == 3000 and len(test_prompts) == 300
    assert not train_prompts & test_prompts


def test_rows_follow_the_prompt_schema():
    train, _ = generate_splits(5, 1, seed=1)
    rows = to_rows(train, "train")
    assert [r["query_id"] for r in rows] == [f"train-{i:06d}" for i in range(5)]
    for r, p in zip(rows, train):
        assert r == {"query_id": r["query_id"], "prompt": p.prompt, "solutions": [p.completion], "task": "math"}


def test_vocabulary_covers_every_word_of_every_text():
    vocab = set(vocabulary())
    rng = random.Random(5)
    for _ in range(3000):
        p = generate_problem(rng, GeneratorConfig(steps=3))
        assert set(re.findall(r"[A-Za-z]+", p.prompt + p.completion)) <= vocab
