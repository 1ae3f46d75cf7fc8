"""The local launcher: every worker a subprocess on this machine (`Supervisor` does the rest).

The kernel kills the workers if the launcher itself is SIGKILLed (PR_SET_PDEATHSIG); their own
children (grader pools, sandboxes) are swept by the launcher's watchdog (`watchdog.py`), which
is told the process group of every worker it starts.
"""

import os
from typing import Any, Dict

from realhf.scheduler.log_echo import log_tail  # noqa: F401 - re-exported for tests and tools
from realhf.scheduler.supervisor import Supervisor, _Proc
from realhf.scheduler.worker_process import LocalProcess
from realhf.scheduler.worker_spec import (  # noqa: F401 - the launcher's public names
    LauncherError,
    LauncherInterrupted,
    RedisLostError,
    WorkerFailedError,
    WorkerSpec,
)

__all__ = [
    "LauncherError",
    "LauncherInterrupted",
    "LocalLauncher",
    "RedisLostError",
    "WorkerFailedError",
    "WorkerSpec",
    "log_tail",
]


class LocalLauncher(Supervisor):
    launcher_name = "local"

    def _new_process(self, p: _Proc, spec: WorkerSpec, config: Any, env: Dict[str, str]) -> LocalProcess:
        return LocalProcess(p.config_path, p.log_path, {**os.environ, **env}, cwd=self.launch_dir)

    def _process_started(self, p: _Proc) -> None:
        self._watchdog.track(p.process.pid)  # each worker leads its own session: pgid == pid

    def _process_forgotten(self, p: _Proc) -> None:
        self._watchdog.forget(p.process.pid)
