"""A generation server in a child process of its own (SGLang's, or realhf's server around vLLM):
started in its own session (so the whole tree can be killed) with PR_SET_PDEATHSIG (so it dies
with its parent), its output in a log file, healthy once /health answers, within a timeout whose
error names the URL and shows the log's tail, and stopped by killing its process tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional

from realhf.base import logging
from realhf.base.process import die_with_parent, kill_process_trees, session_members

logger = logging.getLogger("server_process")


class ServerLaunchError(RuntimeError):
    pass


def _log_tail(path: str, n_lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 32 * 1024))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n_lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def http_healthy(url: str, timeout: float, headers: Optional[Dict[str, str]] = None) -> bool:
    try:
        request = urllib.request.Request(f"{url}/health", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ServerProcess:
    """A generation server in a child process, healthy once `start()` returns."""

    def __init__(
        self,
        command: List[str],
        url: str,
        log_path: str,
        startup_timeout: float = 600.0,
        health_timeout: float = 5.0,
        env: Optional[Dict[str, str]] = None,
        poll_interval: float = 0.5,
        headers: Optional[Dict[str, str]] = None,
    ):
        self.command, self.url, self.log_path = command, url, log_path
        self.headers = headers or {}  # the run's Authorization header
        self.startup_timeout, self.health_timeout, self.poll_interval = startup_timeout, health_timeout, poll_interval
        self.env = env
        self.popen: Optional[subprocess.Popen] = None
        self._log = None

    def start(self) -> "ServerProcess":
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.update(self.env or {})
        logger.info(f"starting {self.url}: {' '.join(self.command)} (log: {self.log_path})")
        self.popen = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        while True:
            code = self.popen.poll()
            if code is not None:
                raise ServerLaunchError(
                    f"generation server {self.url} exited with code {code} before /health answered; "
                    f"last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if http_healthy(self.url, self.health_timeout, self.headers):
                logger.info(f"{self.url} healthy after {time.monotonic() - t0:.1f}s (pid {self.popen.pid})")
                return
            if time.monotonic() > deadline:
                raise ServerLaunchError(
                    f"timed out after {self.startup_timeout:.0f}s waiting for {self.url}/health "
                    f"(pid {self.popen.pid}); last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(self.poll_interval)

    def exit_code(self) -> Optional[int]:
        return None if self.popen is None else self.popen.poll()

    def log_tail(self, n_lines: int = 30) -> str:
        return _log_tail(self.log_path, n_lines)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the whole process tree, SIGKILL what is left after `timeout`. Idempotent.
        The server's session too: when the server itself was killed, its children (vLLM's engine
        core) are orphans no longer in its tree."""
        if self.popen is not None:
            left = kill_process_trees([self.popen.pid, *session_members(self.popen.pid)], timeout=timeout)
            if left:
                logger.error(f"{self.url}: could not kill pids {[p.pid for p in left]}")
            try:  # children whose parent already died are no longer in its tree, but in its group
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
