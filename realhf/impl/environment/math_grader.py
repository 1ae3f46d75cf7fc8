"""Math answer grading: answer extraction, exact numeric comparison, and math-verify behind a
process pool with a hard per-task timeout.

Why a process pool of our own: math-verify bounds its work with `signal.alarm`, which raises
`ValueError` outside the main thread, and its timeout exception derives from `BaseException`,
so neither threads nor `concurrent.futures` pools can bound a pathological expression. Each
worker here is a subprocess that runs one check at a time; when a check overruns, the worker is
SIGKILLed and a fresh one takes its place on the next task. Messages are JSON lines on the
worker's stdin/stdout, so nothing is unpickled.

Plain numbers on both sides (the tiny task's `#### 3`) are compared exactly in this process and
never reach the pool.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, List, Optional, Sequence

logger = logging.getLogger("realhf.math_grader")

DEFAULT_VERIFY_TARGET = "realhf.impl.environment.math_grader:verify_equivalent"

# --------------------------------------------------------------------------------------------
# Answer extraction and exact numbers
# --------------------------------------------------------------------------------------------

# A minus sign counts only where it cannot be a subtraction ("5-2" has no "-2").
_NUMBER = re.compile(r"(?:(?<![\w.)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?(?!\d)")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:/\d+)?")


def _last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` whose braces balance (nesting allowed)."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


_WORK_LINE = re.compile(r"(?<![\d.])(\d+)\s*([+\-*])\s*(\d+)\s*=\s*(-?\d+)(?![\d.])")


def work_lines_correct(text: str) -> bool:
    """True when every integer equation `a+b=c`, `a-b=c` or `a*b=c` written in `text` holds (and
    when there is none). Only whole integers count: `1.5+2=3.5` is not checked."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return all(ops[op](int(a), int(b)) == int(c) for a, op, b, c in _WORK_LINE.findall(text))


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a solution: the last `\\boxed{...}`, else the rest of the line after the
    first `####`, else the last number in the text; None if there is none."""
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    m = re.search(r"####[ \t]*([^\n]*)", text)
    if m:
        ans = m.group(1).strip().rstrip(".").strip()
        if ans:
            return ans
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def parse_number(s: str) -> Optional[Fraction]:
    """An exact value for a plain number ("3", "03", "-2.50", "1,000", "1/2", "$3$"), else None."""
    s = s.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    if s.endswith("."):
        s = s[:-1]
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):  # "1/0"
        return None


def numbers_equal(a: str, b: str) -> Optional[bool]:
    """Exact numeric equality when both are plain numbers; None when either is not."""
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return None
    return x == y


def verify_equivalent(pred: str, ref: str) -> bool:
    """math-verify's equivalence check. Runs inside a pool worker: no timeouts of its own (they
    rely on signals); the pool kills the worker instead."""
    from math_verify import parse, verify

    def _parse(s: str) -> list:
        # The answer span is already extracted: boxing it makes math-verify read all of it
        # (bare "1+x^2" would be read as "1", bare "x^2+1" not at all).
        out = parse(f"\\boxed{{{s}}}", parsing_timeout=None)
        return out or parse(s, parsing_timeout=None)

    gold, answer = _parse(ref), _parse(pred)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=None))


# --------------------------------------------------------------------------------------------
# A process pool whose tasks can be killed
# --------------------------------------------------------------------------------------------


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
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeouts disabled" is on purpose
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


_WORKER_CODE = "from realhf.impl.environment.math_grader import _worker_main; _worker_main()"


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


# --------------------------------------------------------------------------------------------
# The grader
# --------------------------------------------------------------------------------------------


class MathGrader:
    """Does a generated solution reach the reference answer?

        with MathGrader() as g:
            g.grade("... #### 3", [" 5-2=3\\n#### 3"])  # True, without touching the pool

    A check that math-verify cannot finish within `timeout` s counts as wrong.
    """

    def __init__(
        self,
        n_workers: int = 2,
        timeout: float = 5.0,
        verify_target: str = DEFAULT_VERIFY_TARGET,
        preload: Sequence[str] = ("math_verify",),
    ):
        # math_verify imports sympy (~1 s): preloaded at worker start so it is not billed to
        # the first task's timeout.
        self._pool = HardTimeoutPool(verify_target, n_workers=n_workers, timeout=timeout, preload=preload)
        self._n_workers = n_workers
        self._executor: Optional[ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.n_timeouts = 0
        self.n_errors = 0

    @property
    def pool(self) -> HardTimeoutPool:
        return self._pool

    @staticmethod
    def _fast_verdict(pred: str, refs: Sequence[str]) -> Optional[bool]:
        """True/False when every comparison is number-to-number; None if math-verify is needed."""
        undecided = False
        for ref in refs:
            same = numbers_equal(pred, ref)
            if same:
                return True
            undecided = undecided or same is None
        return None if undecided else False

    @staticmethod
    def _references(solutions: Sequence[str]) -> List[str]:
        # A solution without a recognisable final answer is taken as the answer itself.
        return [extract_answer(s) or s.strip() for s in solutions]

    def _verify(self, pred: str, refs: Sequence[str]) -> bool:
        for ref in refs:
            same = numbers_equal(pred, ref)
            if same:
                return True
            if same is False:
                continue
            try:
                if self._pool.run(pred, ref):
                    return True
            except TaskTimeout as e:
                with self._stats_lock:
                    self.n_timeouts += 1
                logger.warning("math-verify timed out, graded as wrong: %s", e)
            except TaskFailed as e:
                with self._stats_lock:
                    self.n_errors += 1
                logger.warning("math-verify failed, graded as wrong: %s", e)
        return False

    def grade(self, text: str, solutions: Sequence[str]) -> bool:
        pred = extract_answer(text)
        if pred is None:
            return False
        refs = self._references(solutions)
        fast = self._fast_verdict(pred, refs)
        return fast if fast is not None else self._verify(pred, refs)

    async def agrade(self, text: str, solutions: Sequence[str]) -> bool:
        pred = extract_answer(text)
        if pred is None:
            return False
        refs = self._references(solutions)
        fast = self._fast_verdict(pred, refs)
        if fast is not None:
            return fast
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._get_executor(), self._verify, pred, refs)

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                # One thread per worker: more would only queue on the pool's semaphore.
                self._executor = ThreadPoolExecutor(self._n_workers, thread_name_prefix="math-grader")
            return self._executor

    def close(self) -> None:
        self._pool.close()
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
