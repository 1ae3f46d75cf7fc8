"""The launcher's watchdog: nothing a trial started outlives the launcher, grandchildren included.

PR_SET_PDEATHSIG takes a worker down with a SIGKILLed launcher, but not the worker's own
children (a grader pool, a sandbox), which are re-parented and live on. So at start the launcher
spawns this tiny process in a session of its own (no PDEATHSIG: it must survive the launcher)
with the read end of a pipe as its stdin. The launcher writes `+<pgid>` for every process group
it starts (each worker leads its own session; Redis too) and `-<pgid>` for a group it has
reaped. When the pipe reaches EOF — the launcher closed it at the end of `stop_all`, or died —
the watchdog SIGKILLs every recorded group and every process whose environment carries the
trial's marker (`REALHF_TRIAL=<marker>`, in every worker's environment and so inherited by
their children), then exits.

Limits: a descendant that both leaves its process group (setsid) and clears its environment is
invisible to both sweeps and escapes. A recorded group whose processes all ended long before the
sweep could, after the kernel's pid numbers wrapped around, name an unrelated group; the
launcher forgets a group it has killed for a restart to keep that window small.

    python -m realhf.scheduler.watchdog MARKER     (stdin: the launcher's pipe)
"""

import os
import signal
import subprocess
import sys
from typing import IO, Dict, List, Optional, Set

import psutil

MARKER_ENV = "REALHF_TRIAL"


def _marked(marker: str) -> List[psutil.Process]:
    """Live processes of this user whose environment has REALHF_TRIAL=<marker> or
    <marker>/<anything> (the Ray launcher marks each worker <trial marker>/<worker>)."""
    found, me, uid = [], os.getpid(), os.getuid()
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            if p.pid == me or (p.info["uids"] and p.info["uids"].real != uid):
                continue
            value = p.environ().get(MARKER_ENV, "")
            if (value == marker or value.startswith(marker + "/")) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):  # gone, or not ours to read
            continue
    return found


def _kill_exact(processes: Dict[int, float]) -> int:
    """SIGKILL each recorded process that is still the same one (pid and start time)."""
    killed, me = 0, os.getpid()
    for pid, created in processes.items():
        if pid == me:
            continue
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()
                killed += 1
        except psutil.Error:
            pass
    return killed


def sweep(marker: str, pgids: Set[int], passes: int = 5, processes: Optional[Dict[int, float]] = None) -> int:
    """SIGKILL the groups, the recorded processes and the marked processes; repeat while
    something was found (a process may fork between the scan and the kill). Returns how many
    processes were killed."""
    killed = _kill_exact(processes or {})
    own = os.getpgid(0)
    for pgid in pgids:
        if pgid not in (own, 0, 1):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for _ in range(passes):
        procs = _marked(marker)
        if not procs:
            break
        for p in procs:
            try:
                p.kill()
                killed += 1
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=1)
    return killed


def serve(marker: str, pipe: IO[str]) -> None:
    """Record groups from `pipe` until EOF, then sweep."""
    pgids: Set[int] = set()
    processes: Dict[int, float] = {}
    for line in pipe:
        line = line.strip()
        try:
            if line.startswith("+"):
                pgids.add(int(line[1:]))
            elif line.startswith("-"):
                pgids.discard(int(line[1:]))
            elif line.startswith("="):
                pid, created = line[1:].split(":")
                processes[int(pid)] = float(created)
        except ValueError:
            continue
    sweep(marker, pgids, processes=processes)


class Watchdog:
    """The launcher's end of the pipe."""

    def __init__(self, marker: str):
        self.marker = marker
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}  # it must not sweep itself
        self._proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", "realhf.scheduler.watchdog", marker], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=None, env=env, text=True, start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def _send(self, line: str) -> None:
        if self._proc is None:
            return
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # the watchdog died: the launcher's own clean-up still runs
            pass

    def track(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def track_process(self, pid: int, create_time: float) -> None:
        """Kill this one process at the sweep, if it is still the same (pid and start time): for
        processes that rewrite their environment block (setproctitle), so carry no readable marker."""
        self._send(f"={pid}:{create_time!r}")

    def close(self, timeout: float = 10.0) -> None:
        """EOF: the watchdog sweeps and exits; wait for it."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    serve(sys.argv[1], sys.stdin)


if __name__ == "__main__":
    main()
