"""Trajectories → the padded tensors one train step works on (`realhf.api.train_batch.TrainBatch`,
its layout there), and the row splits of a step (minibatches, micro-batches).
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from realhf.api.train_batch import TrainBatch
from realhf.api.trajectory import Trajectory


def pack_trajectories(trajectories: Sequence[Trajectory], pad_id: int) -> TrainBatch:
    """One row per sample of every trajectory, groups kept contiguous and in order. Zero
    trajectories make a batch of zero rows: a DP rank may have nothing to train in a step (it
    still joins every collective, realhf.impl.engine.fsdp_engine)."""
    rows = [(g, traj.prompt_ids, s) for g, traj in enumerate(trajectories) for s in traj.samples]
    width = max((len(p) + len(s.output_ids) for _, p, s in rows), default=2)
    width = max(width, 2)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    behav = torch.zeros((n, width - 1), dtype=torch.float32)
    versions = torch.zeros((n, width - 1), dtype=torch.long)
    ids_np, mask_np, behav_np, versions_np = input_ids.numpy(), loss_mask.numpy(), behav.numpy(), versions.numpy()
    for i, (_, prompt, s) in enumerate(rows):
        if not len(prompt):
            raise ValueError(f"sample {i}: empty prompt; the first output token needs a prompt token to predict it")
        p, o = len(prompt), len(s.output_ids)
        # Written through numpy views of the tensors: received arrays are read-only views of
        # the message, which torch.from_numpy would warn about; numpy also casts int32 → int64.
        ids_np[i, :p] = prompt
        ids_np[i, p : p + o] = s.output_ids
        attention_mask[i, : p + o] = 1
        if o:
            cols = slice(p - 1, p - 1 + o)
            mask_np[i, cols] = s.loss_mask != 0
            behav_np[i, cols] = s.logprobs
            versions_np[i, cols] = s.versions
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=behav,
        rewards=torch.tensor([s.reward for _, _, s in rows], dtype=torch.float32),
        group_ids=torch.tensor([g for g, _, _ in rows], dtype=torch.long),
        prompt_lens=torch.tensor([len(p) for _, p, _ in rows], dtype=torch.long),
        behav_versions=versions,
    )


def minibatch_rows(batch: TrainBatch, n_minibatches: int) -> List[torch.Tensor]:
    """The rows of each of a step's `n_minibatches` optimizer steps: whole prompt groups, dealt in
    turn from the longest down (minibatch 0, 1, …, n−1, 0, 1, …), so that every minibatch holds
    long and short groups alike and the minibatches differ by at most one group's tokens at each
    turn. Rows stay in batch order within a minibatch.

    Why not contiguous ranges: a step's groups come in the order they finished, short answers
    first. On the long task (assets/tiny-long) the first of two contiguous minibatches held
    problems of 3.5 packs on average and the second 17.8: every other optimizer step went to
    problems the policy already solved, where most groups have no advantage, and Adam scales
    what little gradient is left to a full-size step (docs/benchmarks.md, "What bounds the ratio").

    Dealt in turn rather than in snake order so that data parallelism can give the unsplit
    trainer's update: ranks holding consecutive groups by length (rank 0 the two longest, …) deal
    their minibatches into the same unions.

    With fewer groups than minibatches the rows are dealt one at a time the same way (groups
    split); some minibatches are empty when n_seqs < n_minibatches (every DP rank must still take
    part in every optimizer step)."""
    if n_minibatches < 1:
        raise ValueError(f"ppo.ppo_n_minibatches must be >= 1, got {n_minibatches}")
    n = batch.n_seqs
    if n == 0:
        return [torch.zeros(0, dtype=torch.long) for _ in range(n_minibatches)]
    tokens = batch.attention_mask.sum(dim=1)  # [N]
    _, group = torch.unique_consecutive(batch.group_ids, return_inverse=True)  # [N], groups are contiguous
    n_groups = int(group.max()) + 1
    if n_groups >= n_minibatches:
        units, unit_of_row = n_groups, group
    else:
        units, unit_of_row = n, torch.arange(n)
    size = torch.zeros(units, dtype=tokens.dtype).index_add_(0, unit_of_row, tokens)
    order = sorted(range(units), key=lambda u: (-int(size[u]), u))  # longest first, ties in batch order
    target = torch.empty(units, dtype=torch.long)
    for k, u in enumerate(order):
        target[u] = k % n_minibatches
    row_target = target[unit_of_row]  # [N]
    return [torch.nonzero(row_target == m).flatten() for m in range(n_minibatches)]


def micro_batches(batch: TrainBatch, rows: torch.Tensor, max_tokens: int, by_group: bool = False) -> List[torch.Tensor]:
    """`rows` in order of length, cut into chunks whose padded size (rows × longest row) stays
    within `max_tokens` (a longer row goes alone; 0: one chunk in arrival order). A forward's
    cost is its padded size, so similar lengths share a chunk and memory stays bounded.
    `by_group`: rows of a prompt group stay next to each other (groups in order of their longest
    row), so a chunk holds whole groups whose prompt is computed once (shared_prompt)."""
    if len(rows) == 0:
        return []
    if max_tokens <= 0:
        return [rows]
    lengths = batch.attention_mask[rows].sum(dim=1)
    if by_group:
        groups = batch.group_ids[rows]
        longest = torch.zeros(int(groups.max()) + 1, dtype=lengths.dtype).scatter_reduce_(
            0, groups, lengths, reduce="amax"
        )
        # Sort by (group's longest row, group, length): lexsort by stable sorts, last key first.
        order = torch.argsort(lengths, stable=True)
        order = order[torch.argsort(groups[order], stable=True)]
        order = order[torch.argsort(longest[groups[order]], stable=True)]
    else:
        order = torch.argsort(lengths, stable=True)
    chunks, start = [], 0
    if not by_group:
        for i, length in enumerate(lengths[order].tolist()):
            if i > start and (i + 1 - start) * length > max_tokens:
                chunks.append(rows[order[start:i]])
                start = i
        chunks.append(rows[order[start:]])
        return chunks
    # With shared prompts a chunk costs (its groups × longest prompt) + (its rows × longest answer).
    prompts = batch.prompt_lens[rows][order].tolist()
    groups_in_order, lengths_in_order = groups[order].tolist(), lengths[order].tolist()
    seen, p_max, a_max = set(), 0, 0
    for i, (g, p, length) in enumerate(zip(groups_in_order, prompts, lengths_in_order)):
        new_groups = len(seen) + (g not in seen)
        new_p, new_a = max(p_max, p), max(a_max, length - p)
        if i > start and new_groups * new_p + (i + 1 - start) * new_a > max_tokens:
            chunks.append(rows[order[start:i]])
            start, seen, new_p, new_a = i, set(), p, length - p
        seen.add(g)
        p_max, a_max = new_p, new_a
    chunks.append(rows[order[start:]])
    return chunks


def batch_summary(groups: Sequence[Trajectory], version: int) -> dict:
    """The numbers the master logs about a step's data, as plain msgpack-able values.

    Staleness per group: head = v − version_start (its oldest token), tail = v − version_end.
    A sample counts as a success when its reward is > 0 (rewards are ±scale around 0).
    """
    samples = [s for g in groups for s in g.samples]
    return {
        "n_groups": len(groups),
        "n_samples": len(samples),
        "reward_sum": float(sum(s.reward for s in samples)),
        "n_success": sum(1 for s in samples if s.reward > 0),
        # Groups of 2+ samples whose rewards are all equal: GRPO's advantages are 0 on all of
        # them, so they teach nothing (TRL's frac_reward_zero_std).
        "n_groups_no_spread": sum(1 for g in groups if len(g.samples) > 1 and len({s.reward for s in g.samples}) == 1),
        "n_no_eos": sum(1 for s in samples if s.no_eos),
        "gen_tokens": sum(g.n_generated_tokens for g in groups),
        "output_tokens": sum(len(s.output_ids) for s in samples),
        "head_offpolicyness": [int(version - g.version_start) for g in groups],
        "tail_offpolicyness": [int(version - g.version_end) for g in groups],
        # The agents' own numbers (Outcome.info): [sum, count, min, max] per name, merged over
        # DP ranks by the master.
        "agent_metrics": _metric_sums(samples),
    }


def _metric_sums(samples) -> dict:
    sums: dict = {}
    for s in samples:
        for k, v in s.metrics.items():
            v = float(v)
            acc = sums.get(k)
            if acc is None:
                sums[k] = [v, 1, v, v]
            else:
                acc[0], acc[1], acc[2], acc[3] = acc[0] + v, acc[1] + 1, min(acc[2], v), max(acc[3], v)
    return sums
