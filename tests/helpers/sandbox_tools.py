"""A user's tool that runs in the python sandbox (realhf.plugins.tools.python_code): the embedded
tool task's `calculator`, evaluated by a fresh limited Python process instead of in the worker
(`+rollout.agent.args.tools=[helpers.sandbox_tools:calculator]`). With REALHF_TEST_TOOL_LOG set,
each finished sandbox run appends a line to that file, so a test can count them."""

import os

from realhf.plugins.tools.python_code import run_python


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the arithmetic to evaluate, e.g. 5+2-3
    """
    # The expression is a Python literal inside the program, never spliced into its code.
    result = (await run_python(f"print(eval({expression!r}, {{'__builtins__': {{}}}}))")).strip()
    log = os.environ.get("REALHF_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{expression}={result}\n")
    return result
