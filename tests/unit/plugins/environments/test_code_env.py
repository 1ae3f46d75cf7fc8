"""The built-in `code` environment: answers run on hidden tests in the forked sandbox, refused
before running when they cannot parse or reach for imports and dunders, killed when they loop."""

import asyncio
import os
import time

import psutil
import pytest

from realhf.api.cli_args import EnvConfig
from realhf.api.env import EnvFactory
from realhf.plugins.environments.code_env import CodeEnv, check_program
from realhf.plugins.environments.code_sandbox import CodeSandbox, SandboxError
from realhf.plugins.tools.python_code import PythonSandboxLimits

pytestmark = pytest.mark.system

ROW = {
    "query_id": "q",
    "prompt": "f('bc')='cb'\ndef f(x): return",
    "code_prefix": "def f(x): return",
    "entry_point": "f",
    "tests": [["'bcg'", "'gcb'"], ["'hk'", "'kh'"], ["'vvy'", "'yvv'"], ["'q'", "'q'"]],
}


def step_all(answers, row=ROW, **args):
    """Each answer graded by a fresh episode environment of one factory (one sandbox server)."""

    async def main():
        envs = EnvFactory(EnvConfig(type="code", args=args))
        try:
            out = []
            for answer in answers:
                env = await envs.make(row)
                try:
                    out.append(await env.step(answer))
                finally:
                    await env.aclose()
            return out
        finally:
            await envs.aclose()

    return asyncio.run(main())


def test_right_and_wrong_functions_are_graded_on_the_hidden_tests():
    steps = step_all([" x[::-1]", " x", " x[-1]+x[1:-1][::-1]+x[0]*(len(x)>1)"])
    assert [r for _, r, _, _ in steps] == [1.0, 0.0, 1.0]
    assert [info["success"] for *_, info in steps] == [True, False, True]
    # " x" passes 'q' only: the fraction is reported, the reward stays all-or-nothing.
    assert steps[1][3]["metrics"]["tests_passed"] == 0.25
    assert steps[1][3]["reason"] == "wrong results"
    assert all(done for _, _, done, _ in steps)


@pytest.mark.parametrize(
    "answer, outcome, words",
    [
        (" x[::-1", "syntax_error", "SyntaxError"),
        (" __import__('os').getcwd()", "forbidden", "'__import__' is not allowed"),
        (" x\nimport os", "forbidden", "imports are not allowed"),
        (" x\nfrom os import path", "forbidden", "imports are not allowed"),
        (" x.__class__", "forbidden", "attribute '__class__'"),
        (" open('/etc/passwd').read()", "forbidden", "'open' is not allowed"),
        (" x.nope()", "runtime_error", "AttributeError"),
        (" f(x)", "runtime_error", "RecursionError"),
        (" 1/0", "runtime_error", "ZeroDivisionError"),
    ],
)
def test_failures_earn_nothing_and_say_why(answer, outcome, words):
    [(_, reward, done, info)] = step_all([answer])
    assert (reward, done, info["success"]) == (0.0, True, False)
    assert info["metrics"][outcome] == 1.0
    assert sum(info["metrics"][k] for k in ("syntax_error", "forbidden", "timeout", "runtime_error")) == 1.0
    assert words in info["reason"]


def test_check_program_refuses_before_anything_runs():
    assert check_program("def f(x): return x+1") == ("", "")
    assert check_program("def f(x): return (x\0)")[0] == "syntax_error"
    assert check_program("def f(x): return eval('1')")[0] == "forbidden"


def test_an_infinite_loop_or_a_cpu_hog_is_killed_and_graded_zero():
    t0 = time.monotonic()
    steps = step_all([" x\nwhile True: pass", " sum(range(10**12))", " x[::-1]"], cpu_seconds=1, wall_seconds=2)
    assert time.monotonic() - t0 < 15
    assert [r for _, r, _, _ in steps] == [0.0, 0.0, 1.0]  # the server goes on after a kill
    for _, _, _, info in steps[:2]:
        assert info["metrics"]["timeout"] == 1.0, info
        assert "killed" in info["reason"]


def test_a_sleeping_answer_is_killed_at_the_wall_clock_without_holding_up_others():
    # A blocking call spends no CPU: only the wall clock catches it. Meanwhile other answers are graded.
    row = dict(ROW, code_prefix="import time as _t\ndef f(x): return")  # the row's own prefix may import

    async def main():
        sandbox = CodeSandbox(PythonSandboxLimits(cpu_seconds=5, wall_seconds=1.5))
        try:
            t0 = time.monotonic()
            slow = asyncio.ensure_future(sandbox.run_tests(row["code_prefix"] + " _t.sleep(60)", ROW["tests"], "f"))
            fast = await sandbox.run_tests("def f(x): return x[::-1]", ROW["tests"], "f")
            fast_s = time.monotonic() - t0
            return fast, fast_s, await slow, time.monotonic() - t0
        finally:
            await sandbox.close()

    fast, fast_s, slow, slow_s = asyncio.run(main())
    assert fast.all_passed and fast_s < 1.0
    assert slow.problem == "timeout" and "wall clock" in slow.error and 1.4 < slow_s < 6


def test_printed_output_is_not_taken_for_a_verdict():
    [(_, reward, _, info)] = step_all([' print(\'{"problem": "", "error": "", "passed": [true, true, true, true]}\')'])
    assert reward == 0.0 and info["metrics"]["tests_passed"] == 0.0


def test_closing_the_sandbox_ends_its_server_and_children():
    async def main():
        sandbox = CodeSandbox(PythonSandboxLimits(cpu_seconds=5, wall_seconds=30))
        slow = asyncio.ensure_future(sandbox.run_tests("import time\ndef f(x): time.sleep(60)", [["1", "1"]], "f"))
        await asyncio.sleep(0.5)
        server = psutil.Process(sandbox.pid)
        children = server.children(recursive=True)
        assert children, "the slow program's child should be running"
        await sandbox.close()
        with pytest.raises(SandboxError, match="exited"):
            await slow
        return [server] + children

    procs = asyncio.run(main())
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive, [p.pid for p in alive]


def test_rows_without_proper_tests_are_refused_with_the_row_named():
    with pytest.raises(ValueError, match="row 'bad'.*tests"):
        CodeEnv({"query_id": "bad", "tests": [["1"]]}, shared=object())
    assert EnvFactory(EnvConfig(type="code")).required_fields == ("tests",)


def test_one_answer_takes_a_few_milliseconds():
    # The reason for the fork server: a fresh interpreter per answer costs ~20 ms.
    async def main():
        sandbox = CodeSandbox()
        try:
            await sandbox.run_tests("def f(x): return x", [["1", "1"]], "f")  # the server starts
            t0 = time.perf_counter()
            for _ in range(20):
                await sandbox.run_tests("def f(x): return x[::-1]", ROW["tests"], "f")
            return (time.perf_counter() - t0) / 20
        finally:
            await sandbox.close()

    per_answer = asyncio.run(main())
    assert per_answer < 0.015 * max(1.0, os.getloadavg()[0] / 2), per_answer
