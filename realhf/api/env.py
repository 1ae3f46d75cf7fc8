"""The Environment interface: an async, gym-like grader of an agent's actions (DESIGN §8).

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

from realhf.base.importing import resolve

_REGISTRY: Dict[str, Type["Environment"]] = {}
# Built-ins are imported on first use, so importing the API costs nothing.
_BUILTIN_PATHS = {"math": "realhf.impl.environment.math_env:MathEnv"}


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
    """Class decorator: `@register_env("my-env")` makes `env.type=my-env` choose the class."""

    def deco(cls: Type[Environment]) -> Type[Environment]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"environment name {name!r} is already registered to {_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return deco


def env_class(name: str) -> Type[Environment]:
    cls = resolve(name, _REGISTRY, "env.type", _BUILTIN_PATHS)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"env.type={name!r} names {cls!r}, which is not a subclass of realhf.api.env.Environment")
    return cls


def make_env(config: Any) -> Environment:
    """The environment named by `config.type`, built as `cls(config, **config.args)`."""
    cls = env_class(config.type)
    return cls(config, **dict(getattr(config, "args", None) or {}))
