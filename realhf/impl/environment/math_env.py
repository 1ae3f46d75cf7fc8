"""The `math` environment: grades answers against a prompt's reference solutions.

    obs, info = await env.reset(prompt)                       # obs: the prompt text
    _, successes, done, info = await env.step((prompt, [answer_text, ...]))

A step grades a batch of answers to one prompt (a group, or one turn of one sample) and returns
one success (1.0 / 0.0) per answer; the agent turns successes into rewards. With `check_work`, an
answer also needs every worked equation in it (`5-2=3`) to hold. The final answer is
read from `\\boxed{...}`, `#### N` or the last number; equivalence is exact for plain numbers and
math-verify otherwise, in a process pool with a hard timeout (see math_answer, math_grader). The environment
is stateless between steps, so one instance serves all concurrent episodes of a worker.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Sequence, Tuple

from realhf.api.env import Environment, register_env
from realhf.impl.environment.math_answer import extract_answer, work_lines_correct
from realhf.impl.environment.math_grader import MathGrader


@register_env("math")
class MathEnv(Environment):
    def __init__(self, config: Any = None, grader_workers: int = 1, grader_timeout: float = 5.0, **kwargs: Any):
        super().__init__(config)
        n = getattr(config, "grader_workers", grader_workers)
        timeout = getattr(config, "grader_timeout", grader_timeout)
        self.check_work = bool(getattr(config, "check_work", kwargs.get("check_work", False)))
        # The pool starts its processes lazily: the tiny task's numbers never need one.
        self.grader = MathGrader(n_workers=n, timeout=timeout)

    async def reset(self, prompt: Any = None) -> Tuple[Any, Dict[str, Any]]:
        return getattr(prompt, "prompt", prompt), {}

    async def step(self, action: Tuple[Any, Sequence[str]]) -> Tuple[None, List[float], bool, Dict[str, Any]]:
        try:
            prompt, answers = action
            solutions = list(prompt.solutions)
        except (TypeError, ValueError, AttributeError):
            raise ValueError(
                "math env: an action is (prompt with .solutions, [answer text, ...]); "
                f"got {type(action).__name__}"
            ) from None
        if isinstance(answers, str):
            raise ValueError("math env: answers must be a list of strings, got one string")
        verdicts = await asyncio.gather(*(self.grader.agrade(a, solutions) for a in answers))
        work_ok = [work_lines_correct(a) for a in answers]
        successes = [1.0 if v and (ok or not self.check_work) else 0.0 for v, ok in zip(verdicts, work_ok)]
        info = {"success": [s > 0 for s in successes], "answer_right": [bool(v) for v in verdicts],
                "work_right": work_ok, "extracted": [extract_answer(a) for a in answers]}
        return None, successes, True, info

    async def aclose(self) -> None:
        self.grader.close()
