"""The `math-single-step` agent: one answer to the row's prompt, graded.

    reward = +1 right, −1 wrong      (then the framework's shaping: (reward − reward_bias)·reward_scaling)

Graded by the episode's environment (`rollout.env.type=math`), or, when `rollout.agent.reward_fn`
names a function `module:function`, by `reward_fn(prompt, completion, **row)` (the row's other
fields as keywords; may be async): a number is the reward, True/False mean ±1.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Optional

from realhf.api.agent import Agent, EpisodeResult, Outcome, register_agent
from realhf.base.importing import import_object


def load_reward_fn(path: str) -> Optional[Callable]:
    if not path:
        return None
    fn = import_object(path, "rollout.agent.reward_fn")
    if not callable(fn):
        raise TypeError(f"rollout.agent.reward_fn={path!r} is a {type(fn).__name__}, not a function")
    return fn


async def call_reward_fn(fn: Callable, row: Dict[str, Any], completion: str) -> Any:
    others = {k: v for k, v in row.items() if k not in ("prompt", "completion")}
    value = fn(row.get("prompt", ""), completion, **others)
    return await value if inspect.isawaitable(value) else value


def graded(env_reward: float) -> Outcome:
    """±1 for the environment's verdict; a non-finite one is passed on, so the group is refused
    as malformed (and logged) instead of silently graded wrong."""
    if not math.isfinite(env_reward):
        return Outcome(env_reward, success=False)
    return Outcome(1.0 if env_reward > 0 else -1.0, success=env_reward > 0)


@register_agent("math-single-step")
class MathSingleStepAgent(Agent):
    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        self.reward_fn = load_reward_fn(getattr(config, "reward_fn", ""))

    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        answer = await gen()
        if self.reward_fn is not None:
            return await call_reward_fn(self.reward_fn, row, answer.text)
        _, reward, _, _ = await env.step(answer.text)
        return graded(reward)
