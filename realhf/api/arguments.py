"""The arguments a class named in config takes (`rollout.agent.args`, `rollout.env.args`), so that a
misspelt one is an error before any process starts instead of a value silently ignored.

A class's arguments are the keyword parameters of its `__init__` (and, for an environment, of
`open_shared`, which gets the same arguments), followed up its base classes while each passes
`**kwargs` on: `MyAgent(temperature=..., **kwargs)` → `Agent.__init__(config, *, tokenizer,
**kwargs)`. The interface base classes end the walk: their `**kwargs` accept nothing of their own.
An argument read from `kwargs` by hand (`kwargs.get("x")`) is not seen: declare it as a keyword
parameter.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Dict, Iterable, Set

# What the framework passes itself; not a user's argument.
_FRAMEWORK = {"self", "cls", "config", "tokenizer", "row", "shared"}
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def accepted_arguments(cls: type, base: type, methods: Iterable[str] = ("__init__",)) -> Set[str]:
    names: Set[str] = set()
    for method in methods:
        for klass in cls.__mro__:
            fn = vars(klass).get(method)
            if fn is None:
                continue
            fn = getattr(fn, "__func__", fn)  # classmethod / staticmethod
            params = inspect.signature(fn).parameters.values()
            names |= {p.name for p in params if p.kind in _NAMED}
            if klass is base or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
                break
    return names - _FRAMEWORK


def check_arguments(
    cls: type, base: type, given: Dict[str, object], field: str, methods: Iterable[str] = ("__init__",)
) -> None:
    """ValueError naming each argument of `given` that `cls` does not take, with the closest it does."""
    accepted = accepted_arguments(cls, base, methods)
    unknown = sorted(set(given) - accepted)
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, accepted, n=1)
        parts.append(f"{field}.{name}" + (f" (did you mean {field}.{close[0]}?)" if close else ""))
    raise ValueError(
        f"{', '.join(parts)}: not an argument of {cls.__module__}.{cls.__qualname__}, which takes "
        f"{sorted(accepted) or 'none'}"
    )
