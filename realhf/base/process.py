"""Child processes that never outlive their parent, and killing whole process trees."""

import ctypes
import os
import signal
from typing import Iterable, List

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
