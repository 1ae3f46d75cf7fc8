"""The launcher's side of the worker template (`realhf/apps/worker_template.py`, which says why):
start one for this launch, or attach to a shared one; ask it to fork a worker, learn when one
exits.

`WorkerTemplate.fork` returns a `ForkedWorker` that answers what `LocalProcess` asks of a
`subprocess.Popen` (pid, poll, wait), or None when the template cannot fork (it failed to start
or died): the launcher then starts that worker with a fresh interpreter, as without a template.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, Optional

import msgpack

from realhf.base import logging
from realhf.base.process import die_with_parent

logger = logging.getLogger("launcher")

# The realhf this launcher runs: a shared template that imported another copy (a clone beside an
# installed package) cannot serve it.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# The template's command line is padded so that a forked worker has room to write its own over it
# (realhf.base.process.set_command_line).
TITLE_ROOM = 4096


class ForkedWorker:
    """A worker the template forked: `subprocess.Popen`'s pid, poll and wait (and `warm_s`, the
    seconds the template spent importing its type's modules first: 0 once they were)."""

    def __init__(self, template: "WorkerTemplate", pid: int, warm_s: float = 0.0):
        self.template, self.pid, self.warm_s = template, pid, warm_s

    def poll(self) -> Optional[int]:
        return self.template.exit_code(self.pid, timeout=0)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self.template.exit_code(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
        return code


class WorkerTemplate:
    """One template process for one launch of a trial. `start()` returns at once; a `fork` waits
    up to `ready_timeout` s for the template, which imports a built-in worker type's modules
    before its first worker of that type."""

    def __init__(self, env: Dict[str, str], cwd: str, log_path: str, ready_timeout: float = 120.0):
        self.env, self.cwd, self.log_path, self.ready_timeout = env, cwd, log_path, ready_timeout
        self.address = ""  # a shared template's socket (attach); empty: this launch's own
        self._proc: Optional[subprocess.Popen] = None
        self._pid = 0
        self._channel: Optional[socket.socket] = None
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._ready = False
        self._dead = ""  # why the template cannot fork (empty while it can)
        self._replies: Dict[int, dict] = {}
        self._exits: Dict[int, int] = {}
        self._children: set = set()
        self._next_id = 0

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else self._pid

    @property
    def shared(self) -> bool:
        return bool(self.address)

    @classmethod
    def attach(cls, address: str, env: Dict[str, str], timeout: float = 30.0) -> Optional["WorkerTemplate"]:
        """The shared template listening on `address`, if it answers within `timeout` s and takes
        this launch (same Python, same start-up environment `env`, unchanged code); else None,
        logged with why (the launcher then starts a template of its own). Its forks are waited
        for as a launch's own template's are (`ready_timeout`): it may be importing for another
        launch first."""
        template = cls(env, os.getcwd(), address)
        template.address = address
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.settimeout(None)
            hello = {"op": "hello", "python": sys.executable, "env": env, "package": PACKAGE_DIR}
            sock.sendall(msgpack.packb(hello))
        except OSError as e:
            sock.close()
            logger.warning(
                f"worker template: no shared template answers on {address} ({e}); starting one for this launch"
            )
            return None
        template._channel = sock
        threading.Thread(target=template._read, name="worker-template", daemon=True).start()
        with template._cond:
            template._cond.wait_for(lambda: template._ready or template._dead, timeout)
            why = template._dead or ("" if template._ready else f"it did not answer within {timeout:.0f}s")
        if why:
            template.close()
            logger.warning(
                f"worker template: the shared one on {address} cannot serve this launch: {why}; starting one for this launch"
            )
            return None
        logger.info(f"worker template: forking workers from the shared template on {address} (pid {template.pid})")
        return template

    def start(self) -> "WorkerTemplate":
        ours, theirs = socket.socketpair()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "realhf.apps.worker_template", str(theirs.fileno()), os.path.dirname(self.log_path),
                 " " * TITLE_ROOM],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                env=self.env, cwd=self.cwd, start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        theirs.close()
        self._channel = ours
        threading.Thread(target=self._read, name="worker-template", daemon=True).start()
        return self

    def _read(self) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            try:
                data = self._channel.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            unpacker.feed(data)
            with self._cond:
                for msg in unpacker:
                    if msg["op"] == "ready":
                        self._ready, self._pid = True, msg.get("pid", 0)
                    elif msg["op"] == "refused" and msg["id"] == 0:  # a shared template turned this launch away
                        self._dead = msg["error"]
                    elif msg["op"] == "exited":
                        self._exits[msg["pid"]] = msg["code"]
                    else:
                        self._replies[msg["id"]] = msg
                self._cond.notify_all()
        with self._cond:
            if self._proc is not None:
                self._dead = self._dead or f"it ended (exit code {self._proc.poll()}; log {self.log_path})"
            else:
                self._dead = self._dead or f"the shared template on {self.address} closed the connection"
            # Its children die with it (PR_SET_PDEATHSIG), or with the connection (a shared one
            # kills a gone launcher's workers): those it had not reported are SIGKILLed.
            for pid in self._children:
                self._exits.setdefault(pid, -9)
            self._cond.notify_all()

    def fork(
        self, worker_type: str, config_path: str, log_path: str, banner: str, env: Dict[str, str], cwd: str, python: str
    ):
        """A ForkedWorker running `python -m realhf.apps.remote worker --config config_path`, or
        None (logged) when the template cannot fork it: then start it another way. `worker_type`
        (a built-in type, or a user's `module:Class`) says what the template imports first."""
        deadline = time.monotonic() + self.ready_timeout
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._dead, max(0.0, deadline - time.monotonic())):
                self._dead = f"it was not ready within {self.ready_timeout:.0f}s (log {self.log_path})"
                logger.warning(f"worker template: {self._dead}; workers start with a fresh interpreter")
                self._abandon()  # never asked again
            if self._dead:
                return None
            self._next_id += 1
            rid = self._next_id
        request = {"op": "fork", "id": rid, "worker_type": worker_type, "config": config_path, "log": log_path}
        request["banner"] = banner
        request.update(env=env, cwd=cwd, python=python)
        try:
            with self._send_lock:
                self._channel.sendall(msgpack.packb(request))
        except OSError as e:
            with self._cond:
                self._dead = self._dead or f"its channel failed ({e})"
            return None
        with self._cond:
            # The first worker of a type waits for its imports (seconds; minutes on a starved host).
            answered = self._cond.wait_for(lambda: rid in self._replies or self._dead, self.ready_timeout)
            reply = self._replies.pop(rid, None)
            if not answered:
                self._dead = f"it did not answer within {self.ready_timeout:.0f}s (log {self.log_path})"
            if reply is None or reply["op"] != "forked":
                why = reply["error"] if reply else self._dead
                logger.warning(f"worker template could not fork {config_path}: {why}; starting it afresh")
                if not answered:  # a fork it makes after all must not run beside the fresh worker
                    self._abandon()
                return None
            self._children.add(reply["pid"])
        if reply["warm_s"] > 0.05:
            logger.info(f"worker template (pid {self.pid}) imported {worker_type}'s modules in {reply['warm_s']:.1f}s")
        return ForkedWorker(self, reply["pid"], reply["warm_s"])

    def exit_code(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        """The exit code of forked worker `pid`, waiting up to `timeout` s for it (None: forever)."""
        with self._cond:
            if timeout == 0:
                return self._exits.get(pid)
            self._cond.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)

    def _abandon(self) -> None:
        """Ask nothing of it again: this launch's own is killed (its children with it), a shared
        one loses this launch's connection (it kills the workers it forked for it)."""
        if self._proc is not None:
            self._proc.kill()
        else:
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self, timeout: float = 5.0) -> None:
        """After the launcher stopped the workers: this launch's own template kills what is
        left of its children and exits; a shared one does the same for this launch's workers,
        and serves on."""
        if self._channel is None:
            return
        self._shutdown()
        if self._proc is None:
            self._channel.close()
            return
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=timeout)
        self._channel.close()
