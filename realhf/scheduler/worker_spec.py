"""What any launcher is asked to run, and how it reports failure: launcher-neutral.

`realhf.experiments` turns a config into `WorkerSpec`s; a launcher (`scheduler/local.py`,
`scheduler/ray.py`) starts them, supervises them and raises the errors below. Nothing here knows how processes are
started.
"""

import signal
from dataclasses import dataclass, field
from typing import Any, Dict, List

# Each worker sets its own torch thread count from config; these keep numpy/BLAS from spawning
# one thread per core in every process of a small machine.
DEFAULT_WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class WorkerSpec:
    """`count` workers of one type; `configs[i]` is the config dataclass of worker i."""

    worker_type: str
    count: int
    configs: List[Any] = field(default_factory=list)
    worker_class: str = ""  # default: the built-in class of `worker_type`
    env: Dict[str, str] = field(default_factory=dict)
    echo_log: bool = False  # copy this worker's log lines to the launcher's console
    restart: bool = False  # restart a worker of this spec that dies while the trial runs
    max_restarts: int = 3  # per worker within restart_window s; one more death in the window fails the trial
    restart_window: float = 600.0  # seconds over which max_restarts is counted; 0: the whole run
    restart_backoff: float = 1.0  # seconds before restart k+1 is backoff·2^k (capped at 30 s)
    # What one worker holds on a cluster (ray.py): CPUs (its torch threads), GPUs, and whether the
    # workers of this spec are placed together as one placement group (trainer ranks, servers).
    cpus: float = 0.0
    gpus: float = 0.0
    placement_group: bool = False


class LauncherError(RuntimeError):
    pass


class WorkerFailedError(LauncherError):
    """`worker` failed; `repeats`: it said the error is one a restart would only repeat (a user's
    code failing deterministically: EXIT_DO_NOT_RESTART)."""

    def __init__(self, worker: str, reason: str, log_path: str, log_tail: str, repeats: bool = False):
        super().__init__(f"worker {worker} failed: {reason} (log: {log_path})")
        self.worker, self.reason, self.log_path, self.log_tail = worker, reason, log_path, log_tail
        self.repeats = repeats


class RedisLostError(LauncherError):
    """The trial's Redis died, cannot be reached, or lost the experiment status key: the run's
    coordination is gone, so it fails (never ends as if it had completed)."""


class LauncherInterrupted(LauncherError):
    def __init__(self, signum: int):
        super().__init__(f"launcher received {signal.Signals(signum).name}")
        self.signum = signum


class LauncherStopped(LauncherError):
    """SIGTERM/SIGINT ended the run the graceful way: the master finished its step and wrote a
    recovery checkpoint of step `step` (none when `step` is 0), and every worker exited."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"launcher received {signal.Signals(signum).name}; stopped after step {step}")
        self.signum, self.step = signum, step
