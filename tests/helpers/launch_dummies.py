"""Runs the local launcher over dummy workers in its own process (it installs signal handlers).

    python -m helpers.launch_dummies FILEROOT TRIAL N_WORKERS [key=value for worker 0 ...]
                                     [launcher.startup_timeout=S] [launcher.heartbeat_grace=S]
                                     [restart.max_restarts=N] [restart.window=S]

`restart.max_restarts` makes the workers' spec restartable (backoff 0.1 s; `restart.window`: the
restart budget's window, default 600 s). Prints `READY <json>`
(`{"pids": {worker: pid}, "redis": pid}`) once every worker registered, then supervises; at the
end `DONE`, `FAILED <worker>: <reason>` or `INTERRUPTED`, and `RESTARTS <json of restarts per
worker>`. The exit code is the launcher's: 0 on success, 1 when a worker failed, 130 when interrupted.
"""

import json
import sys
import time

from omegaconf import OmegaConf

from helpers.dummy_worker import DummyWorkerConfig
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve, names
from realhf.scheduler.local import LauncherInterrupted, LocalLauncher, WorkerFailedError, WorkerSpec


def _options(prefix):
    return {k[len(prefix) :]: float(v) for k, v in (a.split("=", 1) for a in sys.argv[4:] if a.startswith(prefix))}


def main():
    fileroot, trial, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    worker_args = [a for a in sys.argv[4:] if not a.startswith(("launcher.", "restart."))]
    launcher_args, restart_args = _options("launcher."), _options("restart.")
    first = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(DummyWorkerConfig), OmegaConf.from_dotlist(worker_args))
    )
    configs = [first] + [DummyWorkerConfig() for _ in range(n - 1)]
    restart = {}
    if "max_restarts" in restart_args:
        restart = dict(
            restart=True,
            max_restarts=int(restart_args["max_restarts"]),
            restart_backoff=0.1,
            restart_window=restart_args.get("window", 600.0),
        )
    launcher = LocalLauncher(
        "dummies", trial, fileroot, NameResolveConfig(keepalive_ttl=2.0), **{"startup_timeout": 60, **launcher_args}
    )
    try:
        launcher.start()
        launcher.submit(WorkerSpec("dummy", n, configs, worker_class="helpers.dummy_worker:DummyWorker", **restart))
        deadline = time.monotonic() + 60
        root = names.worker_root("dummies", trial)
        while len(name_resolve.find_subtree(root)) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("dummy workers did not register within 60s")
            time.sleep(0.1)
        pids = launcher.worker_pids()
        print("READY " + json.dumps({"pids": pids, "redis": launcher._redis.pid}), flush=True)
        launcher.wait(timeout=120)
    except WorkerFailedError as e:
        print(f"FAILED {e.worker}: {e.reason}", flush=True)
        return 1
    except LauncherInterrupted:
        print("INTERRUPTED", flush=True)
        return 130
    finally:
        launcher.stop_all()
        print("RESTARTS " + json.dumps(launcher.restarts()), flush=True)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
