"""A process pool whose tasks can be killed: `HardTimeoutPool` runs "module:function" on JSON-able
arguments in subprocesses and bounds every call by a hard timeout.

Why not threads or `concurrent.futures`: a pure-Python function stuck in a pathological input
cannot be interrupted from another thread, and libraries that bound their own work with
`signal.alarm` (math-verify, sympy-based checkers) raise outside the main thread. Each worker
here is a subprocess that runs one call at a time; when a call overruns, the worker is SIGKILLed
and a fresh one takes its place on the next task. Messages are JSON lines on the worker's
stdin/stdout, so nothing is unpickled.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, List, Optional, Sequence


class TaskTimeout(Exception):
    """A task overran its budget; its worker was killed."""


class TaskFailed(Exception):
    """A task raised in the worker, or the worker died."""


class PoolClosed(Exception):
    """The pool was closed."""


def _worker_main() -> None:
    """Entry point of a pool worker: `python -c ... <module:function> [preload modules...]`."""
    import importlib

    target, preload = sys.argv[1], sys.argv[2:]
    # Replies go on a private copy of stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for mod in preload:
        importlib.import_module(mod)
    mod_name, fn_name = target.split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:  # EOF: the parent closed the pipe or died
        req = json.loads(line)
        try:
            line = json.dumps({"id": req["id"], "ok": True, "result": fn(*req["args"])})
        except Exception as e:  # noqa: BLE001 - reported to the caller, the worker lives on
            line = json.dumps({"id": req["id"], "ok": False, "error": f"{type(e).__name__}: {e}"})
        out.write(line + "\n")
        out.flush()


_WORKER_CODE = "from realhf.base.hard_timeout_pool import _worker_main; _worker_main()"


class _Worker:
    def __init__(self, target: str, preload: Sequence[str], startup_timeout: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE, target, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._buf = b""
        try:
            hello = self.read(startup_timeout)
        except EOFError:
            self.kill()
            raise TaskFailed(f"pool worker for {target!r} exited during start-up (see its stderr)") from None
        if hello is None or not hello.get("ready"):
            self.kill()
            raise TaskFailed(f"pool worker for {target!r} not ready after {startup_timeout:.0f} s")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float) -> Optional[dict]:
        """The next message, None after `timeout` s; EOFError if the worker is gone."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # broken pipe on flush
                    pass


def _kill_all(workers: "set[_Worker]") -> None:
    for w in list(workers):
        w.kill()
    workers.clear()


class HardTimeoutPool:
    """`n_workers` subprocesses calling `target` ("module:function") on JSON-able arguments.

    `run(*args)` blocks while all workers are busy, then returns the function's result, or
    raises `TaskTimeout` (the worker was killed and will be replaced), `TaskFailed`, or
    `PoolClosed`. Workers start lazily, so a pool that is never used costs nothing.
    """

    def __init__(
        self,
        target: str,
        n_workers: int = 2,
        timeout: float = 5.0,
        preload: Sequence[str] = (),
        startup_timeout: float = 60.0,
    ):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.target, self.timeout = target, timeout
        self._preload, self._startup_timeout = tuple(preload), startup_timeout
        self._slots = threading.BoundedSemaphore(n_workers)
        self._lock = threading.Lock()
        self._idle: List[_Worker] = []
        self._workers: "set[_Worker]" = set()
        self._ids = itertools.count()
        self._closed = False
        self.n_started = 0
        self.n_timeouts = 0
        # Even if close() is forgotten, no worker outlives the pool object or the interpreter.
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    def worker_pids(self) -> List[int]:
        with self._lock:
            return [w.pid for w in self._workers]

    def _acquire_worker(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise PoolClosed("the pool is closed")
            if self._idle:
                return self._idle.pop()
        worker = _Worker(self.target, self._preload, self._startup_timeout)
        with self._lock:
            if self._closed:
                worker.kill()
                raise PoolClosed("the pool is closed")
            self._workers.add(worker)
            self.n_started += 1
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)

    def run(self, *args: Any, timeout: Optional[float] = None) -> Any:
        budget = self.timeout if timeout is None else timeout
        with self._slots:
            worker = self._acquire_worker()
            req_id = next(self._ids)
            try:
                worker.send({"id": req_id, "args": list(args)})
                reply = worker.read(budget)
            except (EOFError, OSError, ValueError):
                self._discard(worker)
                if self._closed:
                    raise PoolClosed("the pool was closed during the task") from None
                raise TaskFailed(f"pool worker {worker.pid} died during {self.target}{tuple(args)!r}") from None
            if reply is None:
                self._discard(worker)
                with self._lock:
                    self.n_timeouts += 1
                raise TaskTimeout(f"{self.target}{tuple(args)!r} overran {budget:g} s; worker {worker.pid} killed")
            with self._lock:
                if self._closed:
                    worker.kill()
                else:
                    self._idle.append(worker)
            if reply.get("id") != req_id:
                raise TaskFailed(f"pool worker {worker.pid} answered request {reply.get('id')}, expected {req_id}")
            if not reply["ok"]:
                raise TaskFailed(reply["error"])
            return reply["result"]

    def close(self) -> None:
        """Kill every worker, including busy ones (their callers get `PoolClosed`)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = [w for w in self._workers if w not in idle]
            self._workers.clear()
        for w in idle:
            w.kill()
        for w in busy:
            # Only the process: its pipes belong to the thread running the task, which sees EOF
            # and closes them. Waiting here reaps it, so no zombie outlives close().
            w.proc.kill()
            w.proc.wait()
