"""The receiving side of SGLang's distributed weight update, for the built-in engine.

    POST /init_weights_update_group       {master_address, master_port, rank_offset, world_size,
                                           group_name, backend}: join the sender's group
    POST /update_weights_from_distributed {names, dtypes, shapes, group_name, weight_version?}:
                                           receive one bucket, broadcast from rank 0 in that order
    POST /destroy_weights_update_group    {group_name}

SGLang loads each bucket into the running model as it arrives. This engine stages the buckets
and swaps the whole set in between two decode steps when a request carries `weight_version` (the
last bucket of a version, as realhf's trainer sends it), so a server that is not paused never
samples from half-old, half-new weights, and a broadcast that breaks off midway leaves the
served weights untouched (the staged tensors are dropped with the group). Versions never go
back: a bucket whose `weight_version` is lower than the served one is still received (the sender
would otherwise wait on this rank) and then refused.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional

import torch

from realhf.base import logging
from realhf.base.weight_group import WeightGroup, WeightGroupError
from realhf.impl.inference.engine import Engine

logger = logging.getLogger("gen_server")


class WeightSyncRefused(ValueError):
    """The request cannot be served as asked (the message says why); nothing was changed."""


class VersionWentBack(WeightSyncRefused):
    pass


def parse_dtype(name: str) -> torch.dtype:
    short = name.split(".", 1)[1] if name.startswith("torch.") else name
    dtype = getattr(torch, short, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncRefused(f"dtypes: {name!r} is not a torch dtype")
    return dtype


class _Joined:
    """One group and what it has delivered so far (a bucket at a time: `lock`)."""

    def __init__(self, group: WeightGroup):
        self.group = group
        self.staged: Dict[str, torch.Tensor] = {}
        self.lock = threading.Lock()


class WeightReceiver:
    """The groups this server has joined, each with the tensors staged for its next version. A
    new group never waits for an old one: a receive stuck in a broken group (the sender gave up
    on a peer) runs out its timeout on its own while the new group serves."""

    def __init__(self, engine: Engine, timeout_s: float = 60.0):
        self.engine, self.timeout_s = engine, timeout_s
        self.groups: Dict[str, _Joined] = {}
        self._lock = threading.Lock()  # the dict only, never held across a network wait

    def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> str:
        """Blocks until every member has joined (or the timeout passes)."""
        if backend == "nccl" and self.engine.device.type != "cuda":
            raise WeightSyncRefused(
                f"backend 'nccl' needs a GPU; this server runs on {self.engine.device}: ask for 'gloo'"
            )
        if rank_offset < 1:
            raise WeightSyncRefused(f"rank_offset {rank_offset}: rank 0 is the sender, a server is 1 or above")
        self.destroy(group_name)
        try:
            group = WeightGroup(
                master_address, master_port, rank_offset, world_size, group_name, backend, self.timeout_s
            )
        except (RuntimeError, ValueError) as e:
            raise WeightGroupError(
                f"joining weight group {group_name!r} at {master_address}:{master_port} as rank {rank_offset} "
                f"of {world_size} failed: {str(e).splitlines()[0][:300]}"
            ) from None
        with self._lock:
            self.groups[group_name] = _Joined(group)
        logger.info(f"joined weight group {group_name!r} ({backend}) as rank {rank_offset} of {world_size}")
        return f"joined {group_name} as rank {rank_offset} of {world_size}"

    def receive(
        self,
        names: List[str],
        dtypes: List[str],
        shapes: List[List[int]],
        group_name: str,
        weight_version: Optional[int],
    ) -> Optional[int]:
        """One bucket; with `weight_version`, swap in everything staged and return the version."""
        if not (len(names) == len(dtypes) == len(shapes)):
            raise WeightSyncRefused(
                f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}"
            )
        with self._lock:
            joined = self.groups.get(group_name)
            if joined is None:
                raise WeightSyncRefused(
                    f"no weight group {group_name!r} here (joined: {sorted(self.groups) or 'none'}): "
                    "call /init_weights_update_group first"
                )
        group = joined.group
        where = self.engine.device if group.backend == "nccl" else torch.device("cpu")
        tensors = [torch.empty(tuple(s), dtype=parse_dtype(d), device=where) for d, s in zip(dtypes, shapes)]
        with joined.lock:
            try:
                group.broadcast(tensors)
            except WeightGroupError:
                self.destroy(group_name, joined)
                raise
            joined.staged.update(zip(names, tensors))
            if weight_version is None:
                return None
            state, joined.staged = joined.staged, {}
        if weight_version < self.engine.weight_version:
            raise VersionWentBack(
                f"weight_version {weight_version} is lower than the served version {self.engine.weight_version}; "
                "versions never go back"
            )
        if weight_version == self.engine.weight_version:
            # The trainer sends its version again for a server that joined after the broadcast
            # (catch_up, while it waits for data); a member that already serves it keeps its
            # running requests instead of aborting them for the same weights. A version number
            # names one set of weights, as the manager's disk updates assume too.
            logger.info(f"weight version {weight_version} from {group_name}: already served here, nothing swapped")
            return weight_version
        return self.engine.update_weights_from_state(state, weight_version, source=f"weight group {group_name}")

    def destroy(self, group_name: str, only: Optional[_Joined] = None) -> bool:
        """Leave `group_name` (only if it is still `only`, where given)."""
        with self._lock:
            joined = self.groups.get(group_name)
            if joined is None or (only is not None and joined is not only):
                return False
            del self.groups[group_name]
        joined.group.close()
        return True

    def close(self) -> None:
        for name in list(self.groups):
            self.destroy(name)
