"""Workers forked from the worker template (cluster.fork_workers) on real processes: they look
and behave like fresh ones, their exits reach the launcher, and a dead template costs a restart,
not the run. A shared template (cluster.worker_template) serves launch after launch, takes a gone
launcher's workers with it, and turns away a launch it cannot serve."""

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from helpers.dummy_worker import DummyWorkerConfig
from helpers.paths import TESTS_DIR
from helpers.wait import stop_process, wait_for
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve, names
from realhf.scheduler.local import LocalLauncher, WorkerFailedError, WorkerSpec
from realhf.scheduler.watchdog import MARKER_ENV
from realhf.scheduler.worker_process import WORKER_COMMAND
from realhf.scheduler.worker_spec import DEFAULT_WORKER_ENV
from realhf.scheduler.worker_template import WorkerTemplate

pytestmark = pytest.mark.system

DUMMY = "helpers.dummy_worker:DummyWorker"


def _launcher(tmp_path, trial, **kwargs):
    return LocalLauncher(
        "dummies",
        trial,
        str(tmp_path),
        NameResolveConfig(keepalive_ttl=2.0),
        startup_timeout=60,
        user_paths=[TESTS_DIR],
        **kwargs,
    ).start()


def _registered(launcher, n):
    root = names.worker_root("dummies", launcher.trial_name)
    wait_for(lambda: len(name_resolve.find_subtree(root)) >= n, 60, f"{n} dummy workers to register")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _template(launcher) -> psutil.Process:
    return psutil.Process(launcher._template.pid)


def test_forked_workers_look_like_fresh_ones_and_nothing_outlives_the_launcher(tmp_path, no_leftover_processes):
    launcher = _launcher(tmp_path, "forked")
    try:
        configs = [
            DummyWorkerConfig(log_numpy_draw=True, spawn_grandchild=True),
            DummyWorkerConfig(log_numpy_draw=True),
        ]
        launcher.submit(WorkerSpec("dummy", 2, configs, worker_class=DUMMY))
        _registered(launcher, 2)
        template = _template(launcher)
        assert "realhf.apps.worker_template" in " ".join(template.cmdline())
        assert str(tmp_path) in " ".join(template.cmdline())  # which trial's it is
        draws = []
        for index, pid in enumerate(launcher.worker_pids().values()):
            worker = psutil.Process(pid)
            assert worker.ppid() == template.pid  # forked, not a fresh interpreter
            config_path = os.path.join(launcher.log_dir, "configs", f"dummy-{index}.yaml")
            assert worker.cmdline() == [sys.executable, *WORKER_COMMAND, config_path]  # as a fresh worker's
            assert os.getsid(pid) == pid  # its own session: the launcher stops its whole group
            assert worker.cwd() == launcher.launch_dir
            assert worker.environ()[MARKER_ENV] == launcher.marker  # the watchdog's sweep finds it
            log_path = os.path.join(launcher.log_dir, f"dummy-{index}.log")
            # It registers before it configures: the line may come a moment after the registration.
            wait_for(lambda p=log_path: "configured; running" in _read(p), 10, f"{log_path} to say configured")
            log = _read(log_path)
            draws.append(re.search(r"numpy draw (\d+)", log).group(1))
        assert draws[0] != draws[1], "forked workers share one numpy RandomState"
        pids = [*launcher.worker_pids().values(), template.pid]
    finally:
        launcher.stop_all()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_exit_codes_and_signals_of_forked_workers_reach_the_launcher(tmp_path, no_leftover_processes):
    launcher = _launcher(tmp_path, "codes")
    try:
        configs = [DummyWorkerConfig(exit_after=0.5, exit_code=3), DummyWorkerConfig()]
        launcher.submit(WorkerSpec("dummy", 2, configs, worker_class=DUMMY))
        with pytest.raises(WorkerFailedError, match="exited with code 3"):
            launcher.wait(timeout=60)
    finally:
        launcher.stop_all()
    launcher = _launcher(tmp_path, "killed")
    try:
        launcher.submit(WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class=DUMMY))
        _registered(launcher, 1)
        os.kill(launcher.worker_pids()["dummy/0"], signal.SIGKILL)
        with pytest.raises(WorkerFailedError, match=r"exited with code -9 \(SIGKILL\)"):
            launcher.wait(timeout=60)
    finally:
        launcher.stop_all()


def test_a_dead_template_costs_its_workers_a_restart_with_a_fresh_interpreter(tmp_path, no_leftover_processes):
    launcher = _launcher(tmp_path, "template-dies")
    try:
        spec = WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class=DUMMY, restart=True, restart_backoff=0.1)
        launcher.submit(spec)
        _registered(launcher, 1)
        first = launcher.worker_pids()["dummy/0"]
        _template(launcher).kill()

        # The worker dies with it (PR_SET_PDEATHSIG); the launcher restarts it without the template.
        def restarted_pid():
            assert launcher._check_workers() is None  # the supervisor's loop: a death, then its restart
            return launcher.worker_pids()["dummy/0"] != first

        wait_for(restarted_pid, 30, "the dummy worker to be restarted", interval=0.2)
        restarted = psutil.Process(launcher.worker_pids()["dummy/0"])
        assert restarted.ppid() == os.getpid()  # a fresh interpreter, started by the launcher itself
        assert "-m realhf.apps.remote worker --config" in " ".join(restarted.cmdline())
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    finally:
        launcher.stop_all()
    log = open(os.path.join(launcher.log_dir, "dummy-0.log")).read()
    assert "restart 1 of dummy/0" in log


def test_without_fork_workers_each_worker_is_a_fresh_interpreter(tmp_path, no_leftover_processes):
    launcher = _launcher(tmp_path, "exec", fork_workers=False)
    try:
        launcher.submit(WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class=DUMMY))
        _registered(launcher, 1)
        assert launcher._template is None
        assert psutil.Process(launcher.worker_pids()["dummy/0"]).ppid() == os.getpid()
    finally:
        launcher.stop_all()


def test_a_template_that_does_not_answer_in_time_is_killed_and_forks_nothing(tmp_path, no_leftover_processes):
    # The generation server's imports (torch, transformers) take seconds: far more than the 1 s
    # this template is given to answer (or, on a starved host, to be ready at all).
    template = WorkerTemplate(dict(os.environ, **DEFAULT_WORKER_ENV), os.getcwd(), str(tmp_path / "t.log"), 1.0).start()
    try:
        config = str(tmp_path / "configs" / "generation_server-0.yaml")
        child = template.fork(
            "generation_server", config, str(tmp_path / "w.log"), "", dict(os.environ), os.getcwd(), sys.executable
        )
        assert child is None  # the launcher starts this worker afresh
        psutil.Process(template.pid).wait(timeout=10)  # killed: it is never asked again
        assert (
            template.fork("rollout_worker", config, str(tmp_path / "w.log"), "", {}, os.getcwd(), sys.executable)
            is None
        )
        time.sleep(1)  # a fork it had begun would have its command line by now
        assert not [p for p in psutil.process_iter(["cmdline"]) if config in " ".join(p.info["cmdline"] or [])]
    finally:
        template.close()


# ---- a shared template (cluster.worker_template) --------------------------------------------------


@pytest.fixture
def shared_template():
    """A template listening on its own socket, as `python -m realhf.apps.worker_template --listen`
    runs for a user (a short path: a Unix socket's address holds 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="realhf-wt-")
    path = os.path.join(folder, "sock")
    # As documented (docs/quickstart.md): no environment of its own; it takes a launcher's workers' one.
    proc = subprocess.Popen(
        [sys.executable, "-m", "realhf.apps.worker_template", "--listen", path],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(lambda: os.path.exists(path) or proc.poll() is not None, 30, f"the template's socket {path}")
    try:
        yield path, proc
    finally:
        stop_process(proc)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_shared_template_forks_for_launch_after_launch_and_outlives_them(tmp_path, shared_template):
    path, proc = shared_template
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # a connection runs code as this user: only theirs
    assert psutil.Process(proc.pid).cmdline() == [sys.executable, "-m", "realhf.apps.worker_template", "--listen", path]
    pids = []
    for trial in ("first", "second"):
        launcher = _launcher(tmp_path, trial, worker_template=path)
        try:
            assert launcher._template.shared and launcher._template.pid == proc.pid
            launcher.submit(WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class=DUMMY))
            _registered(launcher, 1)
            worker = psutil.Process(launcher.worker_pids()["dummy/0"])
            assert worker.ppid() == proc.pid  # forked by the shared template
            config_path = os.path.join(launcher.log_dir, "configs", "dummy-0.yaml")
            assert worker.cmdline() == [sys.executable, *WORKER_COMMAND, config_path]
            assert worker.cwd() == launcher.launch_dir and os.getsid(worker.pid) == worker.pid
            pids.append(worker.pid)
        finally:
            launcher.stop_all()
        assert not os.path.exists(os.path.join(launcher.log_dir, "worker_template.log"))  # it started none of its own
        assert proc.poll() is None  # the shared template serves on
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    # A built-in worker type's modules are imported for the first launch that forks one, never again.
    env = {**os.environ, **DEFAULT_WORKER_ENV}
    warm = []
    for _ in range(2):
        template = WorkerTemplate.attach(path, env)
        config = str(tmp_path / "configs" / "missing.yaml")  # the worker fails at once: only its fork counts
        child = template.fork("gserver_manager", config, str(tmp_path / "w.log"), "", env, os.getcwd(), sys.executable)
        assert child.wait(timeout=60) != 0
        warm.append(child.warm_s)
        template.close()
    assert warm[0] > 0 and warm[1] == 0, warm


def test_a_launcher_whose_connection_ends_loses_its_workers_to_the_shared_template(tmp_path, shared_template):
    path, proc = shared_template
    launcher = _launcher(tmp_path, "gone", worker_template=path)
    try:
        launcher.submit(WorkerSpec("dummy", 2, [DummyWorkerConfig(), DummyWorkerConfig()], worker_class=DUMMY))
        _registered(launcher, 2)
        workers = [psutil.Process(pid) for pid in launcher.worker_pids().values()]
        # What the kernel does to a SIGKILLed launcher's sockets: the template sees the connection end.
        launcher._template._channel.shutdown(socket.SHUT_RDWR)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, [p.pid for p in alive]
        assert proc.poll() is None
    finally:
        launcher.stop_all()


def test_a_launch_the_shared_template_cannot_serve_starts_its_own(tmp_path, shared_template, monkeypatch):
    path, proc = shared_template
    # An interpreter reads PYTHONHASHSEED as it starts: the template's imports are not this launch's.
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert WorkerTemplate.attach(path, {**os.environ, **DEFAULT_WORKER_ENV}) is None
    launcher = _launcher(tmp_path, "refused", worker_template=path)
    try:
        assert not launcher._template.shared
        launcher.submit(WorkerSpec("dummy", 1, [DummyWorkerConfig()], worker_class=DUMMY))
        _registered(launcher, 1)
        assert psutil.Process(launcher.worker_pids()["dummy/0"]).ppid() == launcher._template.pid
    finally:
        launcher.stop_all()
    monkeypatch.delenv("PYTHONHASHSEED")
    # Nothing listens on this path: the launch starts its own template at once.
    start = time.monotonic()
    assert WorkerTemplate.attach(str(tmp_path / "none.sock"), dict(os.environ)) is None
    assert time.monotonic() - start < 5
    assert proc.poll() is None


def test_a_second_template_on_a_live_socket_is_refused_and_a_dead_ones_socket_is_taken_over(shared_template):
    path, proc = shared_template
    second = subprocess.run(
        [sys.executable, "-m", "realhf.apps.worker_template", "--listen", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0 and f"another template already listens on {path}" in second.stderr
    proc.kill()
    proc.wait(timeout=10)
    assert os.path.exists(path)  # SIGKILLed: it could not remove its socket
    env = {**os.environ, **DEFAULT_WORKER_ENV}
    third = subprocess.Popen([sys.executable, "-m", "realhf.apps.worker_template", "--listen", path])
    try:
        # Refused (None) until it listens: the dead template's socket file is there meanwhile.
        template = wait_for(lambda: WorkerTemplate.attach(path, env, timeout=10), 30, "the new template", interval=0.5)
        assert template.pid == third.pid
        template.close()
    finally:
        third.terminate()
        assert third.wait(timeout=10) == 128 + signal.SIGTERM
    assert not os.path.exists(path)  # a template that is stopped removes its socket
