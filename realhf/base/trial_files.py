"""Where one trial's files live, and the readers of the ones other tools look at.

Everything a run writes goes under `cluster.fileroot` (docs/architecture.md §11):

    logs/<experiment>/<trial>/        <type>-<index>.log, configs/, metrics.jsonl, accuracy.json,
                                      completions.jsonl (stats.log_completions > 0)
    runs/<experiment>/<trial>/        the run directory:
        published_weights/<role>/<v>/   weights the generation servers load (HF dir, atomic rename)
        checkpoints/<role>/version<v>/  saves (exp_ctrl.save_freq_steps and the final one)
        recover/<role>/                 the newest recovery checkpoint (replaced atomically)
        recover.prev/<role>/            the one before it, the fallback should the newest be damaged
    locks/<experiment>/<trial>.lock   held by the live run of the trial (realhf.base.trial_lock);
                                      outside the two directories above, which overwrite=true deletes

Workers are handed the run directory; these functions are the only place that knows the names
below it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class TrialFiles:
    """The two directories of one trial under `fileroot`, and its lock file."""

    fileroot: str
    experiment: str
    trial: str

    @property
    def log_dir(self) -> str:
        return os.path.join(os.path.abspath(self.fileroot), "logs", self.experiment, self.trial)

    @property
    def run_dir(self) -> str:
        return os.path.join(os.path.abspath(self.fileroot), "runs", self.experiment, self.trial)

    @property
    def metrics_path(self) -> str:
        return metrics_path(self.log_dir)

    @property
    def lock_path(self) -> str:
        # Not under log_dir or run_dir: deleting those (overwrite=true) must never delete the lock.
        return os.path.join(os.path.abspath(self.fileroot), "locks", self.experiment, f"{self.trial}.lock")


def metrics_path(log_dir: str) -> str:
    """One JSON object per completed train step, written by the master."""
    return os.path.join(log_dir, "metrics.jsonl")


def completions_path(log_dir: str) -> str:
    """A few decoded samples per train step (`stats.log_completions`), one JSON object each with
    its step, written by the master (realhf.system.stats.completion_log)."""
    return os.path.join(log_dir, "completions.jsonl")


def read_completions(log_dir: str) -> List[dict]:
    """The rows of `completions.jsonl` under `log_dir` ([] when none were logged)."""
    path = completions_path(str(log_dir))
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_metrics(log_dir: str) -> List[dict]:
    """The rows of `metrics.jsonl` under `log_dir` ([] before the first step)."""
    path = metrics_path(str(log_dir))
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def published_weights_dir(run_dir: str, role: str = "actor") -> Path:
    """Where a role's published versions live: `<run_dir>/published_weights/<role>/<version>/`."""
    return Path(run_dir) / "published_weights" / role


def published_version_dir(run_dir: str, role: str, version: int) -> Path:
    return published_weights_dir(run_dir, role) / str(int(version))


def latest_published(weights_dir: str, at_most: Optional[int] = None) -> Tuple[Optional[str], int]:
    """The newest complete version (a directory with a config.json; versions appear by rename, so
    a present one is whole) under `weights_dir`, no newer than `at_most`; (None, 0) if none."""
    try:
        found = sorted((int(d) for d in os.listdir(weights_dir) if d.isdigit()), reverse=True)
    except FileNotFoundError:
        return None, 0
    for v in found:
        path = os.path.join(weights_dir, str(v))
        if (at_most is None or v <= at_most) and os.path.isfile(os.path.join(path, "config.json")):
            return path, v
    return None, 0


def checkpoints_dir(run_dir: str, role: str = "actor") -> Path:
    """Where saves go: `<run_dir>/checkpoints/<role>/version<v>/`."""
    return Path(run_dir) / "checkpoints" / role


def recover_dir(run_dir: str) -> Path:
    """Where the trainer's newest recovery checkpoint lives (replaced each time; the layout is
    realhf.impl.model.recover_checkpoint's)."""
    return Path(run_dir) / "recover"


def recover_prev_dir(run_dir: str) -> Path:
    """The recovery checkpoint before the newest, kept whole as the one to resume from should the
    newest be damaged."""
    return previous_dir(recover_dir(run_dir))


def previous_dir(path: Path) -> Path:
    """Where the directory at `path` is kept once a newer one replaces it: `<path>.prev`."""
    path = Path(path)
    return path.with_name(f"{path.name}.prev")
