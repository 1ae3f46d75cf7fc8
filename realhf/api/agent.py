"""The Agent interface: one prompt in, one trajectory (prompt group) out (docs/architecture.md §6, §8).

    traj = await agent.collect_trajectory(prompt, env, client)   # None: filtered out

`prompt` is a `Prompt` (the dataset row plus its token ids and the rollout's qid), `env` the
worker's `Environment` (shared by concurrent episodes), `client` the worker's
`GenerationClient` (`await client.generate(qid, input_ids, gconfig, group_size)` and
`generate_group`). The trajectory returned is exactly the message pushed to the trainer.

Agents are chosen in config by a registered name (`agent.type=math-single-step`) or by import
path (`agent.type=my_pkg.agents:MyAgent`). A class is constructed as
`cls(config, gconfig=..., group_size=..., tokenizer=..., **config.args)`.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, List, Optional, Type

from realhf.api.prompt import Prompt  # noqa: F401  (agents import it from here)
from realhf.api.trajectory import Trajectory
from realhf.base.importing import ClassRegistry

_BUILTIN_PATHS = {
    "math-single-step": "realhf.impl.agent.math_single_step:MathSingleStepAgent",
    "math-multi-turn": "realhf.impl.agent.math_multi_turn:MathMultiTurnAgent",
}
_REGISTRY = ClassRegistry("agent", "agent.type", _BUILTIN_PATHS)


class Agent(abc.ABC):
    def __init__(self, config: Any = None, *, gconfig: Any = None, group_size: int = 1, tokenizer: Any = None,
                 **kwargs: Any):
        self.config = config
        self.gconfig = gconfig
        self.group_size = group_size
        self.tokenizer = tokenizer

    @abc.abstractmethod
    async def collect_trajectory(self, prompt: Prompt, env: Any, client: Any) -> Optional[Trajectory]:
        """Run one episode (a group of `group_size` samples); None when the group is filtered out."""


def success_reward(success: float, reward_bias: float, reward_scaling: float) -> float:
    """AReaL's reward: ±1 for success/failure, shifted by `reward_bias`, times `reward_scaling`."""
    return ((float(success) - 0.5) * 2.0 - reward_bias) * reward_scaling


def keep_group(successes: List[float], success_rate_lb: float, success_rate_ub: float) -> bool:
    """Dynamic sampling: a group is dropped when its success rate is strictly below the lower or
    strictly above the upper bound (so lb=0, ub=1 keeps everything)."""
    rate = sum(successes) / len(successes) if successes else 0.0
    return not (rate < success_rate_lb or rate > success_rate_ub)


def register_agent(name: str) -> Callable[[Type[Agent]], Type[Agent]]:
    """Class decorator: `@register_agent("my-name")` makes `agent.type=my-name` choose the class."""
    return _REGISTRY.register(name)


def agent_class(name: str) -> Type[Agent]:
    return _REGISTRY.get(name)


def make_agent(config: Any, *, gconfig: Any = None, group_size: int = 1, tokenizer: Any = None) -> Agent:
    """The agent named by `config.type`."""
    cls = agent_class(config.type)
    return cls(config, gconfig=gconfig, group_size=group_size, tokenizer=tokenizer,
               **dict(getattr(config, "args", None) or {}))


_REGISTRY.base = Agent
