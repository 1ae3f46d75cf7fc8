"""Agents: one episode for one dataset row (docs/architecture.md §8.3).

    from realhf.api.agent import Agent, register_agent

    @register_agent("my-agent")
    class MyAgent(Agent):
        async def run_episode(self, row, gen, env):
            answer = await gen()                       # the row's prompt; answer.text, .output_ids, …
            return 1.0 if answer.text.strip() == row["answer"] else -1.0

`row` is the dataset row, every field of it. `gen` is the episode's generation handle
(`realhf/system/rollout/episode.py`): `await gen(**sampling)` continues the episode's tokens — the row's
prompt (chat template applied when the model has one) and whatever the episode added since —
and returns a `Completion`; `gen.append(text | token ids | messages)` adds tokens the model did
not generate (feedback, a tool's result), which carry no loss; `async with
gen.openai_endpoint(tokenizer) as (base_url, api_key)` serves an OpenAI-compatible endpoint whose
every call is generated through this episode (for agent code written against an OpenAI client:
the `openai-agent`). The episode's tokens are never
decoded and re-encoded, and each generated token keeps the weight version that produced it.
`env` is this episode's `Environment` (or None when no environment is configured).

The return value is the sample's reward (a number; `Outcome` to also say whether it succeeded),
or None to drop this sample. The framework runs the agent `group_size` times per prompt, drops a
group whose success rate is outside [success_rate_lb, success_rate_ub], shapes the rewards
((reward − reward_bias) · reward_scaling), and builds and pushes the trajectory; qids, admission
and partial-rollout resubmission never reach the agent. An exception fails this episode's group
(logged with its qid, its admission slot freed); the worker goes on.

Agents are chosen in config by a registered name (`rollout.agent.type=math-single-step`), by
import path (`rollout.agent.type=my_pkg.agents:MyAgent`) or by file (`rollout.agent.type=
agents/my_agent.py:MyAgent`, relative to the launch directory; realhf.base.importing); a class is constructed as
`cls(config=..., tokenizer=..., **config.args)` (all by keyword), once per rollout worker. An agent
with arguments of its own declares them as keyword parameters and passes the rest on:

    def __init__(self, partial: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.partial = partial
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Type, Union

from realhf.base.importing import ClassRegistry, import_object

_BUILTIN_PATHS = {
    "math-single-step": "realhf.plugins.agents.math_single_step:MathSingleStepAgent",
    "math-multi-turn": "realhf.plugins.agents.math_multi_turn:MathMultiTurnAgent",
    "tool-agent": "realhf.plugins.agents.tool_agent:ToolAgent",
    "openai-agent": "realhf.plugins.agents.openai_agent:OpenAIAgent",
}
_REGISTRY = ClassRegistry("agent", "rollout.agent.type", _BUILTIN_PATHS)


class RewardTimeout(Exception):
    """A reward_fn did not return within rollout.agent.reward_timeout.

    Not a TimeoutError: the rollout worker reads a TimeoutError out of an episode as its own
    rollout.episode_timeout, and this is another limit with another remedy."""


def load_reward_fn(path: str) -> Optional[Callable]:
    """`rollout.agent.reward_fn`: the function named by `module:function` (or a file path), or
    None when `path` is empty; a ValueError/TypeError naming the key when it cannot be one."""
    if not path:
        return None
    fn = import_object(path, "rollout.agent.reward_fn")
    if not callable(fn):
        raise TypeError(f"rollout.agent.reward_fn={path!r} is a {type(fn).__name__}, not a function")
    return fn


@dataclass
class Completion:
    """What one `await gen(...)` produced."""

    output_ids: List[int]
    logprobs: List[float]  # the behaviour policy's log-prob of each output token
    versions: List[int]  # the weight version that produced each output token
    text: str  # output_ids decoded, special tokens skipped
    no_eos: bool  # stopped by the token limit rather than by EOS / a stop token
    input_ids: List[int] = field(default_factory=list)  # what the model was given


@dataclass
class Outcome:
    """A sample's reward, and whether it counts as a success for the group filter and the
    success-rate metric (default: reward > 0)."""

    reward: float
    success: Optional[bool] = None
    info: Dict[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.reward > 0 if self.success is None else bool(self.success)


EpisodeResult = Union[float, int, bool, Outcome, None]


class Agent(abc.ABC):
    # Tools the model may call, by name (realhf.api.tools), as a class attribute or set in
    # __init__: their schemas go into the prompt through the chat template, with those of the
    # environment (Environment.shared_tools).
    tools: Dict[str, Any] = {}
    # True when run_episode calls gen() once, from the row's prompt, whatever the other episodes
    # of its group do: with rollout.group_in_one_request the group's first calls then go to the
    # server as one request for all (the framework waits for every episode's first call).
    one_generation_per_episode: bool = False
    # The run's AgentConfig and the actor's tokenizer: set by the base __init__, and by
    # construct_agent for a subclass whose __init__ does not call it.
    config: Any = None
    tokenizer: Any = None

    def __init__(self, config: Any = None, *, tokenizer: Any = None, **kwargs: Any):
        self.config = config
        self.tokenizer = tokenizer
        self.tools = dict(self.tools)  # per instance: a subclass's class attribute is not shared

    @abc.abstractmethod
    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        """Run one episode for `row`; return its reward (or an Outcome), or None to drop it."""


def as_outcome(result: EpisodeResult, agent: str) -> Optional[Outcome]:
    """The agent's return value as an Outcome; a clear TypeError for anything else."""
    if result is None or isinstance(result, Outcome):
        return result
    if isinstance(result, bool):  # before int: True is an int
        return Outcome(1.0 if result else -1.0, success=result)
    if isinstance(result, (int, float)):
        return Outcome(float(result))
    raise TypeError(
        f"agent {agent!r} returned {type(result).__name__}; run_episode must return a reward (a "
        "number or bool), an Outcome, or None to drop the sample"
    )


def keep_group(successes: List[bool], success_rate_lb: float, success_rate_ub: float) -> bool:
    """Dynamic sampling: a group is dropped when its success rate is strictly below the lower or
    strictly above the upper bound (so lb=0, ub=1 keeps everything)."""
    rate = sum(map(float, successes)) / len(successes) if successes else 0.0
    return not (rate < success_rate_lb or rate > success_rate_ub)


def shape_reward(r, scaling: float = 1.0, bias: float = 0.0, clip: Optional[float] = None):
    """`(r + bias)·scaling`, then clipped to `[−clip, clip]` when `clip` is given: the one reward
    shaping, of a float (an agent's reward, `rollout.agent.reward_*`) or a tensor (the trainer's,
    `ppo.reward_output_*`, `ppo.max_reward_clip`)."""
    if clip is not None and clip <= 0:
        raise ValueError(f"reward clip must be > 0, got {clip}; use None to disable it")
    shaped = (r + bias) * scaling
    if clip is None:
        return shaped
    return shaped.clamp(-clip, clip) if hasattr(shaped, "clamp") else min(max(shaped, -clip), clip)


def register_agent(name: str) -> Callable[[Type[Agent]], Type[Agent]]:
    """Class decorator: `@register_agent("my-name")` makes `agent.type=my-name` choose the class."""
    return _REGISTRY.register(name)


def agent_class(name: str) -> Type[Agent]:
    return _REGISTRY.get(name)


def agent_names() -> Dict[str, str]:
    """Every registered agent name (built-ins, and those of user modules imported so far) -> its class."""
    return _REGISTRY.names()


def construct_agent(cls: Type[Agent], config: Any, tokenizer: Any, args: Dict[str, Any]) -> Agent:
    """`cls(config=config, tokenizer=tokenizer, **args)`: everything by keyword, so that an
    `__init__(self, own_arg=1, **kwargs)` takes its own arguments and passes the rest on; an
    `__init__` that takes no **kwargs is refused naming the pattern."""
    try:
        agent = cls(config=config, tokenizer=tokenizer, **args)
    except TypeError as e:
        if "unexpected keyword argument 'config'" in str(e) or "unexpected keyword argument 'tokenizer'" in str(e):
            raise TypeError(
                f"agent {cls.__module__}.{cls.__qualname__}: {e}. An agent is constructed as cls(config=..., "
                "tokenizer=..., **rollout.agent.args); take your own arguments as keywords and pass the rest "
                "on: def __init__(self, my_arg=1, **kwargs): super().__init__(**kwargs) (docs/your-agent.md)"
            ) from None
        raise
    if agent.config is None:  # an __init__ that did not call the base's
        agent.config, agent.tokenizer = config, tokenizer
    if "tools" not in vars(agent):
        agent.tools = dict(agent.tools)  # per instance, as the base __init__ makes it
    return agent


def make_agent(config: Any, *, tokenizer: Any = None) -> Agent:
    """The agent named by `config.type`."""
    return construct_agent(agent_class(config.type), config, tokenizer, dict(getattr(config, "args", None) or {}))


_REGISTRY.base = Agent
