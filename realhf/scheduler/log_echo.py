"""Worker logs seen from the launcher: the tail printed with a failure, and the echo of some
workers' new lines (the master's progress) to the launcher's console."""

import os
import sys
import threading
from typing import Callable, Dict


def log_tail(path: str, n_lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(lines[-n_lines:])


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class LogEcho(threading.Thread):
    """Copies new lines of some worker logs to `write` (stdout, or the launcher's progress view),
    so a user sees the master's progress."""

    def __init__(self, write: Callable[[str], None] = write_stdout):
        super().__init__(name="log-echo", daemon=True)
        self.write = write
        self._offsets: Dict[str, int] = {}
        self._stop_event = threading.Event()

    def add(self, path: str, offset: int = 0):
        """Echo `path` from byte `offset` on: a worker's log is appended to by each launch, and a
        restarted trial (or a resumed run) must not print the earlier launches' lines again."""
        self._offsets.setdefault(path, offset)

    def run(self):
        while not self._stop_event.is_set():
            self._drain(self._offsets)
            self._stop_event.wait(0.2)
        self._drain(self._offsets)

    def _drain(self, offsets):
        for path in list(offsets):
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    # Only whole lines; a partial last line waits for the next round.
                    cut = data.rfind(b"\n") + 1
                    offsets[path] = offsets.get(path, 0) + cut
                if cut:
                    self.write(data[:cut].decode(errors="replace"))
            except FileNotFoundError:
                continue

    def stop(self):
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=2)
