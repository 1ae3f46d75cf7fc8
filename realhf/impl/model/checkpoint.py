"""HF directories on disk: published versions for the generation servers, and saves.

Published weights (docs/architecture.md §5): `<run_dir>/published_weights/<role>/<version>/`
(the layout is `realhf.base.trial_files`'s) is a complete HF directory (config.json,
model.safetensors, tokenizer files), gathered from the trainer's shards by its engine
(`TrainEngine.save_hf`). It is written into a temporary directory next to it and moved into
place in one atomic step (`move_into_place`), so a server never loads a half-written version;
`prune_versions` then deletes all but the newest `keep`. Saves
(`<run_dir>/checkpoints/<role>/version<v>/`) are pruned the same way by `prune_saves`, and the
`.tmp-*`/`.old-*` halves of a killed save by `prune_leftovers` at the next save or start.

The recovery checkpoint (sharded, all engines of a trainer) is realhf.impl.model.recover_checkpoint's.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from realhf.base import logging

if TYPE_CHECKING:  # only annotations: the launcher prunes directories with this module, without torch
    import torch

logger = logging.getLogger("checkpoint")


# Copied verbatim from the source model: training does not change the tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json",
)  # fmt: skip


def _tmp_dir_next_to(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    prune_leftovers(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; published weights are read by other processes
    return tmp


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing paths in one step


def _exchange(a: Path, b: Path) -> None:
    """Swap the directories at `a` and `b` atomically (renameat2 RENAME_EXCHANGE, Linux ≥ 3.15
    on ext4, xfs, btrfs, tmpfs). OSError where the filesystem or libc cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def move_into_place(tmp: Path, out: Path, previous: Optional[Path] = None) -> None:
    """Publish the complete directory `tmp` at `out` in one atomic step: a reader (or a crash)
    sees the old `out` or the new one, never neither. A new `out` is one rename; an existing one
    is swapped with `tmp` by one RENAME_EXCHANGE and the old copy (now at `tmp`, a `.tmp-*` name
    that `prune_leftovers` removes if we die first) is deleted afterwards — or, with `previous`,
    moved to `previous` the same way (the one there deleted), so that two generations are kept."""
    tmp, out = Path(tmp), Path(out)
    if not out.exists():
        tmp.rename(out)
        return
    try:
        _exchange(tmp, out)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        _log_once(f"{out.parent}: no atomic directory exchange ({e.strerror}); replacing {out.name} with renames")
        _replace_by_renames(tmp, out, previous)
        return
    if previous is None:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        move_into_place(tmp, Path(previous))


def _replace_by_renames(tmp: Path, out: Path, previous: Optional[Path]) -> None:
    """On a filesystem without RENAME_EXCHANGE (e.g. NFS): renames, with a short window in which
    `out` is missing (docs/architecture.md, "Files of a trial"). With `previous`, the old `out` is
    already whole there during that window, so a reader that falls back to it loses nothing."""
    doomed = []
    if previous is not None:
        previous = Path(previous)
        if previous.exists():
            doomed.append(previous.with_name(f".old-{previous.name}-{os.getpid()}"))
            previous.rename(doomed[-1])
        out.rename(previous)
    else:
        doomed.append(out.with_name(f".old-{out.name}-{os.getpid()}"))
        out.rename(doomed[-1])
    tmp.rename(out)
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)


_warned = set()


def _log_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def prune_leftovers(parent: Path) -> List[str]:
    """Delete the `.tmp-*` and `.old-*` directories under `parent`: the halves of a save whose
    writer was killed. Call only where no other save into `parent` is under way (one writer per
    directory: rank 0 of the trainer, or the entry point before the workers start)."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    removed = []
    for p in parent.iterdir():
        if p.name.startswith((".tmp-", ".old-")) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    if removed:
        logger.info(f"removed {len(removed)} directories left by a killed save under {parent}: {sorted(removed)}")
    return removed


def _write_hf_files(model: torch.nn.Module, tmp: Path, tokenizer_source: Optional[str]) -> None:
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer_source:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_source) / name
            if src.is_file() and not (tmp / name).exists():
                shutil.copyfile(src, tmp / name)
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors writes its file private; a checkpoint is read by others


def save_hf_dir(model: torch.nn.Module, out: Path, tokenizer_source: Optional[str]) -> Path:
    """Write an HF directory at `out` atomically (temp dir + rename)."""
    out = Path(out)
    tmp = _tmp_dir_next_to(out)
    try:
        _write_hf_files(model, tmp, tokenizer_source)
        move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def prune_versions(root: Path, keep: int, current: Optional[int] = None) -> list:
    """Delete all but the newest `keep` numeric version directories under `root`; with `current`,
    also every version after it (left by a run that was resumed from an earlier checkpoint: its
    later versions belong to steps that will be trained again)."""
    versions = sorted(int(p.name) for p in Path(root).iterdir() if p.is_dir() and p.name.isdigit())
    future = [v for v in versions if current is not None and v > current]
    versions = [v for v in versions if v not in future]
    doomed = future + (versions[:-keep] if keep > 0 else versions)
    for v in doomed:
        shutil.rmtree(Path(root) / str(v), ignore_errors=True)
    return doomed


_SAVE = re.compile(r"version(\d+)")


def prune_saves(root: Path, keep: int) -> List[int]:
    """Delete all but the newest `keep` `version<v>` save directories under `root` (0: keep all);
    returns the versions deleted."""
    root = Path(root)
    if keep <= 0 or not root.is_dir():
        return []
    versions = sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _SAVE.fullmatch(p.name)))
    doomed = versions[:-keep]
    for v in doomed:
        shutil.rmtree(root / f"version{v}", ignore_errors=True)
    if doomed:
        logger.info(f"pruned saves {doomed} under {root} (exp_ctrl.keep_last_saves={keep})")
    return doomed
