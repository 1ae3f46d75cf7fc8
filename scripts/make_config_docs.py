"""Write docs/config.md, the config reference, from the config tree itself (realhf/api/cli_args.py).

    python -m scripts.make_config_docs          # rewrite docs/config.md
    python -m scripts.make_config_docs --check  # exit 1 if docs/config.md is out of date

Every key with the value a plain run uses (the dataclass defaults merged with
training/configs/async_ppo.yaml, as `training/main_async_ppo.py` composes them) and its help
text; tests/unit/scripts/test_make_config_docs.py keeps the page in step with the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, List

from realhf.experiments.config_loading import compose_config

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "config.md"
# Values that differ from run to run, shown as what they stand for.
VOLATILE = {"trial_name": "run-<date>-<time>-<pid> (a fresh one per run unless set)"}


def _value(key: str, value: Any) -> str:
    if key in VOLATILE:
        return VOLATILE[key]
    text = repr(value).replace(str(REPO) + "/", "").replace(str(REPO), ".")
    return text.replace("|", "\\|")


def _rows(cfg: Any, prefix: str = "") -> List[tuple]:
    rows = []
    for f in dataclasses.fields(cfg):
        key, value = f"{prefix}{f.name}", getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            rows.append((key, None, f.metadata.get("help", "")))
            rows.extend(_rows(value, key + "."))
        else:
            rows.append((key, _value(key, value), f.metadata.get("help", "")))
    return rows


def render() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from `realhf/api/cli_args.py` by `python -m scripts.make_config_docs` (do not edit by hand).",
        "Set any key on the command line (`bash examples/run_async_ppo.sh ppo.eps_clip=0.1`), in a YAML file",
        "(`--config-name`), or see them with the values a run would use: `python training/main_async_ppo.py --help`.",
        "",
    ]
    section = None
    for key, value, help_ in _rows(compose_config([])):
        top = key.split(".")[0] if "." in key or value is None else ""
        if top != section:
            section = top
            out += ["", f"## {top or 'top level'}", "", "| key | value | what it does |", "|---|---|---|"]
        if value is None:
            continue  # a section: its keys follow
        what = " ".join(help_.split()).replace("|", "\\|")
        out.append(f"| `{key}` | `{value}` | {what} |")
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python -m scripts.make_config_docs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
