"""Drive a real run of training/main_async_ppo.py and poke at it from outside (kill workers,
read the manager's /status), then check that nothing it started is left."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Dict, List, Optional

import psutil

from realhf.base.trial_files import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Small and quick: 4 prompt groups of 4 answers per step, 2 rollout workers.
SMALL_RUN = ["groups_per_step=4", "group_size=4", "max_concurrent_rollouts=8", "evaluation.n_prompts=0",
             "ppo.gen.max_new_tokens=24"]


class Run:
    """`python training/main_async_ppo.py` in its own process; output collected in a file."""

    def __init__(self, tmp_path, trial: str, *overrides: str, own_process_group: bool = False):
        self.tmp_path, self.trial = tmp_path, trial
        self.log_dir = tmp_path / "logs" / "async-ppo-math" / trial
        self.out_path = tmp_path / f"{trial}.out"
        self._out = open(self.out_path, "w")
        cmd = [sys.executable, "training/main_async_ppo.py", f"trial_name={trial}", f"cluster.fileroot={tmp_path}",
               *overrides]
        # own_process_group: like a job in a terminal, so a Ctrl-C can reach the whole group.
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=own_process_group)
        self.seen: Dict[int, tuple] = {}  # every descendant seen while running: pid -> (cmdline, create_time)

    # ---- observation --------------------------------------------------------------------------
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def metrics(self) -> List[dict]:
        return read_metrics(str(self.log_dir))

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def track(self) -> None:
        """Remember every descendant (workers, redis-server, grader pools) for the final check."""
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    self.seen.setdefault(p.pid, (" ".join(p.cmdline()), p.create_time()))
                except psutil.Error:
                    pass
        except psutil.NoSuchProcess:
            pass

    def worker_pid(self, worker: str) -> int:
        """Pid of the live worker `<type>-<index>` (e.g. generation_server-0)."""
        self.track()
        for pid, (cmd, _) in self.seen.items():
            if f"configs/{worker}.yaml" in cmd and psutil.pid_exists(pid):
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        return pid
                except psutil.NoSuchProcess:
                    pass
        raise AssertionError(f"no live process of {worker}; output:\n{self.output()[-3000:]}")

    def wait_for(self, what: str, predicate, timeout: float, interval: float = 0.5):
        """Poll `predicate()` until it returns something truthy; fail naming `what`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.track()
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (code {self.proc.returncode}) while waiting for {what}:\n"
                                     f"{self.output()[-4000:]}")
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.output()[-4000:]}")

    def wait_steps(self, n: int, timeout: float = 600) -> None:
        self.wait_for(f"{n} train steps", lambda: len(self.metrics()) >= n, timeout)

    def manager_url(self) -> str:
        m = re.search(r"serving on (http://\S+):", self.log("gserver_manager-0"))
        assert m, "the manager never logged its URL"
        return m.group(1)

    def manager_status(self) -> Optional[dict]:
        try:
            with urllib.request.urlopen(f"{self.manager_url()}/status", timeout=10) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def server_url(self, index: int) -> str:
        urls = re.findall(r"at (http://\S+); registered", self.log(f"generation_server-{index}"))
        assert urls, f"generation_server-{index} never registered"
        return urls[-1]  # the latest incarnation

    # ---- the end ------------------------------------------------------------------------------
    def finish(self, timeout: float = 900) -> int:
        try:
            while self.proc.poll() is None and timeout > 0:
                self.track()
                time.sleep(0.5)
                timeout -= 0.5
            return self.proc.wait(timeout=max(timeout, 1))
        finally:
            self._out.close()

    def stop(self) -> None:
        """Clean-up for a failed test: SIGKILL the run and everything it started."""
        self.track()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self._same_processes():
            try:
                p.kill()
            except psutil.Error:
                pass
        self._out.close()

    def _same_processes(self) -> List[psutil.Process]:
        """Seen descendants still alive (the same process: a reused pid does not count)."""
        procs = []
        for pid, (_, created) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    procs.append(p)
            except psutil.NoSuchProcess:
                pass
        return procs

    def leftovers(self, timeout: float = 10.0) -> List[str]:
        """Descendants seen during the run that are still alive `timeout` s after it ended."""
        _, alive = psutil.wait_procs(self._same_processes(), timeout=timeout)
        return [f"{p.pid}: {self.seen[p.pid][0]}" for p in alive if _not_zombie(p)]

    def kill_worker(self, worker: str, sig=signal.SIGKILL) -> int:
        pid = self.worker_pid(worker)
        os.kill(pid, sig)
        return pid


def _not_zombie(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
