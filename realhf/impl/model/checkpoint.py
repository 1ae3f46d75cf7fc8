"""Weights on disk: published versions for the generation servers, saves, and recovery state.

Published weights (docs/architecture.md §5): `<run_dir>/published_weights/<role>/<version>/`
(the layout is `realhf.base.trial_files`'s) is a complete HF directory (config.json, model.safetensors, tokenizer files). It is written into a temporary
directory next to it and renamed into place, so a server never loads a half-written version;
all but the newest `keep` versions are then deleted.

Recovery state (`save_recover_state` / `load_recover_state`): the HF weights plus optimizer,
LR-schedule and RNG state and the version, written the same atomic way. These files are only
ever read from local disk by the process that wrote them (torch.load with weights_only=True).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from realhf.base.trial_files import published_weights_dir

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


def publish_weights(model: torch.nn.Module, run_dir: str, role: str, version: int,
                    tokenizer_source: Optional[str], keep: int = 2) -> Path:
    """Write version `version` of `role`'s published weights atomically and prune older versions."""
    root = published_weights_dir(run_dir, role)
    out = save_hf_dir(model, root / str(int(version)), tokenizer_source)
    prune_versions(root, keep, current=int(version))
    return out


# ---- recovery ----------------------------------------------------------------------------------

_STATE_FILE = "trainer_state.pt"
_META_FILE = "recover_info.json"


def save_recover_state(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       lr_scheduler: Any, version: int, tokenizer_source: Optional[str],
                       extra: Optional[Dict[str, Any]] = None) -> Path:
    out = Path(out)
    tmp = _tmp_dir_next_to(out)
    try:
        _write_hf_files(model, tmp, tokenizer_source)
        torch.save({
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }, tmp / _STATE_FILE)  # fmt: skip
        (tmp / _META_FILE).write_text(json.dumps({**(extra or {}), "version": int(version)}))
        move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_recover_info(path: Path) -> Optional[Dict[str, Any]]:
    """The metadata of the recovery checkpoint at `path` (version, step, counters…), None if there is none."""
    if not has_recover_state(path):
        return None
    return json.loads((Path(path) / _META_FILE).read_text())


def has_recover_state(path: Path) -> bool:
    return (Path(path) / _META_FILE).is_file() and (Path(path) / _STATE_FILE).is_file()


def load_recover_state(path: Path, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> Dict[str, Any]:
    """Restore optimizer, schedule and RNG state (the weights are loaded from `path` as an HF
    directory by the caller); returns the metadata, including `version`."""
    path = Path(path)
    state = torch.load(path / _STATE_FILE, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    if lr_scheduler is not None and state["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    torch.set_rng_state(state["torch_rng"])
    py = state["python_rng"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    return json.loads((path / _META_FILE).read_text())
