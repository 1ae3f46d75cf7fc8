"""`--help` text: every field of a composed config with the value the run will use and its help."""

import dataclasses
from typing import Any, List


def describe_fields(cfg: Any, prefix: str = "") -> List[str]:
    lines = []
    for f in dataclasses.fields(cfg):
        key, value = f"{prefix}{f.name}", getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines.extend(describe_fields(value, key + "."))
        else:
            lines.append(f"  {key} = {value!r}\n      {f.metadata.get('help', '')}")
    return lines


def help_text(cfg: Any, app: str, usage: str) -> str:
    """`cfg` is a config instance (defaults, YAML and overrides already merged)."""
    body = "\n".join(describe_fields(cfg))
    return f"{app}\n\n{usage}\n\nFields (override any with key=value; the values this run would use):\n{body}\n"
