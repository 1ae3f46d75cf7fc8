"""A small JSON-shape language and its checker: the fixtures are plain dicts built with these
helpers (so they can be printed, diffed or dumped as JSON), and `mismatches` says, one line per
difference, where a value leaves its shape.

    scalar     {"type": "str" | "int" | "number" | "bool" | "null" | "any"}  (+ "enum", "pattern")
    list       {"type": "list", "items": shape}
    tuple      {"type": "tuple", "items": [shape, ...]}      a JSON array of fixed length
    object     {"type": "object", "fields": {name: field}, "unknown": "ignore" | "refuse"}
    union      {"any_of": [shape, ...]}
    field      {"shape": shape, "required": bool, "default": value, "doc": str, "realhf": bool}

`unknown` is what SGLang does with a key it does not know ("refuse": 400). `realhf: True` marks a
field that is realhf's own, not SGLang's (the built-in server adds it; SGLang never sends it).
`int` is a JSON integer (not a bool); `number` an integer or a float (not a bool).

Strict checking (`strict=True`) treats every key the shape does not declare as a mismatch,
whatever SGLang would do with it: a client must send nothing the SGLang version does not know,
and the built-in server must answer nothing beyond SGLang's keys and its declared own.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

MISSING = "<no default>"  # a field without a default (a JSON-safe marker, unlike a sentinel object)

STR: Dict[str, Any] = {"type": "str"}
INT: Dict[str, Any] = {"type": "int"}
NUMBER: Dict[str, Any] = {"type": "number"}
BOOL: Dict[str, Any] = {"type": "bool"}
NULL: Dict[str, Any] = {"type": "null"}
ANY: Dict[str, Any] = {"type": "any"}


def enum(*values: Any) -> Dict[str, Any]:
    return {"type": "any", "enum": list(values)}


def pattern(regex: str) -> Dict[str, Any]:
    return {"type": "str", "pattern": regex}


def list_of(items: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "list", "items": items}


def tuple_of(*items: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "tuple", "items": list(items)}


def any_of(*shapes: Dict[str, Any]) -> Dict[str, Any]:
    return {"any_of": list(shapes)}


def nullable(shape: Dict[str, Any]) -> Dict[str, Any]:
    return any_of(shape, NULL)


def field(
    shape: Dict[str, Any], required: bool = False, default: Any = MISSING, doc: str = "", realhf: bool = False
) -> Dict[str, Any]:
    out = {"shape": shape, "required": required, "default": default, "doc": doc}
    if realhf:
        out["realhf"] = True
    return out


def obj(fields: Dict[str, Dict[str, Any]], unknown: str = "ignore") -> Dict[str, Any]:
    assert unknown in ("ignore", "refuse"), unknown
    return {"type": "object", "fields": fields, "unknown": unknown}


def with_fields(shape: Dict[str, Any], **changes: Dict[str, Any]) -> Dict[str, Any]:
    """`shape` (an object) with some fields replaced or added."""
    return {**shape, "fields": {**shape["fields"], **changes}}


_PY = {"str": (str,), "int": (int,), "number": (int, float), "bool": (bool,), "null": (type(None),)}
_JSON_NAME = {str: "str", int: "int", float: "number", bool: "bool", type(None): "null", list: "list", dict: "object"}


def _kind(value: Any) -> str:
    return _JSON_NAME.get(type(value), type(value).__name__)


def mismatches(value: Any, shape: Dict[str, Any], where: str = "body", strict: bool = False) -> List[str]:
    """Every way `value` leaves `shape`, each naming its place (`body.meta_info.id: ...`); [] when it fits."""
    if "any_of" in shape:
        tried = [mismatches(value, s, where, strict) for s in shape["any_of"]]
        if any(not t for t in tried):
            return []
        near = [t for s, t in zip(shape["any_of"], tried) if _same_kind(value, s)]
        if len(near) == 1:  # e.g. an object where "object or null" was asked: its own complaints
            return near[0]
        return [f"{where}: {_kind(value)} {_short(value)} fits none of {describe(shape)}"]
    kind = shape["type"]
    if kind == "any":
        pass
    elif kind in _PY:
        ok = isinstance(value, _PY[kind]) and not (isinstance(value, bool) and kind != "bool")
        if not ok:
            return [f"{where}: expected {kind}, got {_kind(value)} {_short(value)}"]
        if "pattern" in shape and not re.fullmatch(shape["pattern"], value):
            return [f"{where}: {value!r} does not match {shape['pattern']!r}"]
    elif kind == "list":
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {_kind(value)} {_short(value)}"]
        out: List[str] = []
        for i, item in enumerate(value):
            out += mismatches(item, shape["items"], f"{where}[{i}]", strict)
            if len(out) >= 5:
                break
        return out
    elif kind == "tuple":
        items = shape["items"]
        if not isinstance(value, list) or len(value) != len(items):
            return [f"{where}: expected {describe(shape)} ({len(items)} items), got {_kind(value)} {_short(value)}"]
        return [m for i, (v, s) in enumerate(zip(value, items)) for m in mismatches(v, s, f"{where}[{i}]", strict)]
    elif kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {_kind(value)} {_short(value)}"]
        out = []
        fields = shape["fields"]
        for name, f in fields.items():
            if name in value:
                out += mismatches(value[name], f["shape"], f"{where}.{name}", strict)
            elif f["required"]:
                out.append(f"{where}.{name}: missing (required)")
        if strict or shape["unknown"] == "refuse":
            for name in value:
                if name not in fields:
                    out.append(f"{where}.{name}: not a field SGLang knows here (known: {', '.join(fields)})")
        return out
    else:
        raise ValueError(f"unknown shape type {kind!r} at {where}")
    if "enum" in shape and value not in shape["enum"]:
        return [f"{where}: {value!r} is not one of {shape['enum']}"]
    return []


def _same_kind(value: Any, shape: Dict[str, Any]) -> bool:
    """`shape` is of value's JSON kind (an object one also of its "type" tag, where it has one)."""
    if "any_of" in shape:
        return any(_same_kind(value, s) for s in shape["any_of"])
    kind = shape["type"]
    if isinstance(value, dict):
        tag = shape.get("fields", {}).get("type", {}).get("shape", {}).get("enum")
        return kind == "object" and (tag is None or value.get("type") in tag)
    if isinstance(value, list):
        return kind in ("list", "tuple")
    return kind in _PY or kind == "any"


def describe(shape: Dict[str, Any]) -> str:
    """A one-line name of a shape, for messages and docs."""
    if "any_of" in shape:
        return " | ".join(describe(s) for s in shape["any_of"])
    kind = shape["type"]
    if "enum" in shape:
        return " | ".join(repr(v) for v in shape["enum"])
    if kind == "list":
        return f"[{describe(shape['items'])}]"
    if kind == "tuple":
        return "[" + ", ".join(describe(s) for s in shape["items"]) + "]"
    if kind == "object":
        return "{" + ", ".join(f"{n}{'' if f['required'] else '?'}" for n, f in shape["fields"].items()) + "}"
    return kind


def field_names(shape: Dict[str, Any], realhf: Optional[bool] = None) -> List[str]:
    """The field names of an object shape (only SGLang's: realhf=False; only realhf's: True)."""
    return [n for n, f in shape["fields"].items() if realhf is None or bool(f.get("realhf")) == realhf]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
