"""The shell commands the README and docs/ show, as a newcomer would copy them: read by
tests/checks/test_docs.py (each names what exists, its config validates) and
tests/system/e2e/test_docs_commands_run.py (each runs)."""

import re
from pathlib import Path

from helpers.paths import REPO

ROOT = Path(REPO)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands():
    """(page, command) for each shell command in a fenced block or in inline code."""
    found = []
    for page in PAGES:
        text = page.read_text()
        lines = []
        for block in re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", text, re.S):
            lines += block.replace("\\\n", " ").split("\n")
        lines += re.findall(r"`((?:bash|python|\.venv/bin/python|realhf-train) [^`]+)`", text)
        for line in lines:
            line = line.split(" # ")[0].split("   #")[0].strip()
            if re.match(r"^(bash|python|\.venv/bin/python|realhf-train) \S", line):
                found.append((page.relative_to(ROOT).as_posix(), line))
    return found
