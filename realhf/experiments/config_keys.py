"""Command-line keys checked against the config tree, with the closest valid key for a misspelt one.

Hydra refuses an unknown key with "To append to your config use +key=value" — advice that then
fails too (the schema refuses added keys, `validation.check_known_keys`) and that hides the real
mistake, a typo or a key at the wrong level. `unknown_key(key, schema)` walks the dataclass tree
and names the closest field instead (`rollout.max_concurent_rollouts: no such field (did you mean
rollout.max_concurrent_rollouts?)`); `check_overrides(args, schema)` runs it over a command line
before Hydra sees it. A field typed as a mapping (`rollout.agent.args`) takes any key below it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, List, Optional, Sequence, Tuple

# Hydra's command-line flags that take the next argument as their value.
_VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--package", "-p"}
_CUTOFF = 0.8  # difflib similarity a suggestion needs: typos and near misses, not any word


def _dataclass_of(tp: Any) -> Optional[type]:
    """The dataclass a field holds (through Optional[...]), or None for a value or a mapping."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return _dataclass_of(inner[0])
    return None


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> dict:
    """name -> the dataclass it holds, or None (a value or a mapping: open below)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _dataclass_of(hints.get(f.name, f.type)) for f in dataclasses.fields(cls)}


@functools.lru_cache(maxsize=None)
def all_keys(cls: type, prefix: str = "") -> tuple:
    """Every dotted key of the tree, groups included (`rollout`, `rollout.agent`, …)."""
    keys = []
    for name, sub in _fields(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if sub is not None:
            keys.extend(all_keys(sub, key + "."))
    return tuple(keys)


def _spelt_like(key: str, keys: Sequence[str]) -> List[str]:
    """The keys spelt most like `key` (the best, and any as close: actor/critic/ref twins)."""
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in keys), reverse=True)
    if not scored or scored[0][0] < _CUTOFF:
        return []
    return [k for r, k in scored[:3] if r >= scored[0][0] - 0.08]


def closest_keys(key: str, schema: type) -> List[str]:
    """Valid keys the user probably meant: the key with its first unknown part respelt (what
    follows kept: `rollout.agnt.type` -> `rollout.agent.type`), else the keys spelt most like the
    whole key, else those whose last part is spelt like the key's (the field at another level)."""
    keys = all_keys(schema)
    parts = key.split(".")
    bad, _ = _unknown_at(key, schema) or (len(parts) - 1, None)
    rest = parts[bad + 1 :]
    respelt = [".".join([head, *rest]) for head in _spelt_like(".".join(parts[: bad + 1]), keys)]
    found = [k for k in respelt if _unknown_at(k, schema) is None]
    if found:
        return found
    found = _spelt_like(key, keys)
    if found:
        return found
    last = key.rsplit(".", 1)[-1]
    tails = {k.rsplit(".", 1)[-1] for k in keys}
    near = set(difflib.get_close_matches(last, tails, n=3, cutoff=_CUTOFF))
    return [k for k in keys if k.rsplit(".", 1)[-1] in near][:3]


def _unknown_at(key: str, schema: type) -> Optional[Tuple[int, dict]]:
    """(index of the first part of `key` that is no field, the fields there), or None when the
    key is valid."""
    cls = schema
    for i, part in enumerate(key.split(".")):
        fields = _fields(cls)
        if part not in fields:
            return i, fields
        cls = fields[part]
        if cls is None:  # a value, or a mapping that takes any key below it
            return None
    return None


def unknown_key(key: str, schema: type) -> Optional[str]:
    """Why `key` is no field of the tree rooted at `schema` (naming the closest ones), or None."""
    unknown = _unknown_at(key, schema)
    if unknown is None:
        return None
    close = closest_keys(key, schema)
    if close:
        return f"{key}: no such field (did you mean {' or '.join(close)}?)"
    i, fields = unknown
    parent = ".".join(key.split(".")[:i]) or "the top level"
    return f"{key}: no such field (the fields of {parent} are {', '.join(sorted(fields))})"


def overrides_of(args: Sequence[str]) -> List[str]:
    """The `key=value` overrides of a command line, without Hydra's flags and their values."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _VALUE_FLAGS
        else:
            out.append(arg)
    return out


def check_overrides(args: Sequence[str], schema: type) -> Optional[str]:
    """The first override of `args` whose key is no field of `schema`, said with the closest
    valid keys; None when all are known. Hydra's own keys (`hydra.…`, config groups) and what
    Hydra cannot parse are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides_of(args):
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException:
            continue
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra.") or "/" in key or override.package is not None:
            continue
        why = unknown_key(key, schema)
        if why is not None:
            return why
    return None
