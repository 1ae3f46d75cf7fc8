"""Environments: one per episode, gym-like and async (docs/architecture.md §8.3).

    from realhf.api.env import Environment, register_env

    @register_env("my-env")
    class MyEnv(Environment):
        required_fields = ("answer",)              # row fields it needs (checked when data loads)

        async def step(self, action):              # the episode's state lives on self
            right = action.strip() == self.row["answer"]
            return None, 1.0 if right else 0.0, True, {}

The framework makes a fresh environment for every episode, `cls(row, shared=..., config=...,
**config.args)`, calls `await env.reset()` before the agent runs and `await env.aclose()` after
it, whatever happened. What is expensive to make (a grader process pool, a sandbox, a client)
is made once per rollout worker by the class's `open_shared(config, **args)` and handed to
every episode as `shared`; `close_shared(shared)` releases it when the worker exits. The
factory that does this is `EnvFactory`.

Environments are chosen in config by a registered name (`rollout.env.type=math`), by import
path (`rollout.env.type=my_pkg.envs:MyEnv`) or by file (`rollout.env.type=envs/my_env.py:MyEnv`);
`rollout.env.type=none` runs agents without one.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
from typing import Any, Callable, Dict, Optional, Tuple, Type

from realhf.base.importing import ClassRegistry

# Built-ins are imported on first use, so importing the API costs nothing.
_BUILTIN_PATHS = {
    "math": "realhf.plugins.environments.math_env:MathEnv",
    "mcp": "realhf.plugins.environments.mcp_env:MCPEnv",
    "code": "realhf.plugins.environments.code_env:CodeEnv",
}
_REGISTRY = ClassRegistry("environment", "rollout.env.type", _BUILTIN_PATHS)
NO_ENV = "none"


class Environment(abc.ABC):
    required_fields: Tuple[str, ...] = ()  # dataset row fields every episode needs

    def __init__(self, row: Dict[str, Any], *, shared: Any = None, config: Any = None, **kwargs: Any):
        self.row, self.shared, self.config = row, shared, config

    async def reset(self) -> Any:
        """Start the episode; returns the first observation (default: None)."""
        return None

    @abc.abstractmethod
    async def step(self, action: Any) -> Tuple[Any, float, bool, Dict[str, Any]]:
        """Apply `action`; returns (observation, reward, done, info)."""

    async def aclose(self) -> None:  # noqa: B027 - an optional hook: nothing to do by default
        """End of the episode (also after an error or a timeout)."""

    @classmethod  # noqa: B027 - an optional hook: nothing to check by default
    def check_args(cls, args: Dict[str, Any], key: str) -> None:
        """Before any process starts: ValueError naming `key`.<arg> for config.args that cannot work
        (their names were already checked against `__init__` and `open_shared`)."""

    @classmethod
    def open_shared(cls, config: Any, **kwargs: Any) -> Any:
        """Once per rollout worker, before its first episode: what every episode shares
        (`self.shared`). May be async."""
        return None

    @classmethod  # noqa: B027 - an optional hook: nothing to release by default
    async def close_shared(cls, shared: Any) -> None:
        """When the worker exits: release what open_shared made."""

    @classmethod
    def shared_tools(cls, shared: Any) -> Dict[str, Any]:
        """Tools (realhf.api.tools.Tool by name) this environment offers every episode, e.g. an
        MCP server's; their schemas go into the prompt. Default: none."""
        return {}


class EnvFactory:
    """Makes the environment of each episode; owns what they share (opened at the first episode,
    in the worker's event loop, so `open_shared` may be async)."""

    def __init__(self, config: Any, cls: Optional[Type[Environment]] = None):
        """`cls`: the class itself instead of `config.type`'s (realhf.testing takes a class that
        need not be importable by name, e.g. one defined in a test function)."""
        self.config = config
        self.args = dict(getattr(config, "args", None) or {})
        self.cls: Optional[Type[Environment]] = cls or (None if config.type == NO_ENV else env_class(config.type))
        self.shared: Any = None
        self._opened = False
        self._lock: Optional[asyncio.Lock] = None

    @property
    def required_fields(self) -> Tuple[str, ...]:
        return self.cls.required_fields if self.cls is not None else ()

    async def tools(self) -> Dict[str, Any]:
        """The tools the environment class offers (opening what episodes share, if not yet)."""
        if self.cls is None:
            return {}
        await self._open()
        return self.cls.shared_tools(self.shared)

    async def make(self, row: Dict[str, Any]) -> Optional[Environment]:
        if self.cls is None:
            return None
        await self._open()
        return self.cls(row, shared=self.shared, config=self.config, **self.args)

    async def _open(self) -> None:
        if not self._opened:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if not self._opened:
                    shared = self.cls.open_shared(self.config, **self.args)
                    self.shared = await shared if inspect.isawaitable(shared) else shared
                    self._opened = True

    async def aclose(self) -> None:
        if self.cls is not None and self._opened:
            shared, self.shared, self._opened = self.shared, None, False
            await self.cls.close_shared(shared)


def register_env(name: str) -> Callable[[Type[Environment]], Type[Environment]]:
    """Class decorator: `@register_env("my-name")` makes `env.type=my-name` choose the class."""
    return _REGISTRY.register(name)


def env_class(name: str) -> Type[Environment]:
    return _REGISTRY.get(name)


def env_names() -> Dict[str, str]:
    """Every registered environment name (built-ins, and those of user modules imported so far) -> its class."""
    return _REGISTRY.names()


_REGISTRY.base = Environment
