"""One shared worker template for the test session (`cluster.worker_template`): the whole runs
the suite launches fork their workers from it, so torch and transformers' model code are
imported once per session instead of once per run (≈ 4 s of one core each, ≈ 150 runs).

`address()` starts it on first use (`python -m realhf.apps.worker_template --listen`, as
docs/quickstart.md shows) and returns its socket; it ends with the session
(atexit) or with the test runner (PR_SET_PDEATHSIG). The per-launch template keeps its own tests
(tests/unit/scheduler/test_worker_template.py, tests/system/security/test_run_listeners.py).
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from helpers.wait import stop_process, wait_for
from realhf.base.process import die_with_parent

_proc: Optional[subprocess.Popen] = None
_dir = ""


def address() -> str:
    """The shared template's socket (started now if it is not running)."""
    global _proc, _dir
    if _proc is not None and _proc.poll() is None:
        return os.path.join(_dir, "template.sock")
    _dir = tempfile.mkdtemp(prefix="realhf-template-")
    path = os.path.join(_dir, "template.sock")
    with open(os.path.join(_dir, "template.log"), "ab") as log:
        _proc = subprocess.Popen(
            [sys.executable, "-m", "realhf.apps.worker_template", "--listen", path],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    wait_for(
        lambda: os.path.exists(path) or _proc.poll() is not None, 60, f"the shared worker template's socket {path}"
    )
    assert _proc.poll() is None, open(os.path.join(_dir, "template.log")).read()
    atexit.register(stop)
    return path


def pid() -> Optional[int]:
    """The shared template's pid while it runs (the leftover-process check leaves it alone)."""
    return _proc.pid if _proc is not None and _proc.poll() is None else None


def stop() -> None:
    global _proc
    if _proc is not None:
        stop_process(_proc)
        _proc = None
        shutil.rmtree(_dir, ignore_errors=True)
