"""Which published versions the evaluator evaluates, and holding on to them until it has.

The trainer publishes version v as `published_weights/<role>/<v>/` and then deletes all but the
newest `keep_last_versions` (`realhf.impl.model.checkpoint.prune_versions`). An evaluation takes
longer than a train step, so the evaluator cannot read a version where it was published: the
moment a version due for evaluation is seen, `take_version` hard-links its files into the
evaluator's own directory (one `os.link` per file: no bytes copied, and the link keeps the file
alive after the trainer deletes its published name).

`EvalSchedule` is the rule, with no I/O: the versions due are the multiples of N
(`exp_ctrl.eval_freq_steps`; version = completed train steps). A due version seen while an
evaluation runs waits; when the evaluator is free it evaluates the newest waiting version and
skips the older ones, so evaluations never fall behind training — the skipped ones are reported,
never silently lost.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional


def take_version(published: Path, dest: Path) -> bool:
    """Hard-link every file of the published directory `published` into `dest` (built under a
    `.tmp-` name and renamed, so `dest` is whole when it exists). False when the trainer pruned
    the version before or while it was taken: nothing is left behind then."""
    published, dest = Path(published), Path(dest)
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        names = sorted(p.name for p in published.iterdir() if p.is_file())
        tmp.mkdir(parents=True)
        for name in names:
            os.link(published / name, tmp / name)
        # A listing taken while the prune was deleting files would be partial: the directory
        # must still hold the same files after the links are made.
        whole = "config.json" in names and sorted(p.name for p in published.iterdir() if p.is_file()) == names
    except FileNotFoundError:
        whole = False
    if not whole:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    shutil.rmtree(dest, ignore_errors=True)  # left by an earlier incarnation of the evaluator
    os.rename(tmp, dest)
    return True


def release_version(dest: Path) -> None:
    """Drop a taken version (its links; the trainer's files are unaffected)."""
    shutil.rmtree(dest, ignore_errors=True)


@dataclass
class Pick:
    """What to evaluate now: `version`, and the due versions skipped since the last evaluation
    (`skipped`; never taken, pruned before they were, or taken but superseded). `release`: taken
    versions to drop without evaluating."""

    version: int
    skipped: List[int] = field(default_factory=list)
    release: List[int] = field(default_factory=list)


class EvalSchedule:
    """The versions due every `every` versions, after `evaluated` (the last one evaluated:
    0 at the start of a run, the last row of the run's eval metrics after a restart or resume)."""

    def __init__(self, every: int, evaluated: int = 0):
        if every < 1:
            raise ValueError(f"eval every {every} versions: must be >= 1")
        self.every = every
        self.evaluated = evaluated
        self.last_taken = evaluated
        self.waiting: List[int] = []  # taken, not evaluated yet; oldest first

    def to_take(self, version: int) -> Optional[int]:
        """Seeing the trainer at `version`: the version to take now (the newest due one not
        taken yet), or None."""
        due = version // self.every * self.every
        return due if due > self.last_taken else None

    def took(self, version: int, ok: bool) -> None:
        """`version` was taken (`ok`), or vanished before it could be (it is never tried again)."""
        self.last_taken = max(self.last_taken, version)
        if ok:
            self.waiting.append(version)

    def next(self) -> Optional[Pick]:
        """The evaluation to run now that the evaluator is free: the newest waiting version."""
        if not self.waiting:
            return None
        version = self.waiting[-1]
        pick = Pick(version, list(range(self.evaluated + self.every, version, self.every)), self.waiting[:-1])
        self.evaluated, self.waiting = version, []
        return pick
