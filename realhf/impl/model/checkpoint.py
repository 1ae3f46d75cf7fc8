"""HF directories on disk: published versions for the generation servers, and saves.

Published weights (docs/architecture.md §5): `<run_dir>/published_weights/<role>/<version>/`
(the layout is `realhf.base.trial_files`'s) is a complete HF directory (config.json,
model.safetensors, tokenizer files), gathered from the trainer's shards by its engine
(`TrainEngine.save_hf`). It is written into a temporary directory next to it and renamed into
place, so a server never loads a half-written version; `prune_versions` then deletes all but the
newest `keep`.

The recovery checkpoint (sharded, all engines of a trainer) is realhf.impl.model.recover_checkpoint's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch


# Copied verbatim from the source model: training does not change the tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json",
)  # fmt: skip


def _tmp_dir_next_to(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; published weights are read by other processes
    return tmp


def move_into_place(tmp: Path, out: Path) -> None:
    if out.exists():  # e.g. a recovered run re-publishing a version: replace the old copy
        old = out.with_name(f".old-{out.name}-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def _write_hf_files(model: torch.nn.Module, tmp: Path, tokenizer_source: Optional[str]) -> None:
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer_source:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_source) / name
            if src.is_file() and not (tmp / name).exists():
                shutil.copyfile(src, tmp / name)


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
