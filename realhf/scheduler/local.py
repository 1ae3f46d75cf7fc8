"""The local launcher: every worker a subprocess on this machine, forked from a worker template
that imported what they need once (`fork_workers`; `worker_template.py`): this launch's own, or
a shared one already running (`worker_template`, its socket); or a fresh interpreter each
(`Supervisor` does the rest).

The kernel kills the workers if the launcher itself is SIGKILLed (PR_SET_PDEATHSIG); their own
children (grader pools, sandboxes) are swept by the launcher's watchdog (`watchdog.py`), which
is told the process group of every worker it starts.
"""

import os
from typing import Any, Dict, Optional

from realhf.scheduler.log_echo import log_tail  # noqa: F401 - re-exported for tests and tools
from realhf.scheduler.supervisor import Supervisor, _Proc
from realhf.scheduler.watchdog import MARKER_ENV
from realhf.scheduler.worker_process import LocalProcess
from realhf.scheduler.worker_spec import (  # noqa: F401 - the launcher's public names
    DEFAULT_WORKER_ENV,
    LauncherError,
    LauncherInterrupted,
    RedisLostError,
    WorkerFailedError,
    WorkerSpec,
)
from realhf.scheduler.worker_template import WorkerTemplate

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

    def __init__(self, *args, fork_workers: bool = True, worker_template: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.fork_workers, self.worker_template = fork_workers, worker_template
        self._template: Optional[WorkerTemplate] = None

    def start(self) -> "LocalLauncher":
        if self.fork_workers and self._template is None:
            env = {**os.environ, **DEFAULT_WORKER_ENV, MARKER_ENV: self.marker}
            if self.worker_template:
                self._template = WorkerTemplate.attach(self.worker_template, env)
            if self._template is None:
                os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
                log = os.path.join(self.log_dir, "worker_template.log")
                self._template = WorkerTemplate(env, self.launch_dir, log).start()
        super().start()
        if self._template is not None and not self._template.shared:
            self._watchdog.track(self._template.pid)  # it leads its own session (a shared one outlives the trial)
        return self

    def _new_process(self, p: _Proc, spec: WorkerSpec, config: Any, env: Dict[str, str]) -> LocalProcess:
        # A spec with an environment of its own may change what an interpreter reads at start-up
        # (PYTHONPATH, thread counts): its workers start afresh.
        template = None if spec.env else self._template
        return LocalProcess(
            p.config_path, p.log_path, {**os.environ, **env}, cwd=self.launch_dir, template=template,
            worker_type=spec.worker_class or spec.worker_type,
        )  # fmt: skip

    def _stop_cluster(self) -> None:
        if self._template is not None:
            self._template.close()

    def _process_started(self, p: _Proc) -> None:
        self._watchdog.track(p.process.pid)  # each worker leads its own session: pgid == pid

    def _process_forgotten(self, p: _Proc) -> None:
        self._watchdog.forget(p.process.pid)
