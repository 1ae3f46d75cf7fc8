"""The `python` tool against real subprocesses: output, tracebacks, each limit (CPU, wall clock,
memory, file size, output), the empty environment, the scratch directory's removal, and that
neither cancellation nor a finished main process leaves anything it started running."""

import ast
import asyncio
import os
import time
import uuid

import psutil
import pytest

from realhf.api.tools import load_tool
from realhf.plugins.tools.python_code import PYTHON_TOOL, PythonSandboxLimits, make_python_tool, run_python

pytestmark = pytest.mark.system


def call(code: str, **limits):
    t = make_python_tool(PythonSandboxLimits(**limits)) if limits else PYTHON_TOOL
    return asyncio.run(t.call({"code": code}))


def alive_with(marker: str):
    """Live (not zombie) processes whose command line contains `marker`."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def marker() -> str:
    return f"realhf_sandbox_test_{uuid.uuid4().hex}"


def test_the_tool_is_the_builtin_python_and_leaves_room_for_the_sandbox_clock():
    assert load_tool("python") is PYTHON_TOOL
    assert PYTHON_TOOL.name == "python"
    assert PYTHON_TOOL.parameters["required"] == ["code"]
    assert PYTHON_TOOL.timeout > PythonSandboxLimits().wall_seconds
    assert "512 MiB" in PYTHON_TOOL.schema()["function"]["description"]


def test_prints_come_back():
    r = call("x = 6 * 7\nprint('answer', x)")
    assert (r.error, r.content) == (False, "answer 42\n")


def test_stderr_is_labelled_and_silence_is_explained():
    r = call("import sys\nprint('out')\nprint('warn', file=sys.stderr)")
    assert (r.error, r.content) == (False, "out\n\n[stderr]\nwarn\n")
    r = call("x = 1")
    assert not r.error and "printed nothing" in r.content


def test_an_exception_comes_back_as_an_error_with_its_traceback():
    r = call("print('before')\ndef f():\n    return 1 / 0\nf()")
    assert r.error
    assert "exited with code 1" in r.content
    assert "before" in r.content and "Traceback" in r.content and "ZeroDivisionError: division by zero" in r.content


def test_stdin_is_at_end_of_file():
    r = call("input()")
    assert r.error and "EOFError" in r.content


def test_an_infinite_loop_hits_the_cpu_limit():
    start = time.monotonic()
    r = call("while True:\n    pass", cpu_seconds=1, wall_seconds=15)
    assert r.error and "exceeded the CPU-time limit of 1s" in r.content, r.content
    assert time.monotonic() - start < 10


def test_sleeping_hits_the_wall_clock_limit():
    start = time.monotonic()
    r = call("import time\nprint('started', flush=True)\ntime.sleep(100)", wall_seconds=1)
    assert r.error and "timed out after 1s (wall clock)" in r.content, r.content
    assert "started" in r.content  # what it printed before is kept
    assert time.monotonic() - start < 6


def test_a_huge_allocation_runs_out_of_memory():
    r = call("b = bytearray(4 * 1024 ** 3)", memory_mb=256)
    assert r.error and "ran out of memory (limit 256 MiB)" in r.content, r.content


def test_writing_a_big_file_hits_the_file_size_limit():
    r = call("open('big', 'wb').write(b'x' * (3 * 1024 ** 2))", file_mb=1)
    assert r.error and "File too large" in r.content, r.content


def test_the_limits_are_set_in_the_child():
    code = (
        "import resource as r\n"
        "for n in ('CPU', 'AS', 'FSIZE', 'CORE', 'NPROC'):\n"
        "    print(n, *r.getrlimit(getattr(r, 'RLIMIT_' + n)))"
    )
    r = call(code, cpu_seconds=2, memory_mb=300, file_mb=3, max_processes=7)
    got = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in r.content.splitlines()}
    assert got["CPU"] == (2, 3)
    assert got["AS"] == (300 * 2**20,) * 2
    assert got["FSIZE"] == (3 * 2**20,) * 2
    assert got["CORE"] == (0, 0)
    # Per user: the user's processes and threads now, plus the allowance.
    assert got["NPROC"][0] == got["NPROC"][1] and 7 < got["NPROC"][0] < 10**6


def test_the_parents_environment_is_not_passed_on(monkeypatch):
    monkeypatch.setenv("REALHF_SANDBOX_SECRET", "hunter2")
    r = call("import os\nprint(sorted(os.environ))\nprint(os.environ.get('REALHF_SANDBOX_SECRET'))")
    assert not r.error
    names, secret = r.content.splitlines()
    assert secret == "None" and "hunter2" not in r.content
    assert ast.literal_eval(names) == ["HOME", "LANG", "PATH", "TMPDIR"]


def test_the_scratch_directory_is_the_cwd_and_is_removed_afterwards():
    r = call("import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())")
    assert not r.error
    scratch = r.content.strip()
    assert os.path.basename(scratch).startswith("realhf-python-")
    assert not os.path.exists(scratch)

    r = call("import os, time\nprint(os.getcwd(), flush=True)\ntime.sleep(100)", wall_seconds=1)
    assert r.error
    scratch = r.content.splitlines()[1]
    assert not os.path.exists(scratch)


def test_output_is_truncated_keeping_head_and_tail():
    r = call("print('START' + 'a' * 10000 + 'END')", output_chars=100)
    assert not r.error
    assert r.content.startswith("START") and r.content.rstrip().endswith("END")
    assert "characters truncated" in r.content and len(r.content) < 200


def test_a_flood_of_output_is_truncated_and_stopped_by_the_wall_clock():
    r = call("while True:\n    print('x' * 1000)", wall_seconds=1, output_chars=300)
    assert r.error and "timed out after 1s" in r.content
    assert "characters truncated" in r.content and len(r.content) < 600


def test_cancelling_the_call_kills_the_child():
    m = marker()

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(PYTHON_TOOL.call({"code": f"import time  # {m}\ntime.sleep(100)"}), 1.0)

    asyncio.run(main())
    assert alive_with(m) == []


def test_cancelling_the_call_kills_what_the_code_started():
    m = marker()
    code = (
        f"import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)  # {m}'])\n"
        f"time.sleep(100)  # {m}"
    )

    async def main():
        task = asyncio.ensure_future(PYTHON_TOOL.call({"code": code}))
        for _ in range(100):  # until both processes run
            await asyncio.sleep(0.05)
            if len(alive_with(m)) == 2:
                break
        assert len(alive_with(m)) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 3  # the grandchild is not ours to reap; SIGKILL takes a moment
    while alive_with(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_with(m) == []


def test_a_background_process_does_not_outlive_or_hold_up_the_call():
    m = marker()
    code = (
        f"import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)  # {m}'])\n"
        f"print('done')"
    )
    start = time.monotonic()
    r = call(code, wall_seconds=10)
    assert (r.error, r.content) == (False, "done\n")
    assert time.monotonic() - start < 5
    deadline = time.monotonic() + 3
    while alive_with(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_with(m) == []


def test_calls_run_concurrently_in_one_event_loop():
    async def main():
        return await asyncio.gather(*(run_python(f"import time\ntime.sleep(1)\nprint({i})") for i in range(4)))

    start = time.monotonic()
    assert asyncio.run(main()) == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - start < 3.5


@pytest.mark.parametrize(
    "bad", [dict(cpu_seconds=0), dict(memory_mb=-1), dict(wall_seconds="10"), dict(output_chars=True)]
)
def test_bad_limits_are_named(bad):
    with pytest.raises(ValueError, match=f"PythonSandboxLimits.{next(iter(bad))}"):
        PythonSandboxLimits(**bad)


def test_bad_code_gets_a_clear_error():
    assert "NUL character" in call("print(1)\0").content
    assert "longer than" in call("#" * 200_000).content
