"""The `math` environment: grades an answer against the row's reference solutions.

    env = MathEnv(row, shared=grader)          # one per episode; the grader pool is shared
    _, reward, done, info = await env.step(answer_text)      # reward 1.0 (right) or 0.0

With `check_work`, an answer also needs every worked equation in it (`5-2=3`) to hold. The final
answer is read from `\\boxed{...}`, `#### N` or the last number; equivalence is exact for plain
numbers and math-verify otherwise, in a process pool with a hard timeout (see math_answer,
math_grader) that the worker's episodes share (`open_shared`). Every step grades, so a
multi-turn agent can step once per attempt; `done` is True once an answer was right.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from realhf.api.env import Environment, register_env
from realhf.plugins.environments.math_answer import extract_answer, work_lines_correct
from realhf.plugins.environments.math_grader import MathGrader


@register_env("math")
class MathEnv(Environment):
    required_fields = ("solutions",)

    def __init__(
        self, row: Dict[str, Any], *, shared: Any = None, config: Any = None, check_work: bool = False, **kwargs: Any
    ):
        super().__init__(row, shared=shared, config=config)
        self.check_work = bool(getattr(config, "check_work", check_work))
        self.solutions = list(row["solutions"])
        self._own_grader = shared is None  # made alone (a test, a script): grade with a pool of its own
        if self._own_grader:
            self.shared = self.open_shared(config, **kwargs)

    @classmethod
    def open_shared(
        cls, config: Any, grader_workers: int = 1, grader_timeout: float = 5.0, **kwargs: Any
    ) -> MathGrader:
        # The pool starts its processes lazily: the tiny task's numbers never need one.
        return MathGrader(
            n_workers=getattr(config, "grader_workers", grader_workers),
            timeout=getattr(config, "grader_timeout", grader_timeout),
        )

    @classmethod
    async def close_shared(cls, shared: Any) -> None:
        if shared is not None:
            shared.close()

    async def step(self, action: Any) -> Tuple[None, float, bool, Dict[str, Any]]:
        if not isinstance(action, str):
            raise ValueError(f"math env: an action is the answer text, got {type(action).__name__}")
        right = bool(await self.shared.agrade(action, self.solutions))
        work_ok = work_lines_correct(action)
        success = right and (work_ok or not self.check_work)
        info = {"success": success, "answer_right": right, "work_right": work_ok, "extracted": extract_answer(action)}
        return None, 1.0 if success else 0.0, success, info

    async def aclose(self) -> None:
        if self._own_grader:
            await self.close_shared(self.shared)
