"""Whether a trial whose run just died starts again: `TrialRestarts`.

Some deaths no per-worker restart can cure: a trainer rank (its process group and optimizer state
go with it), the master (it drives the step), the node worker, or the trial's own Redis (every
worker's coordination). For those the launcher stops every process and starts the trial again
from its last recovery checkpoint, as `recover_mode=auto` would — what torchrun's
`--max-restarts` does for a job. A restart costs a launch (seconds) and the steps since the last
checkpoint; it is refused when the budget (`cluster.restart_policy.trial_restarts` within
`trial_restart_window` s) is spent, or when the same process died again before any new recovery
checkpoint was written: a crash loop, which another restart would only repeat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from realhf.api.cli_args import RestartPolicyConfig
from realhf.scheduler.worker_spec import LauncherError, RedisLostError, WorkerFailedError

# Worker types whose death ends the whole trial (the others are restarted on their own).
VITAL_TYPES = ("model_worker", "master_worker", "node_worker")


@dataclass(frozen=True)
class Death:
    who: str  # the process that died: a worker's name, or "redis"
    cause: str  # what the launcher said of it


def death_of(error: LauncherError, per_worker: RestartPolicyConfig) -> Optional[Death]:
    """The death a trial restart may cure, or None (a config error, a user's code failing the
    same way every time, a worker type restarted on its own whose budget ran out)."""
    if isinstance(error, RedisLostError):
        return Death("redis", str(error))
    if isinstance(error, WorkerFailedError) and not error.repeats:
        worker_type = error.worker.split("/")[0]
        if worker_type in VITAL_TYPES and not getattr(per_worker, worker_type, False):
            return Death(error.worker, error.reason)
    return None


class TrialRestarts:
    def __init__(self, policy: RestartPolicyConfig):
        self.max, self.window = policy.trial_restarts, policy.trial_restart_window
        self._times: List[float] = []
        self._last: Optional[Tuple[str, int]] = None  # (who died, checkpoint step) at the last restart
        self.history: List[str] = []  # "who: cause" of each restart, for the run's last line

    def refusal(self, death: Death, step: int) -> Optional[str]:
        """Why the trial must not restart after `death` with its last recovery checkpoint at
        `step` (0: none), or None — then the restart is counted."""
        if self.max == 0:
            return "cluster.restart_policy.trial_restarts=0"
        now = time.monotonic()
        if self.window > 0:
            self._times = [t for t in self._times if now - t < self.window]
        if self._last == (death.who, step):
            return (
                f"a crash loop: {death.who} died again before a new recovery checkpoint (still "
                f"{f'step {step}' if step else 'none'}); another restart would only repeat it"
            )
        if len(self._times) >= self.max:
            within = f"within {self.window:g} s" if self.window > 0 else "in this run"
            return (
                f"{len(self._times)} trial restart(s) {within} already "
                f"(cluster.restart_policy.trial_restarts={self.max}, trial_restart_window={self.window:g})"
            )
        self._times.append(now)
        self._last = (death.who, step)
        self.history.append(f"{death.who}: {death.cause}")
        return None

    def counted(self) -> str:
        """'restart k (of at most N within W s)' for the restart just allowed."""
        within = f"within {self.window:g} s" if self.window > 0 else "in the run"
        return f"trial restart {len(self.history)} (of at most {self.max} {within})"
