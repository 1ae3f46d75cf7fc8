"""The trainer's recovery checkpoint: everything a model-worker group needs to continue a run
exactly where it stopped, written by all DP ranks together and published in one rename.

    <run_dir>/recover/
        recover_info.json   version, DP size, roles, the master's counters and the trainer's
                            own state (`extra`; the model worker adds `actor_state`, the
                            adaptive KL coefficient: realhf.impl.model.ppo_actor.PPOActor.state_dict)
        <role>/             one trainable engine's shards: model and optimizer
                            (torch.distributed.checkpoint) + lr_schedule.json
        rng/rank<r>.pt      each rank's torch and Python RNG state

Everything goes into `.tmp-recover` next to it first; rank 0 fsyncs every file and directory
and moves it into place in one atomic step (`checkpoint.move_into_place`: a rename, or one
RENAME_EXCHANGE with the previous checkpoint), so a kill at any moment leaves either the previous
checkpoint or the new one, never a mix and never none. What a killed save left (`.tmp-*`,
`.old-*`) is deleted by the next one. The shards re-shard on load (torch.distributed.checkpoint), so a run may
resume at another DP size; a rank without an RNG file of its own then keeps its fresh RNG.
RNG files are read with `weights_only=True` from the run's own directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from realhf.api.engine_api import TrainEngine
from realhf.base.collectives import barrier
from realhf.base.device import rng_state, set_rng_state
from realhf.impl.model.checkpoint import move_into_place, prune_leftovers

INFO_FILE = "recover_info.json"


def _rng_file(root: Path, rank: int) -> Path:
    return root / "rng" / f"rank{rank}.pt"


def save(path: Path, engines: Mapping[str, TrainEngine], rank: int, world_size: int, device: torch.device,
         extra: Optional[Dict[str, Any]] = None, io_group=None) -> Path:
    """Collective: write the recovery checkpoint of `engines` (role → trainable engine) at `path`.
    `extra` (msgpack/JSON-able counters from the master) is stored beside `version` in the info file.
    The ranks wait for rank 0's file system work on `io_group` (realhf.base.collectives)."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        prune_leftovers(path.parent)  # `.tmp-recover`, `.old-*`: left by a save that was killed
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    barrier(io_group)
    for role, engine in engines.items():
        engine.save_recover(tmp / role)
    torch.save({**rng_state(device), "python": random.getstate()}, _rng_file(tmp, rank))
    barrier(io_group)
    if rank == 0:
        info = {**(extra or {}), "dp_size": world_size, "roles": sorted(engines)}
        (tmp / INFO_FILE).write_text(json.dumps(info))
        _fsync_tree(tmp)
        path.parent.mkdir(parents=True, exist_ok=True)
        move_into_place(tmp, path)
        _fsync(path.parent)
    barrier(io_group)
    return path


def read_info(path: Path) -> Optional[Dict[str, Any]]:
    """The info of the checkpoint at `path` (version, counters…), None when there is none."""
    f = Path(path) / INFO_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def load(path: Path, engines: Mapping[str, TrainEngine], rank: int, device: torch.device) -> Dict[str, Any]:
    """Collective: restore `engines` and this rank's RNG from `path`; returns the info."""
    path = Path(path)
    info = read_info(path)
    if info is None:
        raise FileNotFoundError(f"no recovery checkpoint at {path} (no {INFO_FILE})")
    missing = sorted(set(engines) - set(info.get("roles", [])))
    if missing:
        raise ValueError(f"recovery checkpoint {path} has no state for {missing} (it holds {info.get('roles')}); "
                         "was it written by a run with another ppo.adv_estimator?")
    for role, engine in engines.items():
        engine.load_recover(path / role)
    rng = _rng_file(path, rank)
    if rng.is_file():
        state = torch.load(rng, weights_only=True)
        set_rng_state(state, device)
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
    return info


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then the directories, so the rename publishes whole files."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))
