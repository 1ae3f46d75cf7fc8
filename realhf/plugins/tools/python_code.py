"""The built-in `python` tool: run a model's Python code in a fresh, resource-limited process and
give back what it printed, or a clear reason why it did not finish.

Each call starts `python -I -S -X utf8 -c CODE` (isolated mode, standard library only) in a new
session, with an empty environment apart from PATH/LANG/HOME/TMPDIR, a fresh scratch directory as
its working directory (deleted afterwards), stdin at EOF, and rlimits set before the code runs:
CPU time, address space, file size, no core dumps, and a process cap. A wall-clock limit SIGKILLs
the whole process group; so does cancelling the call (an episode's timeout), and so does the main
process ending, so nothing the code started outlives the call. stdout and stderr are each cut to
a number of characters (head and tail kept), and reading them never holds more than that.

THIS IS NOT A SECURITY BOUNDARY. It keeps buggy or runaway code (infinite loops, huge allocations,
fork loops, floods of output) from hurting the worker; it does not contain hostile code. The code
runs as the same user as the worker, sees the same filesystem (it may read and write anything that
user can), and has the network. The process cap is RLIMIT_NPROC, which the kernel counts per user
(processes and threads together) and ignores entirely for root; it is therefore set to the user's
current count plus `max_processes`, a brake on fork loops rather than an exact quota, and no brake
at all when the worker runs as root. For untrusted code, run workers in a container or VM.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass, fields
from typing import Dict, Optional, Tuple

import psutil

from realhf.api.tools import Tool, tool

# Linux refuses a single exec argument longer than this (MAX_ARG_STRLEN) with a bare E2BIG.
MAX_CODE_BYTES = 128 * 1024 - 1
_READ_CHUNK = 64 * 1024
# After the main process is gone and its group killed, the pipes close at once; only a process
# that left the group (setsid) can hold them open longer, and we stop waiting for it after this.
_DRAIN_SECONDS = 2.0
_REAP_SECONDS = 5.0
# Spawning, draining and deleting the scratch directory come on top of the sandbox's own wall
# clock; the Tool's timeout leaves room for them so the sandbox's clearer error is the one seen.
_TOOL_TIMEOUT_MARGIN = 5.0


# The child sets its own limits, then runs the code: no preexec_fn, whose Python code would run
# between fork and exec of a multi-threaded worker (where a lock held by another thread at the
# fork can deadlock the child).
_PROLOGUE = """\
import json as _json, resource as _resource, sys as _sys
for _res, _value in _json.loads(_sys.argv[1]):
    _resource.setrlimit(_res, tuple(_value))
_code = _sys.argv[2]
del _sys.argv[1:]
exec(compile(_code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


class PythonError(Exception):
    """The code did not finish normally; the message says why and shows its output."""


@dataclass(frozen=True)
class PythonSandboxLimits:
    cpu_seconds: float = 5  # CPU time (RLIMIT_CPU, rounded up to whole seconds)
    memory_mb: int = 512  # address space (RLIMIT_AS), so a bit more than the memory actually used
    wall_seconds: float = 10  # wall-clock time before the process group is killed
    output_chars: int = 4000  # per stream (stdout, stderr)
    file_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    max_processes: int = 32  # processes/threads on top of the user's current count (RLIMIT_NPROC)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PythonSandboxLimits.{f.name} must be a positive number, got {value!r}")


def _environment(scratch: str) -> Dict[str, str]:
    # Nothing of the worker's environment (tokens, proxies, CUDA settings) is passed on. PYTHON*
    # variables would be ignored under -I anyway, hence -X utf8 rather than PYTHONIOENCODING.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch}


def _user_task_count() -> int:
    """Processes and threads of this user, which is what the kernel compares with RLIMIT_NPROC."""
    uid, count = os.getuid(), 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        uids, threads = p.info["uids"], p.info["num_threads"]
        if uids is not None and uids.real == uid:
            count += threads or 1
    return count


def _rlimits(limits: PythonSandboxLimits, user_tasks: int) -> Dict[int, Tuple[int, int]]:
    cpu = math.ceil(limits.cpu_seconds)
    wanted = {
        # SIGXCPU at the soft limit; SIGKILL a second later if the code catches SIGXCPU.
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (limits.memory_mb * 2**20,) * 2,
        resource.RLIMIT_FSIZE: (limits.file_mb * 2**20,) * 2,
        resource.RLIMIT_CORE: (0, 0),  # SIGXCPU would otherwise dump core into the scratch directory
        resource.RLIMIT_NPROC: (user_tasks + limits.max_processes,) * 2,
    }
    # A worker already running under lower hard limits cannot raise them (setrlimit would fail in
    # the child, before exec, with an unhelpful error), so the lower one wins.
    out = {}
    for res, (soft, hard) in wanted.items():
        current_hard = resource.getrlimit(res)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        out[res] = (soft, hard)
    return out


class _Capture:
    """Up to `limit` characters of a stream: its head and its tail (a traceback's last line is
    the one that matters), with how much was cut in between."""

    def __init__(self, limit: int):
        self.head_limit, self.tail_limit = limit - limit // 2, limit // 2
        self.head, self.tail, self.total = "", "", 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False):
        text = self._decoder.decode(data, final)
        self.total += len(text)
        if len(self.head) < self.head_limit:
            take = self.head_limit - len(self.head)
            self.head, text = self.head + text[:take], text[take:]
        if text and self.tail_limit:
            self.tail = (self.tail + text)[-self.tail_limit :]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return self.head + self.tail
        return f"{self.head}\n[... {cut} characters truncated ...]\n{self.tail}"


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Also tells when the main process has exited: `Process.wait()` waits for the pipes to close
    as well, which a background process the code started would delay until the wall clock."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=_READ_CHUNK, loop=loop)
        self.exited = loop.create_future()

    def process_exited(self):
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _pump(stream: asyncio.StreamReader, capture: _Capture):
    while True:
        data = await stream.read(_READ_CHUNK)
        if not data:
            capture.feed(b"", final=True)
            return
        capture.feed(data)


def _kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _outcome(returncode: int, timed_out: bool, stderr: str, limits: PythonSandboxLimits) -> Optional[str]:
    """Why the code did not finish normally, or None if it did."""
    if timed_out:
        return f"the code timed out after {limits.wall_seconds:g}s (wall clock) and was killed"
    if returncode == 0:
        return None
    last_line = stderr.rstrip().rsplit("\n", 1)[-1]
    if last_line.startswith("MemoryError"):
        return f"the code ran out of memory (limit {limits.memory_mb} MiB)"
    if returncode == -signal.SIGXCPU:
        return f"the code exceeded the CPU-time limit of {math.ceil(limits.cpu_seconds)}s and was killed"
    if returncode == -signal.SIGKILL:
        return (
            f"the code was killed by SIGKILL (the hard CPU-time limit of {math.ceil(limits.cpu_seconds) + 1}s, "
            f"or the machine ran out of memory)"
        )
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the code was killed by {name}"
    return f"the code exited with code {returncode}"


def _report(stdout: str, stderr: str) -> str:
    parts = []
    if stdout:
        parts.append(stdout)
    if stderr:
        parts.append(f"[stderr]\n{stderr}")
    return "\n".join(parts)


async def run_python(code: str, limits: PythonSandboxLimits = PythonSandboxLimits()) -> str:
    """Run `code` in a fresh limited process; its stdout (and stderr, labelled) if it ends with
    exit code 0, else a PythonError saying why, with the output so far."""
    if not isinstance(code, str):
        raise ValueError(f"code must be a string, got {type(code).__name__}")
    if "\0" in code:
        raise ValueError("the code contains a NUL character")
    if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
        raise ValueError(f"the code is longer than {MAX_CODE_BYTES} bytes")
    rlimits = _rlimits(limits, await asyncio.to_thread(_user_task_count))
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="realhf-python-", ignore_cleanup_errors=True) as scratch:
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(loop),
            sys.executable,
            "-I",
            "-S",
            "-X",
            "utf8",
            "-c",
            _PROLOGUE,
            json.dumps([[int(res), list(value)] for res, value in rlimits.items()]),
            code,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=scratch,
            env=_environment(scratch),
            start_new_session=True,
        )
        pid = transport.get_pid()
        out, err = _Capture(limits.output_chars), _Capture(limits.output_chars)
        pumps = [asyncio.ensure_future(_pump(protocol.stdout, out)), asyncio.ensure_future(_pump(protocol.stderr, err))]
        timed_out = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(protocol.exited), limits.wall_seconds)
            except asyncio.TimeoutError:
                timed_out = True
            # Whatever the code started dies with it, which also closes the pipes those hold.
            _kill_group(pid)
            try:
                await asyncio.wait_for(asyncio.shield(protocol.exited), _REAP_SECONDS)
            except asyncio.TimeoutError:
                raise PythonError(f"the code's process {pid} had not exited {_REAP_SECONDS:g}s after SIGKILL") from None
            # Only a process that left the group (setsid) can keep a pipe open now; its output is lost.
            await asyncio.wait(pumps, timeout=_DRAIN_SECONDS)
        finally:
            if transport.get_returncode() is None:  # cancelled (an episode's timeout), or failed above
                # Kill synchronously, so the child dies even if this wait is interrupted too.
                _kill_group(pid)
                try:
                    await asyncio.wait_for(asyncio.shield(protocol.exited), _REAP_SECONDS)
                except asyncio.TimeoutError:
                    pass  # SIGKILLed; asyncio's child watcher reaps it when it is gone
            for p in pumps:
                p.cancel()
            transport.close()
        returncode = transport.get_returncode()

    stdout, stderr = out.text(), err.text()
    problem = _outcome(returncode, timed_out, stderr, limits)
    if problem is not None:
        output = _report(stdout, stderr)
        raise PythonError(problem + (f"\n{output}" if output else ""))
    return _report(stdout, stderr) or "(the code printed nothing; print() the values you want to see)"


def make_python_tool(limits: PythonSandboxLimits = PythonSandboxLimits()) -> Tool:
    """The `python` Tool with these limits (told to the model in its description)."""

    async def python(code: str) -> str:
        """Run a Python 3 program in a fresh process and return what it printed (stdout, then
        stderr). Only the standard library is available, nothing persists between calls, and
        input() gets end-of-file; print() the values you want to see.

        Args:
            code: the complete Python program to run
        """
        return await run_python(code, limits)

    t = tool(python, name="python", timeout=limits.wall_seconds + _TOOL_TIMEOUT_MARGIN)
    t.description += (
        f" Limits: {math.ceil(limits.cpu_seconds)}s CPU, {limits.wall_seconds:g}s wall clock, "
        f"{limits.memory_mb} MiB memory, {limits.output_chars} characters of output per stream."
    )
    return t


PYTHON_TOOL = make_python_tool()
