"""Watching a run the way a user does: `python training/main_async_ppo.py` in a terminal (a real
pseudo-terminal) draws the progress bar below the master's echoed lines, and the run ends with
the curves PNG in its log directory. (Piped output — no bar — is checked by every run of
test_async_ppo_run.py.)"""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

import pytest
from PIL import Image

from helpers.paths import REPO
from helpers.training_runs import SMALL_RUN, training_command, trial_log_dir

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def run_in_terminal(cmd, timeout: float, columns: int = 220) -> tuple:
    """(exit code, everything it wrote) of `cmd` with a pseudo-terminal as stdin/stdout/stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns))
    for var in ("CI", "GITHUB_ACTIONS", "NO_COLOR", "TTY_COMPACT", "TTY_INTERACTIVE"):
        env.pop(var, None)  # rich treats these as "not interactive"
    proc = subprocess.Popen(cmd, cwd=REPO, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal closed it
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out.decode(errors="replace")


@pytest.mark.e2e
@pytest.mark.slow  # 40-43 s here (machine loaded); CI keeps the piped-output checks of test_async_ppo_run.py
def test_a_run_in_a_terminal_shows_the_progress_bar_and_saves_the_curves_png(tmp_path, no_leftover_processes):
    steps = 4
    code, raw = run_in_terminal(
        training_command(tmp_path, "tty", *SMALL_RUN, f"exp_ctrl.benchmark_steps={steps}"), timeout=300
    )
    text = ANSI.sub("", raw)
    assert code == 0, text[-4000:]
    # The bar, drawn live: its final state, and a state before it.
    assert re.search(
        rf"train .*{steps}/{steps} ETA 0:00:00 reward [+-]\d\.\d{{3}} \| acc \d\.\d{{3}} \| "
        r"[\d.]+ samples/s \| stale \d\.\d\d \(max \d\)",
        text,
    ), text[-4000:]
    assert re.search(rf"train .* [0-{steps - 1}]/{steps} ETA", text), text[-4000:]
    # The master's per-step lines still reach the terminal (above the bar), and the report follows it.
    assert f"step {steps} v{steps}" in text and "reward curve" in text
    png = trial_log_dir(tmp_path, "tty") / "curves.png"
    assert f"reward and accuracy curves (PNG): {png}" in text
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size == (800, 600)
