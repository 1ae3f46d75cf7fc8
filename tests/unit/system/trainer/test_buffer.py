"""The trainer-side staleness guard of docs/architecture.md §4: never train a group with version_start < v − η."""

import pytest

from realhf.api.trajectory import Sample, Trajectory
from realhf.system.trainer.buffer import TrajectoryBuffer


def _group(qid, versions_per_sample, loss_masks=None):
    samples = []
    for i, versions in enumerate(versions_per_sample):
        mask = None if loss_masks is None else loss_masks[i]
        samples.append(
            Sample(
                output_ids=[5] * len(versions),
                logprobs=[-1.0] * len(versions),
                versions=list(versions),
                reward=0.0,
                loss_mask=mask,
            )
        )
    return Trajectory(qid=qid, prompt_ids=[1, 2], samples=samples)


def test_groups_older_than_eta_versions_are_dropped_and_counted():
    buf = TrajectoryBuffer(max_head_offpolicyness=1)
    buf.add([_group("v1", [[1, 1]]), _group("v2", [[2, 2]]), _group("v3", [[3]])])
    # At version 3 with eta 1 a group needs version_start >= 2.
    dropped = buf.drop_stale(version=3)
    assert [g.qid for g in dropped] == ["v1"]
    assert buf.n_stale_dropped == 1
    assert [g.qid for g in buf.take(2, version=3)] == ["v2", "v3"]


def test_the_oldest_token_of_any_sample_decides_even_after_a_partial_rollout():
    # One sample was interrupted by a weight update: tokens from versions 0 and 2.
    g = _group("mixed", [[2, 2, 2], [0, 0, 2]])
    buf = TrajectoryBuffer(max_head_offpolicyness=1)
    buf.add([g])
    assert g.version_start == 0 and g.version_end == 2
    assert buf.drop_stale(version=2) == [g]


def test_tokens_outside_the_loss_mask_do_not_count_for_staleness():
    # Environment feedback inserted by a multi-turn agent carries no generated token.
    g = _group("feedback", [[0, 3, 3]], loss_masks=[[0, 1, 1]])
    buf = TrajectoryBuffer(max_head_offpolicyness=0)
    buf.add([g])
    assert buf.drop_stale(version=3) == []


def test_eta_zero_trains_only_groups_of_the_current_version():
    buf = TrajectoryBuffer(max_head_offpolicyness=0)
    buf.add([_group("old", [[4]]), _group("new", [[5]])])
    assert [g.qid for g in buf.take(1, version=5)] == ["new"]
    assert buf.n_stale_dropped == 1


def test_counts_accumulate_over_versions_and_take_is_fifo():
    buf = TrajectoryBuffer(max_head_offpolicyness=2)
    buf.add([_group(f"g{i}", [[i]]) for i in range(6)])
    assert [g.qid for g in buf.drop_stale(version=3)] == ["g0"]  # needs version_start >= 1
    assert [g.qid for g in buf.drop_stale(version=5)] == ["g1", "g2"]  # needs >= 3
    assert buf.n_stale_dropped == 3
    assert [g.qid for g in buf.take(2, version=5)] == ["g3", "g4"]


def test_taking_more_than_buffered_takes_nothing():
    buf = TrajectoryBuffer(max_head_offpolicyness=4)
    buf.add([_group("a", [[0]])])
    with pytest.raises(ValueError, match="asked for 2 groups but only 1 are buffered"):
        buf.take(2, version=0)
    assert len(buf) == 1


def test_a_group_received_twice_is_refused_and_counted_not_trained_twice():
    buf = TrajectoryBuffer(max_head_offpolicyness=4)
    first = _group("q@0", [[1]])
    assert buf.add([first]) == []
    assert buf.take(1, version=1) == [first]
    again = _group("q@0", [[1]])  # a rerun of the same qid, after the first copy was trained
    assert buf.add([again, _group("q@1", [[1]])]) == [again]
    assert (buf.n_duplicates, len(buf), buf.n_added) == (1, 1, 2)
