"""Supervising a trial's workers until the end — what every launcher promises, in one place.

A launcher (`local.py`, `ray.py`) says how a worker process is started on its machine and
whatever cluster it needs; this base class does the rest the same way for both. It starts a
private redis-server when none is configured, marks the trial RUNNING, writes each worker's
config file (owner-only: it holds the trial's secret) and starts the worker (`worker_process.py`:
`python -m realhf.apps.remote worker --config …`, one log file each under the trial's log
directory), then watches exit codes and heartbeats. Success is every worker exiting 0. Any
failure — a non-zero exit, a worker that never registers, one whose heartbeat stops — marks the
trial ABORTED, stops every process within 10 s, prints which worker failed and the tail of its
log, and raises `WorkerFailedError`. SIGINT/SIGTERM to the launcher stop everything too.

Restart policy (`WorkerSpec.restart`): a worker of such a spec that dies (non-zero exit) or hangs
(heartbeat gone while alive: it is SIGKILLed first) while the trial is RUNNING is started again
with the same index and config after `restart_backoff · 2^k` s (capped at 30 s; k = its restarts
within the window); its log file gets a "restart k" marker line and is appended to. The budget is
per time window: after `max_restarts` restarts within the last `restart_window` s the next death
is a failure like any other ("N restarts within W s"); restarts older than the window no longer
count, so a long run survives rare, spaced deaths. Its old heartbeat key is deleted before the
restart, so the new process is judged by its own registration (with the full `startup_timeout`).

Errors in user code (`realhf.system.user_errors`): a rollout worker publishes the first error
from each line of the user's agent, environment or reward function, and the launcher prints it
on its console once (whichever worker saw it). A worker that exits with EXIT_DO_NOT_RESTART (one
such error failed every episode of a streak: a new process would only repeat it) is never
restarted: the run fails at once with the error and its traceback instead of the log's tail.

Redis is the run's coordination: if the private redis-server dies, Redis cannot be reached, or
the experiment status key is gone, the trial fails with `RedisLostError` naming Redis and its URL
(password redacted) — workers fail the same way (worker_base.experiment_status) instead of
reading a missing status as "stop" and exiting 0 with fewer steps than asked.
"""

import dataclasses
import json
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from realhf.api.cli_args import NameResolveConfig
from realhf.base import logging, name_resolve, names
from realhf.base.importing import import_roots
from realhf.base.network import redact_url
from realhf.base.process import pid_alive
from realhf.base.redis_server import RedisServer
from realhf.base.secret import write_private
from realhf.base.trial_files import TrialFiles
from realhf.scheduler.log_echo import LogEcho, log_tail
from realhf.scheduler.watchdog import MARKER_ENV, Watchdog
from realhf.scheduler.worker_spec import (
    DEFAULT_WORKER_ENV,
    LauncherError,
    LauncherInterrupted,
    LauncherStopped,
    RedisLostError,
    WorkerFailedError,
    WorkerSpec,
)
from realhf.system.user_errors import UserErrorFeed
from realhf.system.worker_base import (
    EXIT_DO_NOT_RESTART,
    STATUS_ABORTED,
    STATUS_COMPLETE,
    STATUS_RUNNING,
    WorkerContext,
)

logger = logging.getLogger("launcher")


@dataclass
class _Proc:
    name: str  # "<type>/<index>"
    worker_type: str
    index: int
    process: Any  # LocalProcess, or a launcher's stand-in for one on another machine (ray.py)
    log_path: str
    heartbeat_key: str
    started: float
    heartbeat_seen: bool = False
    heartbeat_missing_since: Optional[float] = None
    exited: Optional[int] = None
    spec: Optional[WorkerSpec] = None
    config_path: str = ""
    context: Optional[WorkerContext] = None
    restarts: int = 0  # over the whole run (reported)
    restart_times: List[float] = dataclasses.field(default_factory=list)  # monotonic, within the window
    restart_at: Optional[float] = None  # a restart is due at this monotonic time
    last_death: str = ""


class Supervisor:
    """The part of a launcher that is the same everywhere; subclasses implement `_new_process`
    (and may extend `start`/`stop_all` with the cluster they need)."""

    launcher_name = "launcher"
    assigns_gpus = False  # whether a worker's process sees only its own GPUs (WorkerContext.gpus_assigned)

    def __init__(
        self,
        experiment_name: str,
        trial_name: str,
        fileroot: str,
        name_resolve_config: Optional[NameResolveConfig] = None,
        startup_timeout: float = 300.0,
        exit_grace: float = 10.0,
        poll_interval: float = 0.2,
        bind_host: str = "127.0.0.1",
        heartbeat_grace: float = 5.0,
        user_paths: Sequence[str] = (),
        stop_grace: float = 0.0,
        clear_keys: bool = False,
    ):
        self.experiment_name = experiment_name
        self.trial_name = trial_name
        self.log_dir = TrialFiles(fileroot, experiment_name, trial_name).log_dir
        self.name_resolve_config = dataclasses.replace(name_resolve_config or NameResolveConfig())
        self.startup_timeout = startup_timeout
        self.exit_grace = exit_grace
        self.poll_interval = poll_interval
        self.heartbeat_grace = heartbeat_grace
        self.bind_host = bind_host
        # Every worker starts here and imports the user's code from here and from user_paths
        # (realhf.base.importing): a module beside the user's command is found without PYTHONPATH.
        self.launch_dir, *self.user_paths = import_roots(os.getcwd(), user_paths)
        self._redis: Optional[RedisServer] = None
        self._procs: List[_Proc] = []
        self._echo = LogEcho()
        self._started = False
        self._stopped = False
        self._old_handlers = {}
        self._interrupted: Optional[int] = None  # the signal number, once SIGINT/SIGTERM arrived
        # stop_grace > 0: the first SIGINT/SIGTERM asks the master for a recovery checkpoint and
        # the run ends when it has written it (or after stop_grace s); a second one stops at once.
        self.stop_grace = stop_grace
        # clear_keys: delete the trial's keys in an external Redis at the end (a run's launcher
        # does; a test that reads them after wait() does not). owns_keys: False once another
        # launch took over the trial (its lease): its keys are not ours to clear.
        self.clear_keys = clear_keys
        self.owns_keys = True
        self._stop_signal: Optional[int] = None
        self._stop_deadline: Optional[float] = None
        self.secret = secrets.token_hex(32)  # this trial's shared secret (WorkerContext.secret)
        self.marker = uuid.uuid4().hex  # REALHF_TRIAL in every worker's environment (watchdog.py)
        self._watchdog: Optional[Watchdog] = None
        self._user_errors = UserErrorFeed(experiment_name, trial_name, self._redis_call)

    # ---- set-up -----------------------------------------------------------------------------
    def start(self) -> "Supervisor":
        os.makedirs(os.path.join(self.log_dir, "configs"), mode=0o700, exist_ok=True)
        self._watchdog = Watchdog(self.marker)
        cfg = self.name_resolve_config
        if cfg.type == "redis" and not cfg.redis_url:
            self._redis = RedisServer.with_random_password(host=self.bind_host, work_dir=self.log_dir).start()
            self._watchdog.track(self._redis.pid)  # it leads its own session
            cfg.redis_url = self._redis.url
        if cfg.type == "memory":
            raise LauncherError(
                "cluster.name_resolve.type=memory works within one process only; "
                f"the {self.launcher_name} launcher needs 'redis'"
            )
        name_resolve.reconfigure(cfg)
        # A previous trial of the same name may have left keys behind (e.g. after a SIGKILL). The
        # trial's lease stays: this launch took it before starting us (realhf/base/trial_lease.py).
        lease = names.trial_lease(self.experiment_name, self.trial_name)
        for key in name_resolve.find_subtree(names.trial_root(self.experiment_name, self.trial_name)):
            if key != lease:
                try:
                    name_resolve.delete(key)
                except name_resolve.NameEntryNotFoundError:  # expired meanwhile
                    pass
        name_resolve.add(names.experiment_status(self.experiment_name, self.trial_name), STATUS_RUNNING, replace=True)
        self._install_signal_handlers()
        self._echo.start()
        self._started = True
        logger.info(f"trial {self.experiment_name}/{self.trial_name}: logs in {self.log_dir}")
        return self

    def echo_to(self, write: Callable[[str], None]) -> None:
        """Where the echoed worker log lines go (stdout by default): e.g. `RunProgress.print_lines`."""
        self._echo.write = write

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum, frame):
            if self.stop_grace > 0 and self._stop_signal is None:
                self._stop_signal = signum  # wait() asks the master to checkpoint and stop
                return
            # Recorded as well as raised: the exception may land inside a call that catches
            # broadly (a Redis client retry, a best-effort clean-up); wait() checks the record.
            self._interrupted = signum
            raise LauncherInterrupted(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _restore_signal_handlers(self):
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def submit(self, spec: WorkerSpec) -> None:
        if not self._started:
            raise LauncherError("call start() before submit()")
        configs = spec.configs or [None] * spec.count
        if len(configs) != spec.count:
            raise LauncherError(f"{spec.worker_type}: {spec.count} workers but {len(configs)} configs")
        env = dict(DEFAULT_WORKER_ENV)
        env.update(spec.env)
        env[MARKER_ENV] = self.marker
        for index, config in enumerate(configs):
            self._spawn(spec, index, config, env)

    def _new_process(self, p: _Proc, spec: WorkerSpec, config: Any, env: Dict[str, str]):
        """A process object for worker `p` (not started): `LocalProcess`'s methods. `env` holds
        what the worker's environment adds to that of the machine it runs on."""
        raise NotImplementedError

    def _process_started(self, p: _Proc) -> None:
        """Called after every (re)start of `p`'s process."""

    def _process_forgotten(self, p: _Proc) -> None:
        """Called when `p`'s dead process will be replaced by a restart."""

    def _spawn(self, spec: WorkerSpec, index: int, config: Any, env: Dict[str, str]) -> None:
        ctx = WorkerContext(
            experiment_name=self.experiment_name,
            trial_name=self.trial_name,
            worker_type=spec.worker_type,
            worker_index=index,
            worker_count=spec.count,
            name_resolve=self.name_resolve_config,
            log_dir=self.log_dir,
            secret=self.secret,
            gpus_assigned=self.assigns_gpus and spec.gpus > 0,
            launch_dir=self.launch_dir,
            user_paths=list(self.user_paths),
        )
        config_path = os.path.join(self.log_dir, "configs", f"{spec.worker_type}-{index}.yaml")
        log_path = os.path.join(self.log_dir, f"{spec.worker_type}-{index}.log")
        key = names.worker(self.experiment_name, self.trial_name, spec.worker_type, index)
        p = _Proc(
            f"{spec.worker_type}/{index}",
            spec.worker_type,
            index,
            None,
            log_path,
            key,
            time.monotonic(),
            spec=spec,
            config_path=config_path,
            context=ctx,
        )
        echo_from = os.path.getsize(log_path) if spec.echo_log and os.path.exists(log_path) else 0
        p.process = self._new_process(p, spec, config, env)
        # After _new_process: a launcher that places workers on nodes may adjust the config
        # (the address to bind) to the node it chose.
        self.rewrite_config(p, getattr(p.process, "config", config))
        pid = p.process.start()
        self._procs.append(p)
        self._process_started(p)
        if spec.echo_log:
            self._echo.add(log_path, echo_from)
        logger.info(f"started {p.name} (pid {pid}{self._where(p)})")

    def rewrite_config(self, p: _Proc, config: Any) -> None:
        """Write worker `p`'s config file (owner-only: it holds the trial's secret)."""
        doc = {"worker_class": p.spec.worker_class or p.spec.worker_type, "context": OmegaConf.structured(p.context)}
        if config is not None:
            doc["config"] = OmegaConf.structured(config)
        write_private(p.config_path, OmegaConf.to_yaml(OmegaConf.create(doc)))

    def _where(self, p: _Proc) -> str:
        """Where `p` runs, for log lines ("" on this machine)."""
        return getattr(p.process, "where", "")

    def worker_pids(self) -> Dict[str, int]:
        """The current pid of every worker ("<type>/<index>"), on the machine it runs on."""
        return {p.name: p.process.pid for p in self._procs}

    def _restart(self, p: _Proc) -> None:
        """Start worker `p` again: same index, same config file, same (appended) log."""
        p.restarts += 1
        p.restart_times.append(time.monotonic())
        try:  # the dead incarnation's heartbeat must not count for the new one
            name_resolve.delete(p.heartbeat_key)
        except Exception:  # noqa: BLE001 - already expired
            pass
        p.process.start(
            banner=f"\n{'=' * 20} realhf launcher: restart {p.restarts} of {p.name} "
            f"(max_restarts={p.spec.max_restarts}) after: {p.last_death} {'=' * 20}\n"
        )
        self._process_started(p)
        p.started = time.monotonic()
        p.heartbeat_seen, p.heartbeat_missing_since, p.exited, p.restart_at = False, None, None, None
        logger.warning(
            f"restarted {p.name} (restart {p.restarts}; {len(p.restart_times)}/{p.spec.max_restarts} "
            f"within {self._window(p)}; pid {p.process.pid}) "
            f"after: {p.last_death}"
        )

    def restarts(self) -> Dict[str, int]:
        """Restarts so far per worker name ("<type>/<index>")."""
        return {p.name: p.restarts for p in self._procs}

    # ---- supervision ------------------------------------------------------------------------
    def wait(self, timeout: Optional[float] = None) -> None:
        """Supervise until every worker exited 0 (return) or something failed (raise).

        Everything is stopped before this returns or raises.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        complete_since: Optional[float] = None
        try:
            while True:
                if self._interrupted is not None:
                    raise LauncherInterrupted(self._interrupted)
                self._graceful_stop()
                failure = self._check_workers()
                if failure is not None:
                    self._fail(*failure)
                self._tell_user_errors()
                if all(p.exited is not None and p.restart_at is None for p in self._procs):
                    logger.info("all workers exited normally")
                    self._raise_if_stopped()
                    return
                if complete_since is None and self._status() == STATUS_COMPLETE:
                    complete_since = time.monotonic()
                if complete_since is not None and time.monotonic() - complete_since > self.exit_grace:
                    left = [p.name for p in self._procs if p.exited is None]
                    logger.warning(
                        f"experiment COMPLETE but {left} still running after {self.exit_grace:.0f}s; stopping them"
                    )
                    self._raise_if_stopped()
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise LauncherError(f"trial did not finish within {timeout:.0f}s")
                time.sleep(self.poll_interval)
        except LauncherError as e:
            if self._interrupted is None:
                raise
            interrupted = e if isinstance(e, LauncherInterrupted) else LauncherInterrupted(self._interrupted)
            logger.warning(f"{interrupted}; stopping every worker")
            self._set_status(STATUS_ABORTED)
            raise interrupted from None
        finally:
            self.stop_all()

    def _graceful_stop(self) -> None:
        """After a first SIGINT/SIGTERM: ask the master (once) to finish its step, write a
        recovery checkpoint and end the run; past stop_grace, stop at once as a second signal would."""
        if self._stop_signal is None:
            return
        name = signal.Signals(self._stop_signal).name
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.stop_grace
            logger.warning(
                f"launcher received {name}: the master finishes its step and writes a recovery checkpoint "
                f"(up to cluster.stop_grace={self.stop_grace:g}s; a second signal stops at once)"
            )
            key = names.stop_request(self.experiment_name, self.trial_name)
            self._redis_call("asking the master to stop", lambda: name_resolve.add(key, name, replace=True))
        elif time.monotonic() > self._stop_deadline:
            logger.warning(f"no recovery checkpoint within cluster.stop_grace={self.stop_grace:g}s of {name}")
            self._interrupted = self._stop_signal
            raise LauncherInterrupted(self._stop_signal)

    def _raise_if_stopped(self) -> None:
        """The run ended on a stop request: LauncherStopped (the caller's exit code says resumable)."""
        if self._stop_signal is None:
            return
        try:
            done = json.loads(name_resolve.get(names.stopped_resumable(self.experiment_name, self.trial_name)))
        except name_resolve.NameEntryNotFoundError:
            return  # the run had ended by itself, all its steps done, before the master saw the request
        raise LauncherStopped(self._stop_signal, int(done["step"]))

    def _redis_where(self) -> str:
        return f"Redis at {redact_url(self.name_resolve_config.redis_url)}"

    def _redis_died(self, grace_s: float = 0.0) -> Optional[RedisLostError]:
        """The error for the trial's own redis-server having died (within `grace_s`), else None."""
        if self._redis is None:
            return None
        deadline = time.monotonic() + grace_s
        while pid_alive(self._redis.pid):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return RedisLostError(
            f"the trial's redis-server (pid {self._redis.pid}, {self._redis_where()}) died; every worker depends on it"
        )

    def _redis_call(self, what: str, fn, *args):
        """`fn(*args)` against name resolve; RedisLostError naming Redis if it cannot be reached."""
        died = self._redis_died()
        if died is not None:
            raise died
        try:
            return fn(*args)
        except (name_resolve.NameEntryNotFoundError, LauncherError):
            raise
        except Exception as e:  # redis.ConnectionError, TimeoutError…
            # A killed server refuses connections while the kernel is still tearing it down: give
            # it a moment to be seen dead, so the message says why rather than only what failed.
            died = self._redis_died(grace_s=1.0)
            if died is not None:
                raise died from None
            raise RedisLostError(f"{self._redis_where()} is unreachable ({what}): {type(e).__name__}: {e}") from None

    def _status(self) -> str:
        key = names.experiment_status(self.experiment_name, self.trial_name)
        try:
            return self._redis_call("reading the experiment status", name_resolve.get, key)
        except name_resolve.NameEntryNotFoundError:
            raise RedisLostError(
                f"the experiment status key {key!r} is missing from {self._redis_where()} "
                "(Redis restarted without its data, flushed or evicted?)"
            ) from None

    def _check_workers(self):
        """(proc, reason) of the first failed worker, or None. Restartable workers that died are
        scheduled for a restart (or restarted when it is due) instead."""
        now = time.monotonic()
        heartbeats = set(
            self._redis_call(
                "reading heartbeats",
                name_resolve.find_subtree,
                names.worker_root(self.experiment_name, self.trial_name),
            )
        )
        running = self._status() == STATUS_RUNNING
        for p in self._procs:
            if p.restart_at is not None:
                if not running:  # the trial ended meanwhile: stay down
                    p.restart_at = None
                elif now >= p.restart_at:
                    self._restart(p)
                continue
            if p.exited is not None:
                continue
            code = p.process.poll()
            if code is not None:
                p.exited = code
                if code == EXIT_DO_NOT_RESTART:
                    return p, self._not_to_restart(p)
                if code != 0:
                    reason = f"exited with code {code}" + (f" ({signal.Signals(-code).name})" if code < 0 else "")
                    if self._schedule_restart(p, reason, now):
                        continue
                    return p, self._with_restarts(p, reason)
                logger.info(f"{p.name} exited normally")
                continue
            if p.heartbeat_key in heartbeats:
                p.heartbeat_seen = True
                p.heartbeat_missing_since = None
            elif p.heartbeat_seen:
                # A worker deregisters just before it exits: only a key that stays gone while
                # the process lives on is a hang. Once the trial is COMPLETE, workers are leaving
                # and a slow exit (a loaded machine) is wait()'s exit_grace business, not a hang.
                if not running:
                    continue
                if p.heartbeat_missing_since is None:
                    p.heartbeat_missing_since = now
                elif now - p.heartbeat_missing_since > self.heartbeat_grace:
                    reason = (
                        f"stopped heart-beating (key {p.heartbeat_key} gone for "
                        f"{now - p.heartbeat_missing_since:.0f}s) while its process is still alive"
                        f"{self._why_silent(p)}"
                    )
                    if self._restartable(p):
                        p.exited = p.process.kill_tree()
                        if p.exited is None:
                            logger.error(f"{p.name} (pid {p.process.pid}{self._where(p)}) survived SIGKILL")
                        self._schedule_restart(p, reason, now)
                        continue
                    return p, self._with_restarts(p, reason)
            elif now - p.started > self.startup_timeout:
                return p, self._with_restarts(p, f"did not register its heartbeat within {self.startup_timeout:.0f}s")
        return None

    @staticmethod
    def _why_silent(p: _Proc) -> str:
        """A hint for a heartbeat gone while the process lives: paused (SIGSTOP), or hung."""
        stopped = p.process.paused()
        if stopped is None:
            return ""
        return (
            " and is stopped (SIGSTOP? paused longer than its heartbeat TTL + heartbeat_grace)"
            if stopped
            else " (hung, or paused by SIGSTOP for longer than its heartbeat TTL + heartbeat_grace?)"
        )

    @staticmethod
    def _recent_restarts(p: _Proc) -> int:
        """Restarts of `p` that count against its budget: those within the last restart_window s."""
        window = p.spec.restart_window if p.spec is not None else 0
        if window > 0:
            now = time.monotonic()
            p.restart_times = [t for t in p.restart_times if now - t < window]
        return len(p.restart_times)

    def _restartable(self, p: _Proc) -> bool:
        return (
            p.spec is not None
            and p.spec.restart
            and self._recent_restarts(p) < p.spec.max_restarts
            and self._status() == STATUS_RUNNING
        )

    def _schedule_restart(self, p: _Proc, reason: str, now: float) -> bool:
        if not self._restartable(p):
            return False
        delay = min(30.0, p.spec.restart_backoff * 2 ** self._recent_restarts(p))
        p.process.kill_leftovers()  # children the dead worker left behind (same process group)
        self._process_forgotten(p)
        p.last_death, p.restart_at = reason, now + delay
        logger.warning(
            f"{p.name} {reason}; restarting it in {delay:.1f}s (restart {p.restarts + 1}; "
            f"{self._recent_restarts(p) + 1} of at most {p.spec.max_restarts} within {self._window(p)})"
        )
        return True

    @staticmethod
    def _window(p: _Proc) -> str:
        return f"{p.spec.restart_window:g} s" if p.spec.restart_window > 0 else "the run"

    def _with_restarts(self, p: _Proc, reason: str) -> str:
        if not p.restarts:
            return reason
        if not (p.spec.restart and self._status() == STATUS_RUNNING):
            return f"{reason} after {p.restarts} restart(s)"
        return (
            f"{reason} after {self._recent_restarts(p)} restarts within {self._window(p)} "
            f"(cluster.restart_policy.max_restarts={p.spec.max_restarts}, restart_window={p.spec.restart_window:g}; "
            f"{p.restarts} restart(s) in all)"
        )

    def _tell_user_errors(self) -> None:
        """Print errors in user code the workers reported since the last look, each place once."""
        for line in self._user_errors.poll():
            self._echo.write(line)

    def _not_to_restart(self, p: _Proc) -> str:
        """The reason a worker that exited with EXIT_DO_NOT_RESTART gave (its fatal record)."""
        self._tell_user_errors()
        record = self._user_errors.fatal(p.name)
        if record is not None and record.get("reason"):
            return record["reason"]
        return f"exited with code {EXIT_DO_NOT_RESTART}: an error a restart would only repeat (see its log)"

    def _fail(self, proc: _Proc, reason: str):
        self._set_status(STATUS_ABORTED)
        self.stop_all()
        tail = log_tail(proc.log_path, 30)
        record = self._user_errors.fatal(proc.name)
        if record is not None and record.get("report", {}).get("traceback"):
            # The user's error and its traceback say what the log's last lines would bury.
            shown = (
                f"its traceback (the first of them; the whole log: {proc.log_path}):\n{record['report']['traceback']}"
            )
        else:
            shown = f"last 30 lines of {proc.log_path}:\n{tail}"
        message = f"\n{'=' * 30} worker {proc.name} failed: {reason}\n{shown.rstrip()}\n{'=' * 80}"
        print(message, file=sys.stderr, flush=True)
        raise WorkerFailedError(proc.name, reason, proc.log_path, tail, repeats=proc.exited == EXIT_DO_NOT_RESTART)

    def _set_status(self, status: str):
        try:
            name_resolve.add(names.experiment_status(self.experiment_name, self.trial_name), status, replace=True)
        except Exception as e:  # Redis may be the thing that failed
            logger.warning(f"could not set experiment status {status}: {e}")

    # ---- teardown ---------------------------------------------------------------------------
    def stop_all(self, grace: float = 6.0) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after `grace` s) and their descendants,
        then Redis. Finishes within grace + a few seconds; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if threading.current_thread() is threading.main_thread():
            # A second Ctrl-C must not interrupt the clean-up it asked for.
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers.setdefault(sig, signal.getsignal(sig))
                signal.signal(sig, signal.SIG_IGN)
        self._stop_processes(grace)
        self._echo.stop()
        self._clear_trial_keys()
        try:
            name_resolve.repository().reset()
        except Exception:
            pass
        if self._redis is not None:
            self._redis.stop()
        self._stop_cluster()
        if self._watchdog is not None:  # last: it sweeps what escaped the above (re-parented, setsid)
            self._watchdog.close()
        self._restore_signal_handlers()

    def _clear_trial_keys(self) -> None:
        """An external Redis (cluster.name_resolve.redis_url) outlives the run: once every worker
        is stopped, none of the trial's keys stays there (a resume reads the recovery checkpoint on
        disk, as it must with the private redis-server, which goes with its keys) but the lease,
        which the entry point releases last. A launch that lost the trial to another clears nothing."""
        if self._redis is not None or not (self.clear_keys and self.owns_keys) or not self._started:
            return
        if self.name_resolve_config.type != "redis":
            return
        lease = names.trial_lease(self.experiment_name, self.trial_name)
        try:
            keys = name_resolve.find_subtree(names.trial_root(self.experiment_name, self.trial_name))
            for key in keys:
                if key != lease:
                    try:
                        name_resolve.delete(key)
                    except name_resolve.NameEntryNotFoundError:
                        pass
        except Exception as e:  # noqa: BLE001 - Redis may be what failed; the run's end must not
            logger.warning(f"could not clear the trial's keys in {self._redis_where()}: {type(e).__name__}: {e}")

    def _stop_processes(self, grace: float) -> None:
        """SIGTERM every worker (all at once), SIGKILL what is left after `grace` s."""
        for p in self._procs:
            p.process.begin_stop()
        deadline = time.monotonic() + grace
        for p in self._procs:
            for pid in p.process.end_stop(deadline):
                logger.warning(
                    f"{p.name}: pid {pid}{self._where(p)} did not exit within {grace:.0f}s of SIGTERM; killed it"
                )
        for p in self._procs:
            if p.exited is None:
                p.exited = p.process.wait(timeout=1)
                if p.exited is None:
                    logger.error(f"{p.name} (pid {p.process.pid}{self._where(p)}) could not be stopped")

    def _stop_cluster(self) -> None:
        """After every worker stopped: what the launcher started besides them (ray.py: Ray)."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop_all()
