"""docs/architecture.md §8.1 names every root field a worker config carries (`same_as`) with the
reason the worker holds it; this fails when a `same_as` is added, dropped or retargeted without
the table following."""

import dataclasses
import re
from pathlib import Path

from helpers.paths import REPO
from realhf.api import worker_configs

DOC = Path(REPO, "docs", "architecture.md")


def declared() -> dict:
    out = {}
    for name in dir(worker_configs):
        cls = getattr(worker_configs, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == worker_configs.__name__:
            roots = {f.metadata["root"] for f in dataclasses.fields(cls) if "root" in f.metadata}
            if roots:
                out[name] = roots
    return out


def documented(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*\| `(\w+Config)` \| (.*?) \| .* \|$", line)
        if m:
            out[m.group(1)] = set(re.findall(r"`([\w.]+)`", m.group(2)))
    return out


def differences(text: str) -> dict:
    want, have = declared(), documented(text)
    return {
        cls: {"undocumented": sorted(want.get(cls, set()) - have.get(cls, set())),
              "not declared": sorted(have.get(cls, set()) - want.get(cls, set()))}
        for cls in set(want) | set(have)
        if want.get(cls) != have.get(cls)
    }  # fmt: skip


def test_the_architecture_doc_names_every_root_field_a_worker_carries():
    assert not differences(DOC.read_text())


def test_a_field_missing_from_the_table_is_seen():
    text = DOC.read_text().replace("`rollout.request_timeout`, ", "", 1)
    assert differences(text) == {
        "RolloutWorkerConfig": {"undocumented": ["rollout.request_timeout"], "not declared": []}
    }
