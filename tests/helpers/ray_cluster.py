"""Ray clusters of several nodes on this machine, and the processes a Ray run may leave.

`three_nodes()` is a real Ray cluster (`ray.cluster_utils.Cluster`): a head and two added nodes,
each with one CPU and a custom resource (`node_a`, `node_b`) so workers can be pinned to it.
`unshared_node()` adds a node started by `ray start` inside a mount namespace of its own, where
a tmpfs hides the given directory: a node that does not share `cluster.fileroot`.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Dict, Iterator, List, Tuple

import psutil

from helpers.wait import wait_for

MARKER_ENV = "REALHF_TRIAL"


def ray_processes() -> Dict[int, str]:
    """pid -> command line of every Ray daemon and Ray worker process on this machine."""
    found = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if cmd.startswith("ray::") or "site-packages/ray/" in cmd:
            found[p.pid] = cmd
    return found


def marked_processes(marker: str) -> List[Tuple[int, str]]:
    """(pid, command line) of live processes that carry the trial marker of the launch whose
    marker is `marker` (every worker and its children do — under Ray `<marker>/<worker>` — and
    so do the daemons of a Ray cluster the launcher started). Another launch's (a test beside
    this one) carry markers of their own."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            value = p.environ().get(MARKER_ENV)
            if value is not None and value.split("/")[0] == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append((p.pid, " ".join(p.info["cmdline"] or [])))
        except (psutil.Error, OSError):
            continue
    return found


def launch_marker(worker_pid: int) -> str:
    """The trial marker of the launch that started the live worker `worker_pid`."""
    return psutil.Process(worker_pid).environ()[MARKER_ENV].split("/")[0]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:  # gone, or a zombie
        return False


def wait_gone(pids, what: str, timeout: float = 30.0) -> List[int]:
    """The pids of `pids` still alive (zombies do not count) after up to `timeout` s."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if _alive(p)]
        if not procs or time.monotonic() > deadline:
            return [p.pid for p in procs]
        time.sleep(0.5)


def describe(pids) -> Dict[int, str]:
    """pid -> command line (for a failure message)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = " ".join(psutil.Process(pid).cmdline())[:200]
        except psutil.Error as e:
            out[pid] = f"<{type(e).__name__}>"
    return out


@contextlib.contextmanager
def three_nodes() -> Iterator[Tuple[str, Dict[str, str]]]:
    """(address, {"node_a": node id, "node_b": node id}) of a head and two worker nodes."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        a = cluster.add_node(num_cpus=1, resources={"node_a": 1})
        b = cluster.add_node(num_cpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        yield cluster.address, {"node_a": a.node_id, "node_b": b.node_id}
    finally:
        cluster.shutdown()


@contextlib.contextmanager
def unshared_node(address: str, hidden_dir: str) -> Iterator[None]:
    """A Ray node joined to `address` that sees an empty tmpfs at `hidden_dir`."""
    os.makedirs(hidden_dir, exist_ok=True)
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    script = (
        f"mount -t tmpfs tmpfs {hidden_dir} && exec {ray_cli} start --address={address} --num-cpus=1 "
        f"--resources='{{\"unshared\": 1}}' --block"
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        import ray

        def joined():
            if proc.poll() is not None:
                raise AssertionError(f"the unshared node exited with {proc.returncode}")
            return any(n.get("Alive") and n.get("Resources", {}).get("unshared") for n in ray.nodes())

        ray.init(address=address, log_to_driver=False)
        try:
            wait_for(joined, 60, "the unshared Ray node to join")
        finally:
            ray.shutdown()
        yield
    finally:
        tree = (
            [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            if proc.poll() is None
            else []
        )
        for pid in tree:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(1)
        for pid in wait_gone(tree, "the unshared node", timeout=10):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)
