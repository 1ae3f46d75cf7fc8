"""stats.log_completions: which samples of a step are shown, what a row carries, and the one
console line per row (realhf.system.stats.completion_log); the file and the echo: test_stats_logger.py."""

import numpy as np

from realhf.api.trajectory import Sample, Trajectory
from realhf.system.stats.completion_log import (
    COMPLETION_CHARS,
    PROMPT_CHARS,
    completion_rows,
    console_lines,
    pick,
    shorten,
)


def _group(qid: str, n_samples: int, version: int = 3) -> Trajectory:
    samples = [
        Sample(output_ids=[10 + i, 11 + i], logprobs=[-0.1, -0.2], versions=[version, version], reward=float(i))
        for i in range(n_samples)
    ]
    return Trajectory(qid=qid, prompt_ids=[1, 2, 3], samples=samples)


def _decode(ids):
    return " ".join(f"t{i}" for i in ids)


def test_pick_shows_one_sample_per_prompt_before_a_second_of_any():
    groups = [_group("a", 3), _group("b", 1), _group("c", 2)]
    assert pick(groups, 4) == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert pick(groups, 2) == [(0, 0), (1, 0)]
    assert pick(groups, 100) == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]  # all 6 there are
    assert pick(groups, 0) == [] and pick([], 3) == []


def test_a_row_carries_the_decoded_texts_reward_versions_and_the_agents_numbers():
    g = _group("q7@0", 2)
    # A second turn the agent inserted (loss mask 0) at an older version: not a trained token.
    g.samples[1] = Sample(
        output_ids=[5, 6, 7, 8],
        logprobs=[-0.1, 0.0, -0.3, -0.2],
        versions=[4, 1, 5, 5],
        reward=-1.0,
        no_eos=True,
        loss_mask=np.array([1, 0, 1, 1], dtype=np.int32),
        metrics={"turns": 2, "success": False},
    )
    rows = completion_rows([g], 2, _decode)
    assert rows[1] == {
        "qid": "q7@0",
        "reward": -1.0,
        "no_eos": True,
        "version_start": 4,
        "version_end": 5,
        "n_prompt_tokens": 3,
        "n_output_tokens": 4,
        "metrics": {"turns": 2.0, "success": 0.0},
        "prompt": "t1 t2 t3",
        "completion": "t5 t6 t7 t8",
    }
    assert rows[0]["completion"] == "t10 t11" and rows[0]["version_start"] == rows[0]["version_end"] == 3


def test_shorten_keeps_both_ends_within_the_width():
    text = "Q: " + "x" * 300 + " How many?"
    cut = shorten(text, 40)
    assert len(cut) == 40 and cut.startswith("Q: x") and cut.endswith("How many?") and " … " in cut
    assert shorten("short", 40) == "short"


def test_each_row_is_one_console_line_with_its_texts_cut_to_width():
    row = {
        "qid": "train-1@0",
        "reward": 1.0,
        "no_eos": False,
        "version_start": 2,
        "version_end": 3,
        "metrics": {"success": 1.0},
        "prompt": "Q: Sam has 1 coin.\nHe buys 8 more. " * 20 + "How many?\nA:",
        "completion": " 1+8=9\n" + "[bold]" * 100 + "\n#### 9",
    }
    (line,) = console_lines([row])
    assert "\n" not in line and len(line) < PROMPT_CHARS + COMPLETION_CHARS + 150
    assert line.startswith("  completion 1/1 | qid train-1@0 | v2-3 | reward +1.000 | success=1 | prompt ")
    assert 'How many?\\nA:" | completion " 1+8=9\\n' in line and line.endswith('\\n#### 9"')
    row.update(no_eos=True, version_start=3, metrics={})
    assert "| v3 | reward +1.000 (cut at max_new_tokens) | prompt " in console_lines([row])[0]
