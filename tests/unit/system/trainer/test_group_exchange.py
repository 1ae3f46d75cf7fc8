"""Moving prompt groups between DP ranks as the master's balance plan says
(realhf.system.trainer.group_exchange): over three real gloo processes, one of which arrives with
nothing, every group ends on the rank the plan names, in the plan's order, bit for bit."""

import json

import pytest

from helpers.exchange_ranks import ASSIGNMENT, HELD, describe, group
from helpers.gloo_ranks import launch_ranks
from realhf.system.trainer.group_exchange import check_assignment, group_cost


@pytest.mark.system
def test_three_ranks_end_with_exactly_the_groups_the_plan_gives_them(tmp_path):
    launch_ranks("helpers.exchange_ranks", tmp_path, world_size=3)
    for rank, wanted in enumerate(ASSIGNMENT):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == [describe(group(src, i)) for src, i in wanted], rank


def test_a_plan_that_loses_or_repeats_a_group_is_refused_naming_the_rank():
    for rank, n in enumerate(HELD):
        check_assignment(ASSIGNMENT, rank, n, world=3)
    lost = [[(0, 1)], [(0, 0)], [(2, 0), (2, 1)]]  # rank 0's third group goes nowhere
    with pytest.raises(ValueError, match=r"places rank 0's groups as \[0, 1\], but it holds 3"):
        check_assignment(lost, 0, 3, world=3)
    twice = [[(0, 1), (0, 1)], [(0, 0), (0, 2)], [(2, 0), (2, 1)]]
    with pytest.raises(ValueError, match=r"as \[0, 1, 1, 2\]"):
        check_assignment(twice, 0, 3, world=3)
    with pytest.raises(ValueError, match="plan for 2 ranks, but there are 3"):
        check_assignment(ASSIGNMENT[:2], 0, 3, world=3)


def test_a_groups_cost_counts_its_prompt_once_when_shared_and_once_per_row_otherwise():
    g = group(0, 2)  # a 5-token prompt, 3 samples
    answers = sum(len(s.output_ids) for s in g.samples)
    assert group_cost(g, shared_prompt=True) == 5 + answers
    assert group_cost(g, shared_prompt=False) == 3 * 5 + answers
