"""Learning per sample (scripts/bench/learning_per_sample.py): windows of equal samples, and each
system's training success set against the warm start's on the same prompts."""

import json

import pytest

from scripts.bench import learning_per_sample as lps

BASE = {"1-2": 0.9, "3-4": 0.8, "5-8": 0.5, "9-16": 0.3, "17-32": 0.1, "33-40": 0.0}
PACKS = {"a": 1, "b": 4, "c": 20}


def test_windows_weigh_by_samples_and_close_when_full():
    got = lps.windows([(100, 1.0, 0.5), (100, 0.0, 0.5), (200, 0.5, 0.25)], window=200)
    assert got == [
        {"samples": 200, "success": 0.5, "expected": 0.5, "lift": 0.0},
        {"samples": 400, "success": 0.5, "expected": 0.25, "lift": 0.25},
    ]
    assert lps.windows([(100, 1.0, 0.5)], window=200) == []  # an unfinished window is not reported


def test_a_realhf_step_is_read_against_the_warm_starts_rate_for_its_prompts(tmp_path):
    (tmp_path / "trained_qids.jsonl").write_text(
        json.dumps({"step": 1, "qids": ["a@0", "c@0"]}) + "\n" + json.dumps({"step": 2, "qids": ["b@0"]}) + "\n"
    )
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "n_samples": 16, "success_rate": 0.75})
        + "\n"
        + json.dumps({"step": 2, "n_samples": 8, "success_rate": 0.5})
        + "\n"
    )
    assert lps.realhf_steps(str(tmp_path), PACKS, BASE) == [(16, 0.75, pytest.approx(0.5)), (8, 0.5, 0.8)]


def test_trls_reward_calls_are_read_likewise(tmp_path):
    log = tmp_path / "trl-samples-1.jsonl"
    log.write_text(json.dumps({"t": 1.0, "query_id": ["a", "a", "c", "c"], "reward": [1.0, 1.0, 1.0, 0.0]}) + "\n")
    assert lps.trl_calls(str(log), PACKS, BASE) == [(4, 0.75, pytest.approx(0.5))]


def test_a_problem_outside_every_bucket_is_named():
    with pytest.raises(ValueError, match="99 packs"):
        lps.bucket_of(99)
