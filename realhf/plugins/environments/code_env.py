"""The `code` environment: runs the answer's function on the row's hidden tests in the sandbox.

    env = CodeEnv(row, shared=sandbox)          # one per episode; the sandbox server is shared
    _, reward, done, info = await env.step(" x[::-1]")      # 1.0: every hidden test passed

The program is the row's `code_prefix` (e.g. "def f(x): return", the prompt's last line) followed
by the answer; `tests` are (argument, expected result) Python literals, `entry_point` the
function's name (default "f"). One sandboxed process per answer runs all its tests
(realhf.plugins.environments.code_sandbox).

The reward is all-or-nothing: 1.0 when every hidden test passes, else 0.0. A fraction would pay
for functions that are right on some inputs by accident (`max(x)` for `x[-1]` on a sorted list,
`x*2` for `x+2` at 2), which is the shortcut the task is there to rule out; the fraction is still
reported (`info["metrics"]["tests_passed"]`).

Before anything runs, the program is parsed: a syntax error, an import, a call of a name in
`FORBIDDEN_NAMES` or an attribute with a leading underscore earns 0.0 without running. That
keeps a model from wandering into the file system, not a hostile one out (see the sandbox's
docstring). `info["metrics"]` says which of these happened (numbers only, so they reach the
training metrics as `agent/<name>`), `info["reason"]` says it in words.
"""

from __future__ import annotations

import ast
from typing import Any, Dict, Tuple

from realhf.api.env import Environment, register_env
from realhf.plugins.environments.code_sandbox import DEFAULT_LIMITS, CodeSandbox
from realhf.plugins.tools.python_code import PythonSandboxLimits

FORBIDDEN_NAMES = frozenset(
    {
        "__import__", "open", "exec", "eval", "compile", "globals", "locals", "vars", "getattr",
        "setattr", "delattr", "input", "breakpoint", "exit", "quit", "help", "memoryview",
    }
)  # fmt: skip
OUTCOMES = ("syntax_error", "forbidden", "timeout", "runtime_error")  # the metrics of a failed answer


def check_program(program: str) -> Tuple[str, str]:
    """("", "") when `program` may run, else (its OUTCOMES entry, why)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL character
        return "syntax_error", f"SyntaxError: {e}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return "forbidden", f"line {node.lineno}: imports are not allowed"
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return "forbidden", f"line {node.lineno}: {node.id!r} is not allowed"
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return "forbidden", f"line {node.lineno}: attribute {node.attr!r} is not allowed"
    return "", ""


@register_env("code")
class CodeEnv(Environment):
    required_fields = ("tests",)

    def __init__(self, row: Dict[str, Any], *, shared: Any = None, config: Any = None, **kwargs: Any):
        super().__init__(row, shared=shared, config=config)
        self.tests = [list(t) for t in row["tests"]]
        bad = [t for t in self.tests if len(t) != 2 or not all(isinstance(x, str) for x in t)]
        if not self.tests or bad:
            raise ValueError(
                f"code env: row {row.get('query_id', '?')!r}: `tests` must be a non-empty list of "
                f"[argument, expected] Python literals as strings, got {row['tests']!r:.200}"
            )
        self.prefix = str(row.get("code_prefix", ""))
        self.entry_point = str(row.get("entry_point", "f"))
        self._own_sandbox = shared is None  # made alone (a test, a script): a server of its own
        if self._own_sandbox:
            self.shared = self.open_shared(config, **kwargs)

    @classmethod
    def open_shared(
        cls,
        config: Any,
        cpu_seconds: float = DEFAULT_LIMITS.cpu_seconds,
        wall_seconds: float = DEFAULT_LIMITS.wall_seconds,
        memory_mb: int = DEFAULT_LIMITS.memory_mb,
        **kwargs: Any,
    ) -> CodeSandbox:
        # `rollout.env.args` may change the limits; the server itself starts at the first answer.
        return CodeSandbox(PythonSandboxLimits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb))

    @classmethod
    async def close_shared(cls, shared: Any) -> None:
        if shared is not None:
            await shared.close()

    async def step(self, action: Any) -> Tuple[None, float, bool, Dict[str, Any]]:
        if not isinstance(action, str):
            raise ValueError(f"code env: an action is the answer's code, got {type(action).__name__}")
        program = self.prefix + action
        outcome, reason = check_program(program)
        passed = 0.0
        if not outcome:
            verdict = await self.shared.run_tests(program, self.tests, self.entry_point)
            passed = sum(verdict.passed) / len(self.tests)
            if verdict.problem == "timeout":
                outcome, reason = "timeout", verdict.error
            elif verdict.problem:
                outcome, reason = "runtime_error", verdict.error
            elif verdict.error:  # some calls raised: they failed their tests
                outcome, reason = "runtime_error", verdict.error
        success = passed == 1.0
        metrics: Dict[str, float] = {"tests_passed": passed}
        metrics.update({name: float(name == outcome) for name in OUTCOMES})
        info = {"success": success, "metrics": metrics, "reason": reason or ("" if success else "wrong results")}
        return None, 1.0 if success else 0.0, True, info

    async def aclose(self) -> None:
        if self._own_sandbox:
            await self.close_shared(self.shared)
