"""The trainer's recovery checkpoint: everything a model-worker group needs to continue a run
exactly where it stopped, written by all DP ranks together and published in one rename.

    <run_dir>/recover/          the newest (trial_files.recover_dir)
        recover_info.json   version, DP size, roles, the master's counters and the trainer's
                            own state (`extra`; the model worker adds `actor_state`, the
                            adaptive KL coefficient: realhf.system.trainer.ppo_actor.PPOActor.state_dict)
        <role>/             one trainable engine's shards: model and optimizer
                            (torch.distributed.checkpoint) + lr_schedule.json
        rng/rank<r>.pt      each rank's torch and Python RNG state
        manifest.json       written last: every other file's size and sha256
    <run_dir>/recover.prev/     the one before it, same layout (trial_files.recover_prev_dir)

Everything goes into `.tmp-recover` next to it first; rank 0 hashes every file into the manifest,
fsyncs every file and directory and moves it into place (`checkpoint.move_into_place`: a rename,
or one RENAME_EXCHANGE with the previous checkpoint, which then replaces `recover.prev` the same
way), so a kill at any moment leaves a whole checkpoint at one of the two names, never a mix.
What a killed save left (`.tmp-*`, `.old-*`) is deleted by the next one. On resume the launcher
calls `choose`: the newest checkpoint whose files match its manifest (`verify`: sizes, then
checksums), with a warning naming what is wrong with a newer one it skips; an error listing each
when none is whole. The shards re-shard on load (torch.distributed.checkpoint), so a run may
resume at another DP size; a rank without an RNG file of its own then keeps its fresh RNG.
RNG files are read with `weights_only=True` from the run's own directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch.distributed.checkpoint import CheckpointException

from realhf.api.engine_api import TrainEngine
from realhf.base import logging, trial_files
from realhf.base.collectives import barrier
from realhf.base.device import rng_state, set_rng_state
from realhf.impl.model.checkpoint import move_into_place, prune_leftovers

logger = logging.getLogger("recover_checkpoint")

INFO_FILE = "recover_info.json"
MANIFEST_FILE = "manifest.json"


class DamagedCheckpointError(ValueError):
    """No recovery checkpoint to resume from is whole; the message says what is wrong with each."""


def _rng_file(root: Path, rank: int) -> Path:
    return root / "rng" / f"rank{rank}.pt"


def save(
    path: Path,
    engines: Mapping[str, TrainEngine],
    rank: int,
    world_size: int,
    device: torch.device,
    extra: Optional[Dict[str, Any]] = None,
    io_group=None,
) -> Path:
    """Collective: write the recovery checkpoint of `engines` (role → trainable engine) at `path`;
    the one it replaces becomes `trial_files.previous_dir(path)`. `extra` (msgpack/JSON-able
    counters from the master) is stored beside `version` in the info file. The ranks wait for
    rank 0's file system work (manifest, fsync, renames) on `io_group` (realhf.base.collectives)."""
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
    if rank == 0:  # every rank's files are written: only rank 0 reads them back, once
        info = {**(extra or {}), "dp_size": world_size, "roles": sorted(engines)}
        (tmp / INFO_FILE).write_text(json.dumps(info))
        _write_manifest(tmp)
        _fsync_tree(tmp)
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_if_damaged(path)
        move_into_place(tmp, path, previous=trial_files.previous_dir(path))
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
        raise ValueError(
            f"recovery checkpoint {path} has no state for {missing} (it holds {info.get('roles')}); "
            "was it written by a run with another ppo.adv_estimator?"
        )
    for role, engine in engines.items():
        try:
            engine.load_recover(path / role)
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            # Only on failure: torch.distributed.checkpoint's bare EOFError names no file.
            problem = verify(path) if (path / MANIFEST_FILE).is_file() else None
            if problem is None:
                raise
            raise DamagedCheckpointError(f"cannot load {role} from the recovery checkpoint: {problem}") from e
    rng = _rng_file(path, rank)
    if rng.is_file():
        state = torch.load(rng, weights_only=True)
        set_rng_state(state, device)
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
    return info


def verify(path: Path, checksums: bool = True) -> Optional[str]:
    """None when every file of the checkpoint at `path` has the size (and, with `checksums`, the
    sha256) its manifest records; else what is wrong, naming the directory and the first bad file."""
    path = Path(path)
    if not path.is_dir():
        return f"{path}: no such checkpoint directory"
    files = _read_manifest(path)
    if isinstance(files, str):
        return files
    # Sizes first: a truncated file is found without reading every other one.
    for rel, (size, _) in files.items():
        f = path / rel
        if not f.is_file():
            return f"{path}: {rel} is missing"
        if f.stat().st_size != size:
            return f"{path}: {rel} has {f.stat().st_size} bytes, expected {size}"
    if not checksums:
        return None
    for rel, (_, digest) in files.items():
        if _sha256(path / rel) != digest:
            return f"{path}: {rel} fails its checksum (its sha256 is not the manifest's)"
    return None


def choose(run_dir: str) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """(path, info) of the newest recovery checkpoint under `run_dir` that `verify`s: `recover`,
    else `recover.prev` with a warning saying what is wrong with `recover`. None when neither
    exists; DamagedCheckpointError, saying what is wrong with each, when neither is whole."""
    candidates = (trial_files.recover_dir(run_dir), trial_files.recover_prev_dir(run_dir))
    if not any(p.exists() for p in candidates):
        return None
    problems: List[str] = []
    for path in candidates:
        problem = verify(path)
        if problem is None:
            info = read_info(path)
            if problems:
                logger.warning(
                    f"not resuming from the newest recovery checkpoint: {problems[0]}; resuming from "
                    f"the previous one, {path} (version {info.get('version')})"
                )
            return path, info
        problems.append(problem)
    raise DamagedCheckpointError(
        f"no recovery checkpoint under {run_dir} is whole: {'; '.join(problems)}. Restore the files from a copy, "
        "or start afresh (recover_mode=disabled with overwrite=true, or another trial_name)"
    )


def _write_manifest(root: Path) -> None:
    """Every file under `root` (relative path → size and sha256), as its last file."""
    t0, files = time.monotonic(), {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            f = Path(dirpath) / name
            files[f.relative_to(root).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f)}
    (root / MANIFEST_FILE).write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1))
    total = sum(e["size"] for e in files.values())
    logger.info(f"manifest of {len(files)} files ({total / 2**20:.1f} MiB) hashed in {time.monotonic() - t0:.2f}s")


def _read_manifest(path: Path):
    """{relative path: (size, sha256)} from the manifest of `path`, or what is wrong with it."""
    f = path / MANIFEST_FILE
    if not f.is_file():
        return (
            f"{path}: no {MANIFEST_FILE}, so it cannot be verified (written by a realhf older than "
            "manifests, or not by recover_checkpoint.save)"
        )
    try:
        return {rel: (int(e["size"]), str(e["sha256"])) for rel, e in json.loads(f.read_text())["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{f}: unreadable ({type(e).__name__}: {e})"


def _sha256(f: Path) -> str:
    h = hashlib.sha256()  # hashlib.file_digest is 3.11+; setup.py allows 3.10
    with open(f, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _drop_if_damaged(path: Path) -> None:
    """Delete the checkpoint at `path` if it is visibly damaged (a file missing or of the wrong size;
    sizes only: hashing it again at every save would read it all), so that the save about to
    replace it keeps the whole previous one instead of demoting a damaged one over it."""
    problem = verify(path, checksums=False) if path.exists() else None
    if problem is None:
        return
    logger.warning(f"not keeping the checkpoint being replaced as the previous one: {problem}")
    doomed = path.with_name(f".old-{path.name}-{os.getpid()}")  # prune_leftovers' name, should we die here
    path.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


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
