"""The long-reasoning task's generator (realhf/plugins/tasks/long_math.py): every reference answer
is worked right line by line and graded right by the math environment, lengths have the long
tail the task exists for, and the splits are distinct, seeded and as long as they claim."""

import math
import random

import pytest

from realhf.plugins.environments.math_answer import extract_answer, work_lines_correct
from realhf.plugins.tasks.long_math import (
    LongMathConfig,
    generate_splits,
    log_uniform_count,
    solution,
    to_rows,
    vocabulary,
)
from realhf.plugins.tasks.tiny_model import build_tokenizer


def test_a_solution_counts_the_packs_down_and_adds_one_pack_per_line():
    assert solution(4, 7) == " 3: 0+7=7\n2: 7+7=14\n1: 14+7=21\n0: 21+7=28\n#### 28"
    assert solution(1, 2) == " 0: 0+2=2\n#### 2"
    text = solution(40, 9)
    assert text.count("\n") == 40 and extract_answer(text) == "360" and work_lines_correct(text)


def test_a_slip_anywhere_fails_the_work_check():
    lines = solution(12, 8).split("\n")
    lines[7] = lines[7].replace("=64", "=65")
    assert not work_lines_correct("\n".join(lines))


def test_splits_are_distinct_seeded_and_longer_is_longer_than_any_training_problem():
    cfg = LongMathConfig()
    s = generate_splits(2000, 300, 100, seed=3)
    assert [len(s[k]) for k in ("train", "test", "longer")] == [2000, 300, 100]
    prompts = [p.prompt for split in s.values() for p in split]
    assert len(set(prompts)) == len(prompts)
    assert max(p.count for p in s["train"] + s["test"]) <= cfg.max_count
    assert min(p.count for p in s["longer"]) > max(p.count for p in s["train"])
    again = generate_splits(2000, 300, 100, seed=3)
    assert [p.prompt for p in again["test"]] == [p.prompt for p in s["test"]]
    for p in s["train"][:200] + s["longer"][:50]:
        assert work_lines_correct(p.completion) and extract_answer(p.completion) == str(p.answer)
        assert p.answer == p.count * p.size and f" {p.count} " in p.prompt and f" {p.size} " in p.prompt


def test_counts_are_log_uniform_so_reference_answers_have_a_long_tail():
    rng = random.Random(1)
    counts = [log_uniform_count(rng, 40) for _ in range(20000)]
    assert min(counts) == 1 and max(counts) == 40
    share = sum(c <= 2 for c in counts) / len(counts)
    assert abs(share - math.log(3) / math.log(41)) < 0.02  # as many 1-2 pack problems as 14-40
    tok = build_tokenizer(vocabulary(), model_max_length=1024)
    lengths = sorted(len(tok(p.completion).input_ids) + 1 for p in generate_splits(1000, 0, 0, seed=1)["train"])
    p50, p99 = lengths[len(lengths) // 2], lengths[int(0.99 * len(lengths))]
    assert p99 >= 5 * p50 and lengths[-1] < 768


def test_the_tokenizer_spells_every_text_exactly():
    tok = build_tokenizer(vocabulary(), model_max_length=1024)
    for p in generate_splits(200, 50, 50, seed=2)["longer"]:
        for text in (p.prompt, p.completion):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.decode(ids) == text and tok.unk_token_id not in ids


def test_rows_carry_the_count_for_reports_by_length():
    rows = to_rows(generate_splits(5, 0, 0, seed=1)["train"], "train")
    assert rows[0]["query_id"] == "train-000000" and rows[0]["task"] == "math"
    assert all(set(r) == {"query_id", "prompt", "solutions", "task", "count"} for r in rows)


@pytest.mark.parametrize(
    "cfg, error",
    [
        (LongMathConfig(max_count=1), "max_count must be >= 2"),
        (LongMathConfig(max_count=40, longer_max_count=40), "must exceed max_count"),
        (LongMathConfig(min_size=5, max_size=4), "min_size <= max_size"),
    ],
)
def test_a_bad_config_is_refused_naming_the_field(cfg, error):
    with pytest.raises(ValueError, match=error):
        generate_splits(10, 10, 10, seed=1, cfg=cfg)
