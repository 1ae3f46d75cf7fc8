"""Drive training/main_async_ppo.py as a subprocess, the way a user runs it, and look at what it
left: its metrics (read with `realhf.base.trial_files.read_metrics`), its logs, its processes.

`run_training` runs to the end; `Run` starts a run and lets a test poke at it from outside while
it goes (kill workers, read the manager's /status), then check that nothing it started is left.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from helpers import shared_template
from helpers.http import http
from helpers.paths import REPO
from helpers.wait import record_wait, wait_for
from realhf.base.trial_files import TrialFiles, read_metrics

EXPERIMENT = "async-ppo"  # training/configs/async-ppo.yaml's experiment_name

# Small and quick: 4 prompt groups of 4 answers per step, one rollout worker (a second one costs
# ≈ 1.8 s of CPU a run on two cores and adds nothing a test of one worker's path needs).
SMALL_RUN = [
    "groups_per_step=4",
    "group_size=4",
    "max_concurrent_rollouts=8",
    "evaluation.n_prompts=0",
    "ppo.gen.max_new_tokens=24",
    "rollout.n_workers=1",
]


def small_run(rollout_workers: int) -> List[str]:
    """SMALL_RUN with `rollout_workers` rollout workers (a trainer at DP=n needs at least n)."""
    return [o for o in SMALL_RUN if not o.startswith("rollout.n_workers=")] + [f"rollout.n_workers={rollout_workers}"]


# PPO with a critic as the README shows it (the critic's value head starts random: a larger LR).
CRITIC_RUN = ["ppo.adv_estimator=gae", "ppo.adv_norm=true", "critic.optimizer.lr=5e-4", "evaluation.n_prompts=0"]


def trial_log_dir(tmp_path, trial) -> Path:
    """Where a run with `cluster.fileroot=tmp_path` writes its logs and metrics.jsonl."""
    return Path(TrialFiles(str(tmp_path), EXPERIMENT, trial).log_dir)


def trial_processes(marker: str):
    """(pid, cmdline) of every realhf process whose command line contains `marker` (e.g. tmp_path)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if "realhf" in cmd and marker in cmd:
            found.append((p.pid, cmd))
    return found


# The YAML's paths, relative to the repository root: a run launched elsewhere names them absolute.
EMBEDDED_PATHS = {
    "actor.path": "assets/tiny-math/sft",
    "dataset.path": "assets/tiny-math/data/train.jsonl",
    "dataset.test_path": "assets/tiny-math/data/test.jsonl",
}


def training_command(tmp_path, trial, *overrides, launch_dir=REPO):
    """The command line of a run launched from `launch_dir` (a user's own folder: the script and
    the embedded task named by their absolute paths)."""
    # The suite's expectations are CPU numbers: on a machine with a GPU, `auto` would take it.
    device = [] if any(o.startswith("cluster.device=") for o in overrides) else ["cluster.device=cpu"]
    # Workers fork from the session's shared template (helpers.shared_template) unless the test
    # says how its workers start (`cluster.worker_template=` for the launch's own template).
    own = ("cluster.fork_workers=", "cluster.worker_template=", "cluster.launcher=")
    template = (
        [] if any(o.startswith(own) for o in overrides) else [f"cluster.worker_template={shared_template.address()}"]
    )
    script, paths = "training/main_async_ppo.py", []
    if os.path.abspath(launch_dir) != os.path.abspath(REPO):
        script = os.path.join(REPO, script)
        paths = [
            f"{key}={os.path.join(REPO, path)}"
            for key, path in EMBEDDED_PATHS.items()
            if not any(o.startswith(f"{key}=") for o in overrides)
        ]
    return [
        sys.executable,
        script,
        f"trial_name={trial}",
        f"cluster.fileroot={tmp_path}",
        *device,
        *template,
        *paths,
        *overrides,
    ]


def check_finished_run(proc, metrics, steps, eta, tmp_path) -> None:
    """A run that ended well: exit 0, every step in metrics.jsonl, the staleness bound held, new
    weights reached the generation servers, the report printed, and no process left behind."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), out[-3000:]
    # No trained group was more than η versions behind the trainer.
    assert max(m["head_offpolicyness_max"] for m in metrics) <= eta
    # Weight updates reached the generation server: late batches hold no version-0 tokens.
    last = metrics[-1]
    assert last["version"] == steps
    assert last["version"] - last["head_offpolicyness_max"] >= steps - eta > 0
    assert "reward curve" in proc.stdout
    # Piped output: the curves PNG is saved, and no progress bar is drawn (test_watching_a_run.py: a terminal).
    assert "reward and accuracy curves (PNG): " in proc.stdout and " ETA " not in proc.stdout
    check_accounting(tmp_path, out)
    assert trial_processes(str(tmp_path)) == []


def check_accounting(tmp_path, out: str = "") -> List[dict]:
    """Every run under tmp_path accounted for every admitted group (realhf.system.manager.admission_ledger):
    each one the manager counted accepted reached the trainer, and the trainer's counts balance."""
    found = [json.loads(p.read_text()) for p in sorted(Path(tmp_path).rglob("accounting.json"))]
    assert found, f"no accounting.json under {tmp_path}:\n{out[-3000:]}"
    for a in found:
        assert a["holds"] and a["lost"] == 0, a
        assert a["admissions"] == a["accepted"] + sum(a["ended"].values()) + a["abandoned"] + a["running"], a
    return found


def reward_gain(metrics, n=20):
    """(mean reward of the first n steps, of the last n)."""
    first = sum(m["reward_mean"] for m in metrics[:n]) / n
    final = sum(m["reward_mean"] for m in metrics[-n:]) / n
    print(f"reward: first {n} steps {first:+.3f}, last {n} steps {final:+.3f}")
    return first, final


def success_thirds(metrics):
    """(mean training success rate over the first third of the steps, over the last third):
    ~33 steps a side at 100 steps, whose per-step spread (0.06-0.09 measured) averages to ~0.015."""
    k = len(metrics) // 3
    first = sum(m["success_rate"] for m in metrics[:k]) / k
    last = sum(m["success_rate"] for m in metrics[-k:]) / k
    print(f"success rate: first {k} steps {first:.3f}, last {k} steps {last:.3f}")
    return first, last


def run_training(tmp_path, trial, *overrides, timeout=900, env=None, launch_dir=REPO):
    """Run to the end, launched from `launch_dir`; returns (CompletedProcess, metrics.jsonl rows,
    the trial's log dir)."""
    start = time.monotonic()
    proc = subprocess.run(
        training_command(tmp_path, trial, *overrides, launch_dir=launch_dir),
        cwd=launch_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    record_wait(time.monotonic() - start, timeout, f"run {trial} to its end")
    log_dir = trial_log_dir(tmp_path, trial)
    return proc, read_metrics(log_dir), log_dir


class Run:
    """`python training/main_async_ppo.py` in its own process; output collected in a file."""

    def __init__(self, tmp_path, trial: str, *overrides: str, own_process_group: bool = False):
        self.tmp_path, self.trial = tmp_path, trial
        self.log_dir = trial_log_dir(tmp_path, trial)
        self.out_path = tmp_path / f"{trial}.out"
        self._out = open(self.out_path, "w")
        # own_process_group: like a job in a terminal, so a Ctrl-C can reach the whole group.
        self.proc = subprocess.Popen(
            training_command(tmp_path, trial, *overrides),
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=own_process_group,
        )
        self.seen: Dict[int, tuple] = {}  # every descendant seen while running: pid -> (cmdline, create_time)

    # ---- observation --------------------------------------------------------------------------
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def metrics(self) -> List[dict]:
        return read_metrics(str(self.log_dir))

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _descendants(self) -> List[psutil.Process]:
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        # Workers forked from a shared template are its children, not the launcher's: found by
        # their config files, under this run's log dir.
        for pid, _ in trial_processes(str(self.log_dir)):
            try:
                worker = psutil.Process(pid)
                found += [worker, *worker.children(recursive=True)]
            except psutil.Error:
                pass
        return found

    def track(self) -> None:
        """Remember every descendant (workers, redis-server, grader pools) for the final check."""
        try:
            for p in self._descendants():
                try:
                    cmd, created = " ".join(p.cmdline()), p.create_time()
                except psutil.Error:
                    continue
                known = self.seen.get(p.pid)
                # A child caught between fork and exec shows no command line yet, or its parent's
                # (the launcher's): the same process (same start time) gets its own after exec.
                if known is None or (known[1] == created and cmd and cmd != known[0]):
                    self.seen[p.pid] = (cmd, created)
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
        """Poll `predicate()` until it returns something truthy; fail naming `what`, with the run's output."""

        def observed():
            self.track()
            value = predicate()
            if not value and self.proc.poll() is not None:
                raise AssertionError(
                    f"the run ended (code {self.proc.returncode}) while waiting for {what}:\n{self.output()[-4000:]}"
                )
            return value

        try:
            return wait_for(observed, timeout, what, interval)
        except TimeoutError as e:
            raise TimeoutError(f"{e}:\n{self.output()[-4000:]}") from None

    def wait_steps(self, n: int, timeout: float = 600) -> None:
        self.wait_for(f"{n} train steps", lambda: len(self.metrics()) >= n, timeout)

    def manager_url(self) -> str:
        urls = re.findall(r"serving on (http://\S+):", self.log("gserver_manager-0"))
        assert urls, "the manager never logged its URL"
        return urls[-1]  # the latest incarnation

    def secret(self) -> str:
        """The trial's shared secret, as the launcher handed it to its workers (their config files)."""
        from omegaconf import OmegaConf

        return str(OmegaConf.load(self.log_dir / "configs" / "gserver_manager-0.yaml").context.secret)

    def redis(self):
        """A client of the run's Redis (its name resolve), from the URL the launcher handed its workers."""
        import redis
        from omegaconf import OmegaConf

        config = OmegaConf.load(self.log_dir / "configs" / "gserver_manager-0.yaml")
        return redis.Redis.from_url(str(config.context.name_resolve.redis_url), decode_responses=True)

    def auth(self) -> dict:
        """Headers that authenticate a request to the run's manager or servers."""
        from realhf.base.secret import auth_headers

        return auth_headers(self.secret())

    def manager_status(self) -> Optional[dict]:
        try:
            status, body = http("GET", f"{self.manager_url()}/status", timeout=10, headers=self.auth())
        except OSError:
            return None
        return body if status == 200 else None

    def server_url(self, index: int) -> str:
        urls = re.findall(r"at (http://\S+); registered", self.log(f"generation_server-{index}"))
        assert urls, f"generation_server-{index} never registered"
        return urls[-1]  # the latest incarnation

    # ---- the end ------------------------------------------------------------------------------
    def finish(self, timeout: float = 900) -> int:
        """The run's exit code; fails naming the steps done and the output's end if it is still
        running after `timeout` s (the caller's `stop` then ends it)."""
        start = time.monotonic()
        deadline = start + timeout
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                self.track()
                time.sleep(0.5)
            if self.proc.poll() is None:
                raise AssertionError(
                    f"the run did not end within {timeout:.0f}s ({len(self.metrics())} steps done):\n"
                    + self.output()[-4000:]
                )
            record_wait(time.monotonic() - start, timeout, f"run {self.trial} to its end")
            return self.proc.returncode
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
