"""The Environment interface: an async, gym-like grader of an agent's actions (docs/architecture.md §8).

    obs, info = await env.reset(prompt)
    obs, reward, done, info = await env.step(action)

One environment object serves every episode of a rollout worker, concurrently (the worker makes
it once with `make_env(config)` and closes it at exit): keep per-episode state in the action and
the returned observation, not in `self`. This lets an environment own expensive resources (a
grader process pool, a sandbox) once per worker.

Environments are chosen in config by a registered name (`env.type=math`) or by import path
(`env.type=my_pkg.envs:MyEnv`), so users plug in their own without touching the package. A class
is constructed as `cls(config, **config.args)`.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Tuple, Type

from realhf.base.importing import ClassRegistry

# Built-ins are imported on first use, so importing the API costs nothing.
_BUILTIN_PATHS = {"math": "realhf.impl.environment.math_env:MathEnv"}
_REGISTRY = ClassRegistry("environment", "env.type", _BUILTIN_PATHS)


class Environment(abc.ABC):
    def __init__(self, config: Any = None, **kwargs: Any):
        self.config = config

    async def reset(self, prompt: Any = None) -> Tuple[Any, Dict[str, Any]]:
        """Start an episode on `prompt`; returns (first observation, info). Default: the prompt."""
        return prompt, {}

    @abc.abstractmethod
    async def step(self, action: Any) -> Tuple[Any, Any, bool, Dict[str, Any]]:
        """Apply `action`; returns (observation, reward, done, info)."""

    async def aclose(self) -> None:
        """Release what the environment holds; called once when the worker exits."""


def register_env(name: str) -> Callable[[Type[Environment]], Type[Environment]]:
    """Class decorator: `@register_env("my-name")` makes `env.type=my-name` choose the class."""
    return _REGISTRY.register(name)


def env_class(name: str) -> Type[Environment]:
    return _REGISTRY.get(name)


def make_env(config: Any) -> Environment:
    """The environment named by `config.type`, built as `cls(config, **config.args)`."""
    cls = env_class(config.type)
    return cls(config, **dict(getattr(config, "args", None) or {}))


_REGISTRY.base = Environment
