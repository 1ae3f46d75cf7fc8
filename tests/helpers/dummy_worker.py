"""A worker that only heart-beats, for launcher and lifecycle tests."""

import atexit
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from realhf.base import name_resolve, names
from realhf.system.worker_base import STATUS_COMPLETE, Worker, WorkerExit


@dataclass
class DummyWorkerConfig:
    exit_after: float = 0.0  # > 0: leave the loop after this many seconds
    exit_code: int = 0  # with exit_after: 0 = normal exit, else crash with this code
    complete_trial: bool = False  # on exit_after, mark the experiment COMPLETE (like a master)
    spawn_grandchild: bool = False  # start a long `sleep` child, to check trees are reaped
    stubborn_grandchildren: bool = False  # two children ignoring SIGTERM, one of them in its own session
    hang_after: float = 0.0  # > 0: after this many seconds stop heart-beating and hang (a deadlock)
    linger_after_exit: float = 0.0  # seconds the process lives on after it deregistered (slow teardown)
    log_numpy_draw: bool = False  # log one draw of numpy's global RandomState (forked workers must differ)


# Ignores SIGTERM (and, with argv[1] == "True", leaves the worker's process group and session).
_STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if sys.argv[1] == 'True': os.setsid()\n"
    "time.sleep(600)\n"
)


class DummyWorker(Worker):
    config_cls = DummyWorkerConfig

    def _configure(self):
        self._t0 = time.monotonic()
        self._child = None
        if self.config.log_numpy_draw:
            import numpy

            self.logger.info(f"numpy draw {numpy.random.randint(1 << 62)}")
        if self.config.spawn_grandchild:
            self._child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            self.logger.info(f"grandchild pid {self._child.pid}")
        if self.config.stubborn_grandchildren:
            for setsid in (False, True):  # not waited for: they must be swept by someone else
                child = subprocess.Popen([sys.executable, "-c", _STUBBORN, str(setsid)])
                self.logger.info(f"stubborn grandchild pid {child.pid} setsid={setsid}")

    def _poll(self):
        if self.config.hang_after and time.monotonic() - self._t0 > self.config.hang_after:
            self.logger.warning("hanging on purpose: heartbeat refresh stopped")
            name_resolve.repository()._stop.set()  # the keep-alive thread ends; the key expires
            while True:
                time.sleep(1)
        if self.config.exit_after and time.monotonic() - self._t0 > self.config.exit_after:
            if self.config.exit_code:
                self.logger.error("crashing on purpose")
                os._exit(self.config.exit_code)
            if self.config.complete_trial:
                name_resolve.add(
                    names.experiment_status(self.ctx.experiment_name, self.ctx.trial_name),
                    STATUS_COMPLETE,
                    replace=True,
                    delete_on_exit=False,
                )  # as the master does
            raise WorkerExit("done")
        time.sleep(0.05)
        return True

    def _exit_hook(self):
        if self.config.linger_after_exit:  # runs at interpreter exit, after deregistration
            atexit.register(time.sleep, self.config.linger_after_exit)
        if self._child is not None:
            self._child.kill()
            self._child.wait()
