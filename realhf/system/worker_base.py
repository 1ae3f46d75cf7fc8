"""The lifecycle every realhf worker process shares.

    register a heartbeat (keep-alive key) → configure → loop { poll } → exit hook → deregister

The loop ends when `experiment_status` is no longer RUNNING, on SIGTERM/SIGINT, or when the
worker itself asks to stop. A missing status key or an unreachable Redis is not "stop": the run's
coordination is gone, so the worker fails (`NameResolveLost`, exit 1) naming Redis — never an
exit 0 that would end the run early and look like success. A worker whose failure a new process
would only repeat raises `DoNotRestart` and exits with EXIT_DO_NOT_RESTART (the launcher ends
the run instead of restarting it). A worker subclass implements `_configure`, `_poll` (sync) or
`_poll_async` (asyncio, see AsyncWorker), and `_exit_hook` to release what it started.
"""

import asyncio
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any, List, Tuple

import psutil

from realhf.api.cli_args import NameResolveConfig
from realhf.base import logging, name_resolve, names
from realhf.base.network import redact_url
from realhf.system.loop_watchdog import LoopWatchdog

logger = logging.getLogger("worker")

STATUS_RUNNING = "RUNNING"
STATUS_COMPLETE = "COMPLETE"
STATUS_ABORTED = "ABORTED"

# The exit status of a worker whose failure a restart would only repeat (DoNotRestart): the
# launcher ends the run instead of restarting it. sysexits' EX_CONFIG ("configuration error"):
# the run as configured, user code included, cannot go on; no worker exits 78 otherwise.
EXIT_DO_NOT_RESTART = 78


@dataclass
class WorkerContext:
    """Who a worker is and where its trial lives; written by the launcher."""

    experiment_name: str = ""
    trial_name: str = ""
    worker_type: str = ""
    worker_index: int = 0
    worker_count: int = 1
    name_resolve: NameResolveConfig = field(default_factory=NameResolveConfig)
    log_dir: str = ""
    # How often a worker reads the trial's status (one Redis GET): how soon it sees the run end.
    status_check_interval: float = 0.2
    # The trial's shared secret (realhf.base.secret): every socket and HTTP endpoint of the run
    # requires it. Generated per trial by the launcher and handed over only in the worker's
    # owner-only config file; never on a command line or in a log. Empty: no authentication
    # (single-process tests that build workers by hand).
    secret: str = ""
    # The launcher narrowed CUDA_VISIBLE_DEVICES to this worker's own GPUs (Ray does, per actor):
    # its first GPU is device 0 whatever the config's gpu/base_gpu_id say. Unused on the CPU.
    gpus_assigned: bool = False
    # Where the user's code is imported from (realhf.base.importing.use_import_roots): the
    # launcher's working directory (relative file paths of user code are read from it) and the
    # config's user_paths, absolute. Empty: this process's working directory.
    launch_dir: str = ""
    user_paths: List[str] = field(default_factory=list)


class WorkerExit(Exception):
    """Raised inside a worker to end its loop normally."""


class DoNotRestart(RuntimeError):
    """Raised inside a worker whose failure a new process would repeat (the same error in user
    code, every time): it exits with EXIT_DO_NOT_RESTART, and the launcher ends the run."""


class NameResolveLost(RuntimeError):
    """Redis (the trial's name resolve) is unreachable or lost a key the run cannot do without."""


def experiment_status(ctx: WorkerContext) -> str:
    """The trial's status (RUNNING, COMPLETE, ABORTED); NameResolveLost naming Redis when the key
    is missing (Redis restarted without its data, flushed, evicted) or Redis cannot be reached."""
    key = names.experiment_status(ctx.experiment_name, ctx.trial_name)
    where = f"Redis at {_redacted(ctx.name_resolve.redis_url)}" if ctx.name_resolve.type == "redis" else "name resolve"
    try:
        return name_resolve.get(key)
    except name_resolve.NameEntryNotFoundError:
        raise NameResolveLost(
            f"the experiment status key {key!r} is missing from {where} (Redis restarted "
            "without its data, flushed or evicted?); the run cannot go on"
        ) from None
    except Exception as e:  # redis.ConnectionError, TimeoutError…: the server is gone
        raise NameResolveLost(f"{where} is unreachable reading {key!r}: {type(e).__name__}: {e}") from None


def _redacted(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:
        return url.split("@")[-1]


class Worker:
    """Base of the synchronous workers. `config_cls` is the dataclass of the worker's config."""

    config_cls: Any = None
    # Modules the worker's configure step imports (not its module's own imports): a local
    # launcher's worker template imports them once before it forks the first worker of the type
    # (realhf/apps/worker_template.py).
    warm_modules: Tuple[str, ...] = ()

    def __init__(self, ctx: WorkerContext, config: Any = None):
        self.ctx = ctx
        self.config = config
        self.name = f"{ctx.worker_type}/{ctx.worker_index}"
        self.logger = logging.getLogger(self.name)
        self._stop_requested = False
        self._stop_reason = ""
        self._last_status_check = 0.0

    # ---- hooks for subclasses ---------------------------------------------------------------
    def _configure(self) -> None:
        """Set up sockets, models, servers. Runs after the heartbeat is registered."""

    def _poll(self) -> bool:
        """One unit of work; return True if something was done (else the loop idles briefly)."""
        time.sleep(0.05)
        return False

    def _exit_hook(self) -> None:
        """Release everything `_configure` started. Must be safe to call after a failed configure."""

    # ---- lifecycle --------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if not self._stop_requested:
            self._stop_requested = True
            self._stop_reason = reason

    def _install_signal_handlers(self):
        def on_signal(signum, frame):
            self.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _status_says_stop(self) -> bool:
        now = time.monotonic()
        if now - self._last_status_check < self.ctx.status_check_interval:
            return False
        self._last_status_check = now
        status = experiment_status(self.ctx)
        if status != STATUS_RUNNING:
            self.request_stop(f"experiment status is {status}")
            return True
        return False

    def _register(self):
        name_resolve.reconfigure(self.ctx.name_resolve)
        key = names.worker(self.ctx.experiment_name, self.ctx.trial_name, self.ctx.worker_type, self.ctx.worker_index)
        name_resolve.add(
            key,
            f"{socket.gethostname()}:{os.getpid()}",
            replace=True,
            keepalive_ttl=self.ctx.name_resolve.keepalive_ttl,
        )

    def run(self) -> int:
        """Run the whole lifecycle; returns the process exit code."""
        self._install_signal_handlers()
        code = 0
        t_run, imported_s = time.monotonic(), _process_age_s()
        try:
            self._register()
            self._configure()
            # Where a start's time goes (imports, or the set-up: devices, process groups, models),
            # which decides how soon a restarted trial trains again.
            self.logger.info(
                f"configured; running ({imported_s:.1f}s from process start to imported, "
                f"{time.monotonic() - t_run:.1f}s to configure)"
            )
            self._loop()
        except WorkerExit as e:
            self.request_stop(str(e) or "worker finished")
        except DoNotRestart as e:
            self.logger.exception(f"failed, not to be restarted: {e}")
            code = EXIT_DO_NOT_RESTART
        except BaseException as e:
            self.logger.exception(f"failed: {type(e).__name__}: {e}")
            code = 1
        finally:
            try:
                self._exit_hook()
            except Exception as e:
                self.logger.exception(f"exit hook failed: {e}")
                code = code or 1
            name_resolve.repository().close()
        self.logger.info(f"exiting with code {code}: {self._stop_reason or 'error'}")
        return code

    def _loop(self):
        while not self._stop_requested and not self._status_says_stop():
            if not self._poll():
                time.sleep(0.005)


def _process_age_s() -> float:
    return max(0.0, time.time() - psutil.Process().create_time())


class AsyncWorker(Worker):
    """A worker whose loop is a coroutine (rollout workers): `_poll_async` runs repeatedly.

    Its event loop is watched (`LoopWatchdog`): blocked for `loop_block_warn_s` s, it is logged
    with the stack that blocks it and shown in the master's stall report."""

    # Class attributes, not config fields: a field would have to be threaded through every async
    # worker's config, and the threshold is a property of asyncio code (nothing on a loop should
    # hold it for seconds), not of a run. 10 s: far above any honest step (a record write, a
    # tokenization), far below the episode and data timeouts whose silence it explains.
    loop_block_warn_s: float = 10.0
    loop_block_remind_s: float = 60.0

    async def _poll_async(self) -> bool:
        await asyncio.sleep(0.05)
        return False

    async def _exit_hook_async(self) -> None:
        """Async clean-up, run inside the event loop before `_exit_hook`."""

    def _loop(self):
        asyncio.run(self._aloop())

    def _make_watchdog(self) -> LoopWatchdog:
        ctx = self.ctx
        key = (
            names.loop_blocked(ctx.experiment_name, ctx.trial_name, ctx.worker_type, ctx.worker_index)
            if ctx.experiment_name and ctx.trial_name and ctx.worker_type
            else None
        )
        return LoopWatchdog(
            self.name,
            self.logger,
            key,
            self.loop_block_warn_s,
            self.loop_block_remind_s,
            ctx.name_resolve.keepalive_ttl,
        )

    async def _aloop(self):
        watchdog = self._make_watchdog()
        watchdog.start()
        try:
            while not self._stop_requested and not self._status_says_stop():
                if not await self._poll_async():
                    await asyncio.sleep(0.005)
        finally:
            try:
                await self._exit_hook_async()
            finally:
                watchdog.stop()
