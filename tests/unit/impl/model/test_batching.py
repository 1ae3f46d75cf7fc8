"""Trajectories packed into a padded training batch, and its split into minibatches."""

import pytest
import torch

from helpers.trajectories import load_rows, make_groups
from realhf.api.train_batch import TrainBatch
from realhf.api.trajectory import Trajectory
from realhf.impl.model.batching import micro_batches, minibatch_rows, pack_trajectories


def test_batch_puts_each_output_token_in_the_column_of_the_logits_that_predict_it(tiny):
    model, tok = tiny
    msg = make_groups(model, tok, load_rows(1), group_size=2, version=7)[0]
    traj = Trajectory.from_msg(msg)
    traj.samples[1].versions[:2] = 5  # a sample interrupted by a weight update: two versions
    batch = pack_trajectories([traj], pad_id=0)
    p = len(traj.prompt_ids)
    for i, s in enumerate(traj.samples):
        o = len(s.output_ids)
        assert batch.input_ids[i, p : p + o].tolist() == s.output_ids.tolist()
        assert batch.loss_mask[i].nonzero().flatten().tolist() == list(range(p - 1, p - 1 + o))
        assert torch.allclose(batch.behav_logprobs[i, p - 1 : p - 1 + o], torch.from_numpy(s.logprobs.copy()))
        assert batch.behav_versions[i, p - 1 : p - 1 + o].tolist() == s.versions.tolist()
        assert (batch.behav_versions[i, ~batch.loss_mask[i]] == 0).all()
    assert batch.behav_versions[1].max() == 7 and sorted(set(batch.behav_versions[1, batch.loss_mask[1]].tolist())) == [
        5,
        7,
    ]
    assert batch.group_ids.tolist() == [0, 0] and batch.rewards.tolist() == [1.0, -1.0]


def _lengths_batch(groups):
    """A batch of the given groups, each a list of its rows' token counts, groups contiguous."""
    lengths = [n for g in groups for n in g]
    width = max(lengths)
    attention = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    group_ids = torch.tensor([k for k, g in enumerate(groups) for _ in g])
    zeros = torch.zeros(len(lengths), width - 1)
    return TrainBatch(
        input_ids=torch.ones(len(lengths), width, dtype=torch.long),
        attention_mask=attention,
        loss_mask=zeros.bool(),
        behav_logprobs=zeros,
        rewards=torch.zeros(len(lengths)),
        group_ids=group_ids,
        prompt_lens=torch.ones(len(lengths), dtype=torch.long),
        behav_versions=zeros.long(),
    )


def test_minibatches_mix_long_and_short_groups_whatever_order_they_arrived_in():
    # Groups in the order they finished: short answers first, as a step's buffer hands them over.
    groups = [[20, 20], [30, 30], [40, 40], [60, 60], [300, 300], [400, 400], [500, 500], [600, 600]]
    batch = _lengths_batch(groups)
    parts = minibatch_rows(batch, 2)
    rows = sorted(r for p in parts for r in p.tolist())
    assert rows == list(range(batch.n_seqs))  # every row once
    tokens = [int(batch.attention_mask[p].sum()) for p in parts]
    assert abs(tokens[0] - tokens[1]) <= 0.15 * sum(tokens)  # contiguous halves: 300 against 3,600
    for p in parts:
        gids = batch.group_ids[p].tolist()
        assert all(gids.count(g) == 2 for g in set(gids))  # whole groups
        assert p.tolist() == sorted(p.tolist())  # batch order within a minibatch
        assert min(gids) < 4 <= max(gids)  # short and long groups in every minibatch


def test_minibatches_split_groups_only_when_there_are_fewer_groups_than_minibatches():
    batch = _lengths_batch([[10, 50, 30, 20]])
    parts = minibatch_rows(batch, 2)
    assert sorted(r for p in parts for r in p.tolist()) == [0, 1, 2, 3] and all(len(p) == 2 for p in parts)
    assert [p.tolist() for p in minibatch_rows(_lengths_batch([[5]]), 2)] == [[0], []]  # n_seqs < n_minibatches
    with pytest.raises(ValueError, match="ppo_n_minibatches"):
        minibatch_rows(batch, 0)


def test_micro_batches_keep_every_row_once_in_order_of_length_within_the_token_budget(tiny):
    model, tok = tiny
    batch = pack_trajectories([Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(4), 4)], 0)
    rows = torch.arange(1, batch.n_seqs)  # any subset
    lengths = batch.attention_mask.sum(dim=1)
    chunks = micro_batches(batch, rows, max_tokens=120)
    assert len(chunks) > 1
    assert sorted(torch.cat(chunks).tolist()) == rows.tolist()
    flat = torch.cat(chunks)
    assert (lengths[flat][1:] >= lengths[flat][:-1]).all()
    for c in chunks:
        assert len(c) == 1 or len(c) * int(lengths[c].max()) <= 120
    assert [c.tolist() for c in micro_batches(batch, rows, 0)] == [rows.tolist()]
    assert micro_batches(batch, rows[:0], 120) == []


def test_batch_summary_keeps_each_agent_numbers_sum_count_and_extremes():
    from realhf.api.trajectory import Sample
    from realhf.impl.model.batching import batch_summary

    samples = [
        Sample([4], [-0.5], [0], 1.0, metrics={"turns": 3, "tool_calls": 1}),
        Sample([4], [-0.5], [0], 0.0, metrics={"turns": 1}),
        Sample([4], [-0.5], [0], 0.0, metrics={"turns": 2}),
    ]
    summary = batch_summary([Trajectory("q", [1], samples)], version=1)
    assert summary["agent_metrics"] == {"turns": [6.0, 3, 1.0, 3.0], "tool_calls": [1.0, 1, 1.0, 1.0]}
