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
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, List, Optional, Sequence

_POLL_S = 0.05  # how often a call that can be cancelled or demoted looks at its clock and event
# A demoted task (one past its `demote_after`, likely stuck) runs this long of every cycle. Even
# in the idle scheduling class a task that spins costs a 2-core VM's other work ≈ 5% per task
# (measured, docs/benchmarks.md): stopped 90% of the time it costs a tenth of that, and a slow
# but honest task still finishes, ten times slower.
THROTTLE_RUN_S, THROTTLE_CYCLE_S = 0.05, 0.5


class TaskTimeout(Exception):
    """A task overran its budget; its worker was killed."""


class TaskFailed(Exception):
    """A task raised in the worker, or the worker died."""


class TaskCancelled(Exception):
    """The caller's `cancel` event was set: the task's worker was killed (or it never started)."""


class PoolClosed(Exception):
    """The pool was closed."""


def _worker_main() -> None:
    """Entry point of a pool worker: `python -c ... <spec as JSON>` (see _Worker)."""
    import importlib

    spec = json.loads(sys.argv[1])
    # A terminal's Ctrl-C reaches the whole process group: the parent decides when its pool ends
    # (it closes our stdin or kills us), not the key.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Replies go on a private copy of stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        for mod in spec["preload"]:
            importlib.import_module(mod)
        mod_name, fn_name = spec["target"].split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        if spec["initializer"]:
            mod_name, init_name = spec["initializer"].split(":")
            getattr(importlib.import_module(mod_name), init_name)(*spec["initargs"])
    except Exception as e:  # noqa: BLE001 - the parent raises it as TaskFailed, by type and message
        out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return
    # Start-up (imports above) ran at the caller's priority: a heavy import under a busy trainer
    # would otherwise take tens of seconds. From here a call that spins until it is killed takes
    # CPU only when nobody else wants it.
    if spec["nice"]:
        os.nice(spec["nice"])
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


def _import_path() -> str:
    """PYTHONPATH for a worker: the environment's, then the rest of this process's sys.path."""
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(given + [p for p in sys.path if p]))


_WORKER_CODE = "from realhf.base.hard_timeout_pool import _worker_main; _worker_main()"


class _Worker:
    def __init__(
        self,
        target: str,
        preload: Sequence[str],
        startup_timeout: float,
        nice: int = 0,
        initializer: Optional[str] = None,
        initargs: Sequence[Any] = (),
    ):
        spec = {
            "target": target,
            "nice": nice,
            "preload": list(preload),
            "initializer": initializer,
            "initargs": list(initargs),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            # The caller's import path: what it can import (a user's module it validated), the worker can.
            env={**os.environ, "PYTHONPATH": _import_path()},
        )
        self._buf = b""
        self.demoted, self._demoted_at, self._stopped = False, 0.0, False
        try:
            hello = self.read(startup_timeout)
        except EOFError:
            self.kill()
            raise TaskFailed(f"pool worker for {target!r} exited during start-up (see its stderr)") from None
        if hello is None:
            self.kill()
            raise TaskFailed(f"pool worker for {target!r} not ready after {startup_timeout:.0f} s")
        if not hello.get("ready"):
            self.kill()
            raise TaskFailed(f"pool worker for {target!r} failed to start: {hello.get('error')}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _demote(self) -> None:
        self.demoted, self._demoted_at = True, time.monotonic()
        try:
            os.sched_setscheduler(self.proc.pid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):  # not Linux, or the worker is gone: the nice level stays
            pass

    def _pause(self, stop: bool) -> None:
        if stop != self._stopped:
            try:
                os.kill(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)
                self._stopped = stop
            except OSError:  # it exited: the read sees EOF
                pass

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float, cancel: Optional[threading.Event] = None, demote_after: Optional[float] = None):
        """The next message, None after `timeout` s; EOFError if the worker is gone, TaskCancelled
        once `cancel` is set. Past `demote_after` s the worker is demoted (`self.demoted`): it
        drops to the idle scheduling class and runs THROTTLE_RUN_S of every THROTTLE_CYCLE_S,
        stopped the rest of the time."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        start = time.monotonic()
        deadline = start + timeout
        while b"\n" not in self._buf:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            if cancel is not None and cancel.is_set():
                raise TaskCancelled("cancelled by the caller")
            if demote_after is not None and not self.demoted and now - start >= demote_after:
                self._demote()
            wait = remaining if cancel is None and demote_after is None else min(remaining, _POLL_S)
            if self.demoted:
                phase = (now - self._demoted_at) % THROTTLE_CYCLE_S
                running = phase < THROTTLE_RUN_S
                self._pause(not running)
                wait = min(wait, (THROTTLE_RUN_S if running else THROTTLE_CYCLE_S) - phase)
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                continue
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
    """`n_workers` subprocesses calling `target` ("module:function") on JSON-able arguments, each
    at `nice` (0: the caller's priority; start-up runs at the caller's). Each worker imports
    `preload` and calls `initializer(*initargs)` ("module:function", JSON-able arguments) before
    its first task, within `startup_timeout` s: what a task needs loaded once is loaded there, not
    billed to the first task's timeout. With `spawn_after` > 0 a task waits that long for a busy
    worker to free up before another worker is started.

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
        nice: int = 0,
        spawn_after: float = 0.0,
        initializer: Optional[str] = None,
        initargs: Sequence[Any] = (),
    ):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.target, self.timeout, self.nice, self.spawn_after = target, timeout, nice, spawn_after
        self._preload, self._startup_timeout = tuple(preload), startup_timeout
        self._init = (initializer, tuple(initargs))
        self._slots = threading.BoundedSemaphore(n_workers)
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a worker went back to idle
        self._starting = 0  # workers being started
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
            # A worker that frees up soon beats starting one (≈ 0.3 s of CPU): only tasks that
            # keep every worker busy past `spawn_after` make the pool grow.
            if not self._idle and (self._workers or self._starting) and self.spawn_after > 0:
                self._returned.wait_for(lambda: self._idle or self._closed, timeout=self.spawn_after)
                if self._closed:
                    raise PoolClosed("the pool is closed")
            if self._idle:
                return self._idle.pop()
            self._starting += 1
        try:
            worker = _Worker(self.target, self._preload, self._startup_timeout, self.nice, *self._init)
        finally:
            with self._lock:
                self._starting -= 1
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

    def _acquire_slot(self, cancel: Optional[threading.Event]) -> None:
        if cancel is None:
            self._slots.acquire()
            return
        while not self._slots.acquire(timeout=_POLL_S):
            if cancel.is_set():
                raise TaskCancelled("cancelled while waiting for a free worker")
        if cancel.is_set():
            self._slots.release()
            raise TaskCancelled("cancelled before it started")

    def run(
        self,
        *args: Any,
        timeout: Optional[float] = None,
        cancel: Optional[threading.Event] = None,
        demote_after: Optional[float] = None,
    ) -> Any:
        """`cancel`: an event that, once set, ends the call with TaskCancelled (its worker killed,
        or the call never sent). `demote_after`: seconds after which a running call's worker
        drops to the idle scheduling class (replaced after the call: a worker cannot be raised
        back without privileges)."""
        budget = self.timeout if timeout is None else timeout
        self._acquire_slot(cancel)
        try:
            return self._run_in_slot(args, budget, cancel, demote_after)
        finally:
            self._slots.release()

    def _run_in_slot(self, args, budget: float, cancel, demote_after) -> Any:
        worker = self._acquire_worker()
        req_id = next(self._ids)
        try:
            worker.send({"id": req_id, "args": list(args)})
            reply = worker.read(budget, cancel, demote_after)
        except TaskCancelled:
            self._discard(worker)
            raise
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
            elif worker.demoted:
                self._workers.discard(worker)
                worker.kill()
            else:
                self._idle.append(worker)
                self._returned.notify()
        if reply.get("id") != req_id:
            raise TaskFailed(f"pool worker {worker.pid} answered request {reply.get('id')}, expected {req_id}")
        if not reply["ok"]:
            raise TaskFailed(reply["error"])
        return reply["result"]

    def close(self) -> None:
        """Kill every worker, including busy ones (their callers get `PoolClosed`)."""
        with self._lock:
            self._closed = True
            self._returned.notify_all()
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
