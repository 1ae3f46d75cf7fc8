"""A launcher script run as its own process for a test, with its output collected: it prints
`READY {json}` once its workers are up, and more lines as it goes."""

import json
import os
import subprocess
import sys
import time
from typing import List

import psutil

from helpers.paths import TESTS_DIR


class LauncherProcess:
    def __init__(self, argv: List[str]):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        self.lines: List[str] = []

    def wait_ready(self, timeout: float = 90) -> dict:
        """The JSON of the `READY` line (AssertionError with the output so far if it never comes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith("READY "):
                return json.loads(line[len("READY ") :])
        raise AssertionError("launcher never became ready:\n" + "".join(self.lines))

    def finish(self, timeout: float = 60):
        """(exit code, all output) once the launcher exits."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines.append(out)
        return self.proc.returncode, "".join(self.lines)


def alive(pids) -> List[int]:
    """The pids among `pids` whose process still runs (not a zombie)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
