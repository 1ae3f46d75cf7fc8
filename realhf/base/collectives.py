"""Collectives of the trainer's ranks that end in bounded time and say which call they were.

A data-parallel trainer is correct only if every rank runs the same sequence of collectives; a
rank that skips one (or runs one more) leaves the others waiting in a collective nobody else
enters. The process group's timeout (`cluster.collective_timeout`, given to
`init_process_group`) bounds every such wait; `named` turns the backend's timeout into an error
that names the rank, the engine, the call and the step, so the run ends saying where it stuck
instead of sitting for gloo's default five minutes.

Waits that are not compute — a rank waiting while rank 0 writes a checkpoint to disk — go
through a gloo group with a longer timeout (the model worker's `io_group`,
`distributed_timeout`), so the short one never fires on a slow disk.
"""

from __future__ import annotations

import datetime
import re
from contextlib import contextmanager
from typing import Iterator, List, Optional

import torch
import torch.distributed as dist


class CollectiveTimeoutError(RuntimeError):
    """A collective of the trainer did not complete in time: the ranks ran different calls."""

    def __init__(self, where: str, cause: str, setting: str = "cluster.collective_timeout"):
        self.where, self.cause, self.setting = where, cause, setting
        ms = re.search(r"Timed out waiting (\d+)ms", cause)
        within = f" within {int(ms.group(1)) / 1000:g}s ({setting})" if ms else ""
        super().__init__(
            f"{where}: a collective did not complete{within}: another rank is in a different collective or "
            f"in none (it skipped this call, failed, or hangs); backend: {cause.strip()[:300]}"
        )

    def at(self, step_label: str, setting: str = "") -> "CollectiveTimeoutError":
        """The same error with the train step (known to the caller, not the engine) in its text;
        `setting`: the config key of the timeout, where the caller's is not cluster's."""
        return CollectiveTimeoutError(f"{self.where}, {step_label}", self.cause, setting or self.setting)


def is_timeout(e: BaseException) -> bool:
    """Whether `e` is a collective backend's timeout: gloo raises RuntimeError("... Timed out
    waiting <n>ms ..."); NCCL's watchdog aborts the process itself (after its flight recorder dump)."""
    return isinstance(e, RuntimeError) and (
        "Timed out waiting" in str(e) or (isinstance(e, dist.DistBackendError) and "timeout" in str(e).lower())
    )


@contextmanager
def named(where: str) -> Iterator[None]:
    """Run collectives; a backend timeout inside becomes a CollectiveTimeoutError naming `where`."""
    try:
        yield
    except CollectiveTimeoutError:
        raise
    except RuntimeError as e:
        if is_timeout(e):
            raise CollectiveTimeoutError(where, str(e)) from e
        raise


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def agree_max(values: List[int], device: torch.device) -> List[int]:
    """The element-wise maximum of `values` over all ranks (every rank passes a list of the same
    length): how the ranks agree on a plan before running it."""
    if world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device=device)  # NCCL reduces device tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(x) for x in t.tolist()]


def new_gloo_group(timeout_s: float, ranks: Optional[List[int]] = None):
    """A gloo group of all ranks (or of `ranks`: every rank must make the same call) with its own
    timeout (None on one rank): for CPU data between ranks whatever the compute backend, and for
    waits on another rank's disk writes."""
    if world_size() == 1:
        return None
    return dist.new_group(ranks=ranks, backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def barrier(group=None) -> None:
    """All ranks of `group` (default: all) meet here; nothing to do on one rank."""
    if world_size() > 1:
        dist.barrier(group=group)
