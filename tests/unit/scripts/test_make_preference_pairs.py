"""scripts/make_preference_pairs.py on the embedded task, small: every pair has a prompt, a chosen
answer the task's grader accepts and a rejected one it refuses."""

import json

import pytest

from realhf.plugins.environments.math_grader import MathGrader
from scripts import make_preference_pairs

pytestmark = pytest.mark.system


def test_pairs_are_a_right_and_a_wrong_answer_of_the_models_own(tmp_path):
    assert (
        make_preference_pairs.main(["--n-train", "24", "--n-test", "8", "--samples", "6", "--out", str(tmp_path)]) == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert 0 < len(rows) <= 24 and (tmp_path / "test.jsonl").is_file()
    with MathGrader(n_workers=1) as grader:
        for r in rows:
            assert r["prompt"] and r["chosen"] != r["rejected"]
            assert grader.grade(r["chosen"], r["solutions"]) and not grader.grade(r["rejected"], r["solutions"])


def test_several_pairs_per_prompt_are_distinct_and_have_their_own_ids(tmp_path):
    args = ["--n-train", "24", "--n-test", "8", "--samples", "8", "--out", str(tmp_path)]
    assert make_preference_pairs.main([*args, "--pairs-per-prompt", "3"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    ids = [r["query_id"] for r in rows]
    by_prompt = {}
    for r in rows:
        by_prompt.setdefault(r["query_id"].rsplit("-", 1)[0], []).append((r["chosen"], r["rejected"]))
    assert len(set(ids)) == len(ids) and len(rows) > len(by_prompt)  # some prompt gave more than one
    assert all(len(p) <= 3 and len(set(p)) == len(p) for p in by_prompt.values())
