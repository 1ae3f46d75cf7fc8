"""The code stays lint-clean and formatted (ruff.toml): what CI runs is what a contributor's
pre-commit hook runs (.pre-commit-config.yaml), with the same pinned ruff (setup.py's test extra)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO


def _ruff() -> list:
    # The venv's own ruff first: the pinned version formats the same way everywhere.
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: `pip install -e .[test]` installs the pinned one")
    return [exe]


@pytest.mark.parametrize(
    "args", [["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]], ids=["check", "format"]
)
def test_ruff_is_clean(args):
    r = subprocess.run(_ruff() + args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]


def test_test_files_have_unique_names():
    # pytest imports test modules by basename (rootdir-relative, no packages): two files of one
    # name stop the whole suite at collection.
    seen: dict = {}
    for root in ("tests", "examples"):
        for path in sorted(Path(REPO, root).rglob("test_*.py")):
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
