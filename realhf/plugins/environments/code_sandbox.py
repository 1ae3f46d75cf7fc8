"""Run a program's function on test calls, one forked, resource-limited process per program, from
one long-lived sandbox server per rollout worker.

    sandbox = CodeSandbox(PythonSandboxLimits(cpu_seconds=1, wall_seconds=2, memory_mb=256))
    verdict = await sandbox.run_tests("def f(x): return x+1", [["1", "2"], ["5", "6"]], "f")
    verdict.passed        # [True, True]; verdict.problem: why nothing could be tested, else ""
    await sandbox.close()

Why a server and not `run_python` (realhf/plugins/tools/python_code.py) per answer: starting a fresh
interpreter costs ~20 ms of CPU (measured on the 2-core machine), and a training step of the
embedded code task grades 128 answers, which would cost more than the step's training. The server
(`python -I -S`, standard library only, an empty environment, a scratch working directory) is
started once and forks a child per program (~1 ms). The child starts a session of its own, sends
its stdin/stdout/stderr to /dev/null, sets the same rlimits as `run_python` (CPU, address space,
file size, no core, process cap), runs the program and each test call, and writes the verdict to
a pipe of its own, so nothing the program prints can be taken for a verdict. The server kills a
child's process group at the wall-clock limit, and handles many children at once, so one slow
program does not hold up the others. The server exits when its stdin closes (the worker ended,
however it ended), killing the children it still has.

Arguments and expected results are Python literals (`ast.literal_eval`); a test passes when the
call returns a value equal to the expected one.

THIS IS NOT A SECURITY BOUNDARY, for the reasons `run_python`'s docstring gives; the code
environment also refuses programs that import or reach for dunder attributes before they get here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from realhf.plugins.tools.python_code import PythonSandboxLimits, _environment, _rlimits, _user_task_count

# Past the wall-clock limit the server itself kills the child; this is only for a server that
# stopped answering.
_REPLY_MARGIN_S = 10.0
_CLOSE_TIMEOUT_S = 5.0

_SERVER = r"""
import ast, json, os, resource, select, signal, sys, time
LIMITS = json.loads(sys.argv[1])
WALL = float(sys.argv[2])
children = {}  # result pipe fd -> [pid, request id, deadline, chunks]

def verdict(req):
    ns = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    try:
        exec(compile(req["program"], "<answer>", "exec"), ns)
    except BaseException as e:
        return {"problem": "error", "error": f"{type(e).__name__}: {e}"[:300], "passed": []}
    fn = ns.get(req["entry_point"])
    if not callable(fn):
        return {"problem": "error", "error": f"the program defines no function {req['entry_point']}", "passed": []}
    passed, error = [], ""
    for arg, want in req["tests"]:
        try:
            passed.append(bool(fn(ast.literal_eval(arg)) == ast.literal_eval(want)))
        except BaseException as e:
            passed.append(False)
            error = error or f"{type(e).__name__}: {e}"[:300]
    return {"problem": "", "error": error, "passed": passed}

def reply(obj):
    os.write(1, (json.dumps(obj) + "\n").encode())

def spawn(req):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            for res, value in LIMITS:
                resource.setrlimit(res, tuple(value))
            data = json.dumps(verdict(req)).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    children[r] = [pid, req["id"], time.monotonic() + WALL, []]

def finish(fd, timed_out):
    pid, rid, _, chunks = children.pop(fd)
    os.close(fd)
    try:
        os.killpg(pid, signal.SIGKILL)  # the child's session, whatever state it is in
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        out = {"problem": "timeout", "error": f"killed after {WALL:g}s (wall clock)", "passed": []}
    elif chunks:
        try:
            out = json.loads(b"".join(chunks))
        except ValueError:
            out = {"problem": "error", "error": "the verdict was cut off", "passed": []}
    elif os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
        out = {"problem": "timeout", "error": f"killed by {signal.Signals(os.WTERMSIG(status)).name} (CPU-time limit)", "passed": []}
    else:
        out = {"problem": "error", "error": f"the process ended without a verdict (status {status})", "passed": []}
    out["id"] = rid
    reply(out)

pending = b""
while True:
    deadline = min((c[2] for c in children.values()), default=None)
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([0] + list(children), [], [], wait)
    for fd in ready:
        if fd == 0:
            data = os.read(0, 65536)
            if not data:  # the client is gone: no verdicts, no children left behind
                for pid, *_ in children.values():
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    os.waitpid(pid, 0)
                sys.exit(0)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                spawn(json.loads(line))
        else:
            chunk = os.read(fd, 65536)
            if chunk:
                children[fd][3].append(chunk)
            else:
                finish(fd, False)
    now = time.monotonic()
    for fd, c in list(children.items()):
        if c[2] <= now:
            finish(fd, True)
"""


class SandboxError(RuntimeError):
    """The sandbox server failed (not the program under test: that is a verdict)."""


@dataclass
class Verdict:
    passed: List[bool] = field(default_factory=list)  # one per test, in order
    problem: str = ""  # "" (the tests ran), "timeout" or "error" (nothing could be tested)
    error: str = ""  # the first exception, or why the program was killed

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


# A function of the embedded task takes microseconds: a second of CPU is generous.
DEFAULT_LIMITS = PythonSandboxLimits(cpu_seconds=1, wall_seconds=2, memory_mb=256)


class CodeSandbox:
    """One sandbox server process, started at the first `run_tests` in the calling event loop."""

    def __init__(self, limits: PythonSandboxLimits = DEFAULT_LIMITS):
        self.limits = limits
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._scratch: Optional[tempfile.TemporaryDirectory] = None
        self._reader: Optional[asyncio.Task] = None
        self._waiting: Dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lock: Optional[asyncio.Lock] = None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    async def _start(self) -> asyncio.subprocess.Process:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._proc is None or self._proc.returncode is not None:
                rlimits = _rlimits(self.limits, await asyncio.to_thread(_user_task_count))
                self._scratch = self._scratch or tempfile.TemporaryDirectory(prefix="realhf-code-")
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    "-S",
                    "-X",
                    "utf8",
                    "-c",
                    _SERVER,
                    json.dumps([[int(res), list(value)] for res, value in rlimits.items()]),
                    str(self.limits.wall_seconds),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    cwd=self._scratch.name,
                    env=_environment(self._scratch.name),
                    limit=2**20,
                )
                self._reader = asyncio.ensure_future(self._read(self._proc))
            return self._proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            reply = json.loads(line)
            fut = self._waiting.pop(reply.pop("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        code = await proc.wait()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(SandboxError(f"the code sandbox server (pid {proc.pid}) exited with code {code}"))
        self._waiting.clear()

    async def run_tests(self, program: str, tests: Sequence[Sequence[str]], entry_point: str) -> Verdict:
        """The verdict of `entry_point(arg) == expected` for each (arg, expected) literal pair."""
        proc = await self._start()
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        request = {"id": rid, "program": program, "tests": [list(t) for t in tests], "entry_point": entry_point}
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            await proc.stdin.drain()
            timeout = self.limits.wall_seconds + _REPLY_MARGIN_S
            try:
                reply = await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise SandboxError(
                    f"the code sandbox server (pid {proc.pid}) gave no verdict for request {rid} within {timeout:g}s"
                ) from None
        except (BrokenPipeError, ConnectionResetError) as e:
            raise SandboxError(f"the code sandbox server (pid {proc.pid}) is gone: {e}") from None
        finally:
            self._waiting.pop(rid, None)
        return Verdict(passed=list(reply["passed"]), problem=reply["problem"], error=reply["error"])

    async def close(self) -> None:
        """Stop the server (closing its stdin: it kills its children and exits)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), _CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
