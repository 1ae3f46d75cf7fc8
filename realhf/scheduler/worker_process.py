"""One worker process on the machine it runs on: start it, poll it, stop it with its children.

Every launcher starts a worker the same way — `python -m realhf.apps.remote worker --config F`,
its output appended to its log file, in a session of its own (so its process group holds its
children), killed by the kernel if its parent dies (PR_SET_PDEATHSIG). The local launcher
holds a `LocalProcess` per worker, forked from its worker template where it has one
(`worker_template.py`: the same process, without the imports); the Ray launcher holds one inside
a Ray actor on the worker's node (`ray.py`), so what the supervisor asks of a worker is answered
by this one class.
"""

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import psutil

from realhf.base.process import die_with_parent, process_tree
from realhf.scheduler.worker_template import WorkerTemplate

WORKER_COMMAND = ["-m", "realhf.apps.remote", "worker", "--config"]


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a worker's process group (each worker leads its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class LocalProcess:
    """A worker process on this machine. `start()` may be called again after it died (restart)."""

    def __init__(
        self,
        config_path: str,
        log_path: str,
        env: Dict[str, str],
        python: str = sys.executable,
        cwd: Optional[str] = None,
        template: Optional[WorkerTemplate] = None,
        worker_type: str = "",
    ):
        self.config_path, self.log_path, self.env, self.python, self.cwd = config_path, log_path, env, python, cwd
        self.template, self.worker_type = template, worker_type
        self._popen = None  # a subprocess.Popen, or a ForkedWorker: both have pid, poll and wait
        self._stopping: List[psutil.Process] = []

    def start(self, banner: str = "") -> int:
        """Start the worker (appending `banner` to its log first); returns its pid."""
        if self.template is not None and self.python == sys.executable:
            self._popen = self.template.fork(
                self.worker_type,
                self.config_path,
                self.log_path,
                banner,
                self.env,
                self.cwd or os.getcwd(),
                self.python,
            )
            if self._popen is not None:
                return self._popen.pid
        with open(self.log_path, "ab") as log:
            if banner:
                log.write(banner.encode())
                log.flush()
            self._popen = subprocess.Popen(
                [self.python, *WORKER_COMMAND, self.config_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        return self._popen.pid

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> Optional[int]:
        return self._popen.poll()

    def paused(self) -> Optional[bool]:
        """Whether the process is stopped (SIGSTOP); None if that cannot be told."""
        try:
            return psutil.Process(self.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except psutil.Error:
            return None

    def kill_tree(self) -> Optional[int]:
        """SIGKILL the process and its descendants now and reap it; returns its exit code."""
        tree = process_tree(self.pid)
        for proc in tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=3)
        kill_group(self.pid)
        try:
            return self._popen.wait(timeout=3)
        except subprocess.TimeoutExpired:
            return None

    def kill_leftovers(self) -> None:
        """After the worker died: what it left in its process group."""
        kill_group(self.pid)

    def begin_stop(self) -> None:
        """SIGTERM the worker's group (and SIGCONT: a paused worker must see it now). Its
        descendants are listed first: once the worker exits they are re-parented and can no
        longer be found through it."""
        if self._popen is None or self._popen.poll() is not None:
            return
        self._stopping = process_tree(self.pid)
        try:
            os.killpg(self.pid, signal.SIGTERM)
            os.killpg(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def end_stop(self, deadline: float) -> List[int]:
        """Wait until `deadline` (time.monotonic) for what begin_stop signalled, SIGKILL the
        rest; returns the pids that had to be killed."""
        killed = []
        _, alive = psutil.wait_procs(self._stopping, timeout=max(0.0, deadline - time.monotonic()))
        for proc in alive:
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=3)
        self._stopping = []
        if self._popen is not None:
            kill_group(self.pid)  # orphans of a worker that died earlier
        return killed

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
