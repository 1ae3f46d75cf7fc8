"""`--help` text from the config dataclasses: every field, its default and its one-line help."""

import dataclasses
from typing import List


def describe_fields(cls, prefix: str = "") -> List[str]:
    lines = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(f.type) or (f.default_factory is not dataclasses.MISSING
                                                and dataclasses.is_dataclass(f.default_factory)):
            sub = f.type if dataclasses.is_dataclass(f.type) else f.default_factory
            lines.extend(describe_fields(sub, key + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "???"
        lines.append(f"  {key} = {default!r}\n      {f.metadata.get('help', '')}")
    return lines


def help_text(cls, app: str, usage: str) -> str:
    body = "\n".join(describe_fields(cls))
    # Hydra expands ${...} in the template; defaults must not be mistaken for interpolations.
    body = body.replace("${", "$\\{")
    return f"{app}\n\n{usage}\n\nFields (override any with key=value; defaults shown before the YAML's):\n{body}\n"
