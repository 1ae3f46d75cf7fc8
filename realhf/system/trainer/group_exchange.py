"""Prompt groups moved between the trainer's DP ranks, as the master's balance plan says.

Each rank took its share of the step's groups from its own stream; the master splits them anew
so every rank computes about the same number of tokens (realhf.system.master.dp_balance). Here each rank
sends the groups it holds for others and receives its own, in the plan's order: one
`all_to_all_single` of byte counts, then one of the bytes, over a gloo group (CPU bytes whatever
the compute backend). A group travels as its wire message (msgpack, `Trajectory.to_msg`), never
pickled; groups that stay on their rank are not serialized at all.

    assignment[d] = [(source rank, index in that rank's taken groups), ...]   sorted, for every d
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from realhf.api.trajectory import Trajectory
from realhf.base import serialization


def group_cost(traj: Trajectory, shared_prompt: bool) -> int:
    """Tokens the trainer's forward computes for a group: its prompt once when the prompt is
    shared by its rows (realhf.impl.engine.shared_prompt), else once per row, plus every answer."""
    answers = sum(len(s.output_ids) for s in traj.samples)
    prompts = len(traj.prompt_ids) * (1 if shared_prompt else len(traj.samples))
    return prompts + answers


def check_assignment(assignment: Sequence[Sequence[Tuple[int, int]]], rank: int, n_held: int, world: int) -> None:
    """Each of the `n_held` groups of `rank` goes to exactly one of the `world` ranks (every rank
    checks its own: together they check the whole plan)."""
    if len(assignment) != world:
        raise ValueError(f"balance plan for {len(assignment)} ranks, but there are {world}")
    mine = sorted(int(i) for dest in assignment for s, i in dest if int(s) == rank)
    if mine != list(range(n_held)):
        raise ValueError(
            f"balance plan places rank {rank}'s groups as {mine}, but it holds {n_held} "
            f"(each index 0..{n_held - 1} exactly once)"
        )


def exchange(
    groups: List[Trajectory], assignment: Sequence[Sequence[Tuple[int, int]]], rank: int, group=None
) -> List[Trajectory]:
    """Collective over `group` (all ranks): this rank's groups under `assignment`."""
    world = len(assignment)
    mine = [(int(s), int(i)) for s, i in assignment[rank]]
    if world == 1:
        return [groups[i] for _, i in mine]
    blobs = []
    for dest in range(world):
        outgoing = [groups[i] for s, i in assignment[dest] if s == rank and dest != rank]
        blobs.append(serialization.dumps([g.to_msg() for g in outgoing]) if outgoing else b"")
    send_sizes = torch.tensor([len(b) for b in blobs], dtype=torch.int64)  # [world]
    recv_sizes = torch.empty(world, dtype=torch.int64)  # [world]
    dist.all_to_all_single(recv_sizes, send_sizes, group=group)
    send = torch.from_numpy(np.frombuffer(b"".join(blobs), dtype=np.uint8).copy())  # [Σ send_sizes]
    recv = torch.empty(int(recv_sizes.sum()), dtype=torch.uint8)  # [Σ recv_sizes]
    dist.all_to_all_single(
        recv, send, output_split_sizes=recv_sizes.tolist(), input_split_sizes=send_sizes.tolist(), group=group
    )
    received, offset = {}, 0
    raw = recv.numpy().tobytes()
    for src, size in enumerate(recv_sizes.tolist()):
        if size:
            msgs = serialization.loads(raw[offset : offset + size])
            indices = [i for s, i in mine if s == src]
            received.update({(src, i): Trajectory.from_msg(m) for i, m in zip(indices, msgs)})
        offset += size
    return [groups[i] if s == rank else received[(s, i)] for s, i in mine]


def replicate(groups: List[Trajectory], src: int, group=None) -> List[Trajectory]:
    """Collective over `group` (one tensor-parallel replica): the groups of rank `src` (global
    rank), on every rank of the replica. The ranks of a replica split one model, so they must
    train the same batch; the head's groups travel as wire messages (msgpack), never pickled."""
    blob = serialization.dumps([g.to_msg() for g in groups]) if dist.get_rank() == src else b""
    size = torch.tensor([len(blob)], dtype=torch.int64)  # [1]
    dist.broadcast(size, src=src, group=group)
    data = torch.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy()) if blob else torch.empty(0, dtype=torch.uint8)
    if dist.get_rank() != src:
        data = torch.empty(int(size), dtype=torch.uint8)  # [size]
    if int(size):
        dist.broadcast(data, src=src, group=group)
    if dist.get_rank() == src:
        return groups
    return [Trajectory.from_msg(m) for m in serialization.loads(data.numpy().tobytes())] if int(size) else []
