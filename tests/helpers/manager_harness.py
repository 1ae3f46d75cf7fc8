"""The rollout side's surroundings in one process: fake SGLang servers and the real GserverManager
app (HTTP server + watcher) on 127.0.0.1, under one trial of the real name resolve."""

import contextlib

from helpers.fake_sglang import FakeSGLangServer
from realhf.api.worker_configs import GserverManagerConfig
from realhf.base import name_resolve, names
from realhf.system.manager.gserver_manager import serve_manager

EXP, TRIAL = "rollout-test", "t0"


def manager_config(n_trainer_ranks: int = 1, **fields) -> GserverManagerConfig:
    """A GserverManagerConfig whose admission budgets `n_trainer_ranks` trainer DP ranks. The
    manager's own weight updates are what these tests drive: the disk path (weight_sync=disk),
    where the trainer's broadcast is not in play."""
    return GserverManagerConfig(n_trainer_ranks=n_trainer_ranks, **{"weight_sync": "disk", **fields})


@contextlib.contextmanager
def running_manager(urls, **overrides):
    """The real manager app (HTTP server + watcher) on 127.0.0.1, over the given server URLs."""
    config = manager_config(**{"poll_interval": 0.05, "n_servers": len(urls), **overrides})
    # A new run's manager: not the restart of an earlier test's (the launcher clears this at start).
    name_resolve.clear_subtree(names.admission_ledger(EXP, TRIAL))
    server = serve_manager(config, EXP, TRIAL, server_urls=list(urls))
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def fake_servers(n, **kw):
    servers = [FakeSGLangServer(**kw).start() for _ in range(n)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def set_version(v: int, role: str = "actor"):
    name_resolve.add(names.model_version(EXP, TRIAL, role), v, replace=True)
