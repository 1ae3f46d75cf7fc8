"""Objects named in config by import path, e.g. `my_pkg.agents:MyAgent`."""

import importlib
from typing import Any, Dict, Optional


def import_object(path: str, what: str = "object") -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {path!r} must be 'module.path:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} for {what} {path!r}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} ({what} {path!r})")
        obj = getattr(obj, part)
    return obj


def resolve(name: str, registry: Dict[str, Any], what: str, lazy_paths: Optional[Dict[str, str]] = None) -> Any:
    """A registered name, a built-in name imported lazily, or a `module:Name` import path."""
    if name in registry:
        return registry[name]
    if lazy_paths and name in lazy_paths:
        return import_object(lazy_paths[name], what)
    if ":" in name:
        return import_object(name, what)
    known = sorted(set(registry) | set(lazy_paths or {}))
    raise ValueError(f"unknown {what} {name!r}: use one of {known} or 'module.path:ClassName'")


class ClassRegistry:
    """Classes chosen by name in config: registered ones, lazily imported built-ins, or a
    `module.path:ClassName` import path; every result must subclass `base`."""

    def __init__(self, kind: str, field: str, builtin_paths: Optional[Dict[str, str]] = None):
        self.kind, self.field = kind, field  # e.g. "agent", "agent.type" (for error messages)
        self.base: Any = None  # set by the module defining the base class
        self._classes: Dict[str, Any] = {}
        self._builtin_paths = dict(builtin_paths or {})

    def register(self, name: str):
        """Class decorator: `@registry.register("my-name")` makes `<field>=my-name` choose the class."""

        def deco(cls):
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(
                    f"{self.kind} name {name!r} is already registered to {self._classes[name].__qualname__}"
                )
            self._classes[name] = cls
            return cls

        return deco

    def get(self, name: str):
        cls = resolve(name, self._classes, self.field, self._builtin_paths)
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(
                f"{self.field}={name!r} names {cls!r}, which is not a subclass of "
                f"{self.base.__module__}.{self.base.__qualname__}"
            )
        return cls
