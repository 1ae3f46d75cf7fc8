"""One trial, one run: an exclusive lock that a run holds on its trial for as long as it lives.

Why flock: the kernel releases an `fcntl.flock` lock when the holder's file is closed, which
happens however it dies (kill -9 included). A lock file left by a dead run is therefore not
locked: the next run simply takes it over and overwrites the record in it, with no stale-lock
clean-up and no pid guessing. `release()` unlocks and deletes nothing: unlinking the file would
let one launch lock the old file while another locks a new one of the same name.

Limit: on a network file system shared by several machines the lock is only as good as that file
system's flock (NFSv4 emulates it with server-held byte-range locks; some mounts lock only on the
local machine). A multi-node run's run directory must be on a shared file system anyway
(docs/architecture.md §12.7).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time

import psutil


class TrialLockedError(RuntimeError):
    """The trial is held by a run that is still alive."""


class TrialLock:
    """`with TrialLock(path): ...` holds the lock; the file records {host, pid, started, cmdline}."""

    def __init__(self, path: str):
        self.path, self._fd = str(path), None

    def acquire(self) -> "TrialLock":
        """Lock, or raise TrialLockedError naming the live holder; a dead holder's lock is taken over."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # close-on-exec: workers do not hold it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise TrialLockedError(
                f"this trial is already running: pid {holder.get('pid')} on host {holder.get('host')}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('started', 0)))} "
                f"({holder.get('cmdline')}), holds its lock {self.path}. Wait for that run to end, stop it "
                f"(`kill {holder.get('pid')}` on {holder.get('host')}), or choose another trial_name"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        data = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
                "cmdline": shlex.join([sys.executable, *sys.argv]),
            }
        ).encode()
        # Write, then cut: a reader in between sees this record and the old tail, and reads only
        # the first JSON value.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "TrialLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> dict:
    """The lock holder's record. It writes it right after locking: until then the file is empty or
    holds a dead run's record, so give it a moment."""
    record = {}
    for _ in range(10):
        try:
            record, _ = json.JSONDecoder().raw_decode(os.pread(fd, 65536, 0).decode(errors="replace"))
            if record["host"] != socket.gethostname() or psutil.pid_exists(int(record["pid"])):
                return record
        except (ValueError, KeyError, TypeError):
            pass
        time.sleep(0.1)
    return record if isinstance(record, dict) else {}
