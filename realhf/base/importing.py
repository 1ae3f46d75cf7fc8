"""User code named in config: `my_pkg.agents:MyAgent` (a module on the import path) or
`path/to/agent.py:MyAgent` (a file, relative to the launch directory or absolute).

Every process of a run imports user code the same way: the launcher calls `use_import_roots`
with its working directory (the launch directory) and the config's `user_paths`, and hands both
to every worker (`WorkerContext`), which calls it again before importing anything of the user's.
So a module beside the command the user typed is found in every process without PYTHONPATH, and
a relative file path means the same file everywhere (docs/architecture.md §8).
"""

import difflib
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence

IMPORT_PATH_FORMS = "'module.path:Name' or 'path/to/file.py:Name'"

_launch_dir: Optional[str] = None  # set by use_import_roots; this process's cwd until then
_user_paths: List[str] = []


def import_roots(launch_dir: str, user_paths: Sequence[str] = ()) -> List[str]:
    """The absolute directories user modules are imported from: the launch directory, then each
    of `user_paths` (relative ones from the launch directory)."""
    launch_dir = os.path.abspath(launch_dir)
    return [launch_dir] + [os.path.abspath(os.path.join(launch_dir, os.path.expanduser(p))) for p in user_paths]


def use_import_roots(launch_dir: str, user_paths: Sequence[str] = ()) -> List[str]:
    """Make this process import user code from `import_roots(launch_dir, user_paths)`: each goes on
    sys.path right after sys.path[0] (the script's directory, or the working directory under
    `python -m`, as a worker runs), in order, unless it is there already. Idempotent; returns the
    roots."""
    global _launch_dir, _user_paths
    roots = import_roots(launch_dir, user_paths)
    _launch_dir, _user_paths = roots[0], roots[1:]
    for i, root in enumerate(roots):
        if root not in sys.path:
            sys.path.insert(min(1 + i, len(sys.path)), root)
    importlib.invalidate_caches()  # a directory created after start-up (tests) must be looked at
    return roots


def launch_dir() -> str:
    """The directory a relative file path of user code is read from."""
    return _launch_dir or os.getcwd()


def is_file_path(module_part: str) -> bool:
    """`path/to/agent.py` (a file) rather than `my_pkg.agents` (a module name)."""
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def import_object(path: str, key: str = "object") -> Any:
    """The object `path` names (`module.path:Name` or `path/to/file.py:Name`, `Name` may be dotted).
    A ValueError names `key`, `path`, what was missing (the module, the file, the attribute) and
    the closest attribute."""
    where, sep, attr = path.rpartition(":")  # rpartition: a file's directory may hold a ':'
    if not sep or not where or not attr:
        raise ValueError(f"{key}={path!r} must be {IMPORT_PATH_FORMS}")
    module, what = _load_file(where, key, path) if is_file_path(where) else _load_module(where, key, path)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}={path!r}: {what} has no attribute {part!r}{_closest(obj, part)}")
        obj = getattr(obj, part)
    return obj


def _closest(obj: Any, name: str) -> str:
    names = [n for n in dir(obj) if not n.startswith("_")]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6) or difflib.get_close_matches(
        name.lower(), names, n=1, cutoff=0.6
    )
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (it has: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''})" if names else ""


def _where_modules_come_from() -> str:
    roots = ", ".join([launch_dir(), *_user_paths])
    return f"the launch directory and user_paths ({roots}), PYTHONPATH and the installed packages"


# The built-in plug-ins' old homes (before they moved out of impl/): an old path in a user's
# config gets the new one named, not a bare "no module".
_MOVED = {
    "realhf.impl.agent.": "realhf.plugins.agents.",
    "realhf.impl.environment.": "realhf.plugins.environments.",
    "realhf.impl.tools.": "realhf.plugins.tools.",
    "realhf.impl.dataset.math_synthetic": "realhf.plugins.tasks.math_synthetic",
    "realhf.impl.dataset.tool_task": "realhf.plugins.tasks.tool_task",
    "realhf.impl.dataset.code_task": "realhf.plugins.tasks.code_task",
    "realhf.impl.dataset.tiny_model": "realhf.plugins.tasks.tiny_model",
    "realhf.impl.evaluation": "realhf.plugins.tasks.math_accuracy",
}


def _load_module(name: str, key: str, path: str):
    try:
        return importlib.import_module(name), f"module {name!r}"
    except ModuleNotFoundError as e:
        moved = next((new + name[len(old) :] for old, new in _MOVED.items() if name.startswith(old)), None)
        if moved is not None:
            raise ValueError(
                f"{key}={path!r}: the built-in plug-ins moved out of realhf.impl; use "
                f"{moved + ':' + path.rpartition(':')[2]!r}"
            ) from None
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise ValueError(
                f"{key}={path!r}: no module {e.name!r} on the import path ({_where_modules_come_from()}); "
                f"name the file instead ('path/to/file.py:{path.rpartition(':')[2]}') or add the directory "
                "that holds the module to user_paths"
            ) from None
        raise ValueError(f"{key}={path!r}: importing module {name!r} failed: {e}") from e
    except Exception as e:  # noqa: BLE001 - the user's module raised while it was imported
        raise ValueError(f"{key}={path!r}: importing module {name!r} failed: {type(e).__name__}: {e}") from e


def _load_file(file: str, key: str, path: str):
    full = os.path.abspath(os.path.join(launch_dir(), os.path.expanduser(file)))
    if not os.path.isfile(full):
        missing = "is a directory, not a .py file" if os.path.isdir(full) else "does not exist"
        raise ValueError(
            f"{key}={path!r}: the file {full} {missing} (a relative path is read from the launch directory "
            f"{launch_dir()})"
        )
    # One module per file, whichever key names it: its classes are the same objects everywhere
    # (a registry refuses a second class under a name). The name is the same in every process.
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(full))[0])
    name = f"_realhf_user_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    what = f"file {full}"
    if name in sys.modules:
        return sys.modules[name], what
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: dataclasses and typing look their module up
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file raised while it was imported
        del sys.modules[name]
        raise ValueError(f"{key}={path!r}: importing {full} failed: {type(e).__name__}: {e}") from e
    return module, what


def resolve(name: str, registry: Dict[str, Any], key: str, lazy_paths: Optional[Dict[str, str]] = None) -> Any:
    """A registered name, a built-in name imported lazily, or an import path (`import_object`)."""
    if name in registry:
        return registry[name]
    if lazy_paths and name in lazy_paths:
        return import_object(lazy_paths[name], key)
    if ":" in name:
        return import_object(name, key)
    known = sorted(set(registry) | set(lazy_paths or {}))
    raise ValueError(f"{key}={name!r}: use one of {known} or {IMPORT_PATH_FORMS}{_closest_name(name, known)}")


def _closest_name(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class ClassRegistry:
    """Classes chosen by name in config: registered ones, lazily imported built-ins, or an import
    path; every result must subclass `base`."""

    def __init__(self, kind: str, field: str, builtin_paths: Optional[Dict[str, str]] = None):
        self.kind, self.field = kind, field  # e.g. "agent", "rollout.agent.type" (for error messages)
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

    def names(self) -> Dict[str, str]:
        """Every name `get` accepts, with where its class lives ('module:Class')."""
        found = dict(self._builtin_paths)
        for name, cls in self._classes.items():
            found.setdefault(name, f"{cls.__module__}:{cls.__qualname__}")
        return found

    def get(self, name: str):
        cls = resolve(name, self._classes, self.field, self._builtin_paths)
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(
                f"{self.field}={name!r} names {cls!r}, which is not a subclass of "
                f"{self.base.__module__}.{self.base.__qualname__}"
            )
        return cls
