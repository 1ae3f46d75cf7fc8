"""The local launcher over dummy workers whose spec allows restarts, in its own process.

    python launch_restartable.py FILEROOT TRIAL N_WORKERS MAX_RESTARTS [key=value for worker 0 ...]

Prints `READY <json of pids>` once every worker registered, `RESTARTS <json>` and then
`DONE` / `FAILED <worker>: <reason>` at the end; exit code 0 / 1.
"""

import json
import sys
import time

from omegaconf import OmegaConf

from helpers.dummy_worker import DummyWorkerConfig
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve, names
from realhf.scheduler.local import LocalLauncher, WorkerFailedError, WorkerSpec


def main():
    fileroot, trial, n, max_restarts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    first = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DummyWorkerConfig),
                                                OmegaConf.from_dotlist(sys.argv[5:])))
    configs = [first] + [DummyWorkerConfig() for _ in range(n - 1)]
    launcher = LocalLauncher("restartable", trial, fileroot, NameResolveConfig(keepalive_ttl=2.0), startup_timeout=60)
    code = 0
    try:
        launcher.start()
        launcher.submit(WorkerSpec("dummy", n, configs, worker_class="helpers.dummy_worker:DummyWorker",
                                   restart=True, max_restarts=max_restarts, restart_backoff=0.1))
        root = names.worker_root("restartable", trial)
        deadline = time.monotonic() + 60
        while len(name_resolve.find_subtree(root)) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("dummy workers did not register within 60s")
            time.sleep(0.1)
        print("READY " + json.dumps({p.name: p.popen.pid for p in launcher._procs}), flush=True)
        launcher.wait(timeout=120)
        print("DONE", flush=True)
    except WorkerFailedError as e:
        print(f"FAILED {e.worker}: {e.reason}", flush=True)
        code = 1
    finally:
        launcher.stop_all()
        print("RESTARTS " + json.dumps(launcher.restarts()), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
