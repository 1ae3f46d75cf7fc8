"""Child processes that never outlive their parent, and killing whole process trees."""

import ctypes
import os
import signal
from typing import Iterable, List, Sequence

import psutil

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` for subprocess.Popen: the kernel SIGKILLs the child when its parent dies.

    This is the last line of defence when the parent itself is SIGKILLed and cannot clean up.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: rely on the parent's own clean-up
        pass


def set_command_line(args: Sequence[str]) -> bool:
    """Show this process as `args` in /proc/<pid>/cmdline (ps, psutil): written over the memory of
    the command line it was started with, which must be longer; False (nothing changed) if it is
    not, or not on Linux.

    The bytes after the new line are not NULs but spaces, and its own terminating NUL comes before
    the end of that memory: the kernel then reads the line as a title (up to that NUL, as for
    setproctitle(3)) and psutil splits it on spaces, so no empty arguments trail it.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
    except (OSError, IndexError, ValueError):
        return False
    line = " ".join(args).encode()
    if len(line) + 2 > end - start:
        return False
    ctypes.memmove(start, line + b"\0" + b" " * (end - start - len(line) - 1), end - start)
    return True


def process_tree(pid: int) -> List[psutil.Process]:
    """The process and all its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def session_members(sid: int) -> List[int]:
    """Pids of the processes in session `sid`. A child started with `start_new_session` leads
    one, and what it started stays in it once the leader is gone: orphans that a walk of the
    leader's tree no longer finds."""
    pids = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                pids.append(p.pid)
        except OSError:  # gone meanwhile
            pass
    return pids


def kill_process_trees(pids: Iterable[int], timeout: float = 5.0) -> List[psutil.Process]:
    """SIGTERM every process of the trees, SIGKILL what is left after `timeout` s.

    Returns the processes that could not be killed (normally none).
    """
    procs: List[psutil.Process] = []
    for pid in pids:
        procs.extend(process_tree(pid))
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=2.0)
    return alive


def pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
