"""scripts/make_preference_pairs.py on the embedded task, small: every pair has a prompt, a chosen
answer the task's grader accepts and a rejected one it refuses."""

import json

from realhf.plugins.environments.math_grader import MathGrader
from scripts import make_preference_pairs


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
