"""The GserverManager: admits rollouts, routes generation requests, keeps servers' weights fresh.

HTTP endpoints (JSON; a body that does not validate gets a 422 naming the field):

    POST /allocate_rollout {qid}                       → {success, reason}
    POST /schedule_request {qid, prompt_len, group_size, new_token_budget,
                            previous_server_url, previous_version}  → {url, version}
    POST /finish_rollout   {qid, accepted, n_tokens}   → {success}
    GET  /status                                       → version, running, accepted, rejections,
                                                         per-server load and version, throughput
    GET  /metrics                                      → the same, Prometheus text format

Admission is `realhf.impl.admission.StalenessManager` (DESIGN §4), routing
`realhf.impl.routing.Router`, weight updates `realhf.system.weight_update`. This file only wires
them to HTTP and to name resolve: a watcher coroutine, in the same event loop as the app, reads
`model_version/<role>` and `stale_dropped` every `poll_interval` s (a missing key counts as 0),
refreshes the server list under `gen_servers/`, and starts a sequential weight-update round when
servers are behind. Nothing in a request handler does I/O, so admission keeps answering while a
server is being updated.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable, List, Optional

import aiohttp
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from realhf.api.cli_args import GserverManagerConfig
from realhf.base import logging, name_resolve, names
from realhf.impl.admission import StalenessManager
from realhf.impl.routing import Router
from realhf.system.http_thread import HttpServerThread
from realhf.system.weight_update import WeightUpdater
from realhf.system.worker_base import Worker

logger = logging.getLogger("gserver_manager")

THROUGHPUT_WINDOW_S = 60.0


# ---- request bodies --------------------------------------------------------------------------
class AllocateRequest(BaseModel):
    qid: str = Field(min_length=1)


class ScheduleRequest(BaseModel):
    qid: str = Field(min_length=1)
    prompt_len: int = Field(ge=0)
    group_size: int = Field(1, ge=1)
    new_token_budget: int = Field(ge=0)
    previous_server_url: Optional[str] = None
    previous_version: Optional[int] = None


class FinishRequest(BaseModel):
    qid: str = Field(min_length=1)
    accepted: bool
    n_tokens: int = Field(0, ge=0)


class _Version:
    """The trainer version as last read by the watcher (handlers never do I/O)."""

    def __init__(self):
        self.value = 0

    def get_version(self) -> int:
        return self.value


class ManagerService:
    """Admission + routing + weight versions + counters; no sockets."""

    def __init__(self, config: GserverManagerConfig, server_urls: List[str]):
        self.config = config
        self.version = _Version()
        self.admission = StalenessManager(config.max_concurrent_rollouts, config.train_batch_size,
                                          config.max_head_offpolicyness, self.version)
        self.router = Router(config.schedule_policy, server_urls)
        self.updater = WeightUpdater(config.fileroot, config.model_role, config.update_timeout)
        self.updater.set_servers(server_urls)
        self.t0 = time.monotonic()
        self.n_finished = 0
        self.n_filtered = 0
        self.total_tokens = 0
        self._recent = collections.deque()  # (time, n_tokens) of finished rollouts

    # ---- handlers' logic ----------------------------------------------------------------------
    def allocate(self, qid: str) -> dict:
        d = self.admission.allocate(qid)
        return {"success": d.success, "reason": d.reason}

    def schedule(self, r: ScheduleRequest) -> dict:
        version = self.version.value
        url = self.router.schedule(r.qid, r.prompt_len, r.group_size, r.new_token_budget,
                                   previous_url=r.previous_server_url, previous_version=r.previous_version,
                                   current_version=version)
        return {"url": url, "version": version}

    def finish(self, qid: str, accepted: bool, n_tokens: int) -> dict:
        self.admission.finish(qid, accepted)  # KeyError: never allocated or already finished
        self.router.release(qid)
        now = time.monotonic()
        self.n_finished += 1
        self.n_filtered += 0 if accepted else 1
        self.total_tokens += n_tokens
        self._recent.append((now, n_tokens))
        return {"success": True}

    def _throughput(self) -> dict:
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        window = min(THROUGHPUT_WINDOW_S, max(now - self.t0, 1e-6))
        return {
            "window_s": round(window, 1),
            "tokens_per_s": sum(n for _, n in self._recent) / window,
            "rollouts_per_s": len(self._recent) / window,
            "total_tokens": self.total_tokens,
            "finished": self.n_finished,
            "filtered": self.n_filtered,
        }

    def status(self) -> dict:
        s = self.admission.status()
        loads = self.router.loads()
        s["servers"] = [
            {"url": url, "requests": load.requests, "tokens": load.tokens,
             "version": self.updater.versions.get(url), "updating": self.updater.updating == url}
            for url, load in loads.items()
        ]
        s["schedule_policy"] = self.router.policy
        s["weight_updates"] = {"done": self.updater.n_updates, "failed": self.updater.n_failures,
                               "last_error": self.updater.last_error}
        s["throughput"] = self._throughput()
        return s

    def metrics_text(self) -> str:
        s = self.status()
        lines = [
            "# TYPE realhf_manager_version gauge", f"realhf_manager_version {s['version']}",
            "# TYPE realhf_manager_running_rollouts gauge", f"realhf_manager_running_rollouts {s['running']}",
            "# TYPE realhf_manager_accepted_rollouts_total counter",
            f"realhf_manager_accepted_rollouts_total {s['accepted']}",
            "# TYPE realhf_manager_stale_dropped_total counter", f"realhf_manager_stale_dropped_total {s['stale_dropped']}",
            "# TYPE realhf_manager_capacity gauge", f"realhf_manager_capacity {s['capacity']}",
            "# TYPE realhf_manager_rejections_total counter",
        ]
        lines += [f'realhf_manager_rejections_total{{reason="{r}"}} {n}' for r, n in s["rejections"].items()]
        lines += ["# TYPE realhf_manager_generated_tokens_total counter",
                  f"realhf_manager_generated_tokens_total {s['throughput']['total_tokens']}",
                  "# TYPE realhf_manager_server_requests gauge"]
        lines += [f'realhf_manager_server_requests{{url="{x["url"]}"}} {x["requests"]}' for x in s["servers"]]
        lines += ["# TYPE realhf_manager_server_tokens gauge"]
        lines += [f'realhf_manager_server_tokens{{url="{x["url"]}"}} {x["tokens"]}' for x in s["servers"]]
        lines += ["# TYPE realhf_manager_server_version gauge"]
        lines += [f'realhf_manager_server_version{{url="{x["url"]}"}} {x["version"]}' for x in s["servers"]]
        return "\n".join(lines) + "\n"

    # ---- the watcher --------------------------------------------------------------------------
    async def watch(self, read_version: Callable[[], int], read_stale_dropped: Callable[[], int],
                    list_servers: Callable[[], List[str]]) -> None:
        """Poll versions and servers; run weight-update rounds in a task of their own."""
        update_task: Optional[asyncio.Task] = None
        async with aiohttp.ClientSession() as session:
            try:
                while True:
                    version = read_version()
                    if version > self.version.value:
                        logger.info(f"model version {self.version.value} → {version}")
                        self.version.value = version
                    stale = read_stale_dropped()
                    if stale > self.admission.status()["stale_dropped"]:
                        self.admission.set_stale_dropped(stale)
                    urls = list_servers()
                    if urls and set(urls) != set(self.router.servers()):
                        logger.info(f"generation servers changed: {self.router.servers()} → {urls}")
                        self.router.set_servers(urls)
                        self.updater.set_servers(urls)
                    if update_task is not None and update_task.done():
                        update_task = None
                    if update_task is None and self.updater.due(self.version.value):
                        update_task = asyncio.create_task(self.updater.run_round(session, self.version.get_version))
                    await asyncio.sleep(self.config.poll_interval)
            finally:
                if update_task is not None:
                    update_task.cancel()
                    await asyncio.gather(update_task, return_exceptions=True)


def create_app(service: ManagerService) -> FastAPI:
    app = FastAPI(title="realhf GserverManager")

    @app.post("/allocate_rollout")
    async def allocate_rollout(req: AllocateRequest):
        return service.allocate(req.qid)

    @app.post("/schedule_request")
    async def schedule_request(req: ScheduleRequest):
        try:
            return service.schedule(req)
        except RuntimeError as e:  # no generation server registered
            raise HTTPException(503, str(e))

    @app.post("/finish_rollout")
    async def finish_rollout(req: FinishRequest):
        try:
            return service.finish(req.qid, req.accepted, req.n_tokens)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else str(e))

    @app.get("/status")
    async def status():
        return service.status()

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.metrics_text())

    return app


# ---- name resolve ------------------------------------------------------------------------------
def _read_int(key: str) -> int:
    try:
        return int(name_resolve.get(key))
    except name_resolve.NameEntryNotFoundError:
        return 0


def wait_for_servers(experiment: str, trial: str, n: int, timeout: float) -> List[str]:
    key = names.gen_servers(experiment, trial)
    deadline = time.monotonic() + timeout
    while True:
        urls = sorted(set(name_resolve.get_subtree(key)))
        if len(urls) >= n:
            return urls
        if time.monotonic() > deadline:
            raise TimeoutError(f"gserver_manager: {len(urls)} of {n} generation servers registered under "
                               f"{key!r} within {timeout:.0f}s: {urls}")
        time.sleep(0.1)


def serve_manager(config: GserverManagerConfig, experiment: str, trial: str,
                  server_urls: Optional[List[str]] = None) -> HttpServerThread:
    """Start the manager's HTTP server and watcher in a thread; `.service` is the ManagerService.
    The caller registers `.url` and calls `.stop()`."""
    if server_urls is None:
        server_urls = wait_for_servers(experiment, trial, config.n_servers, config.discovery_timeout)
    service = ManagerService(config, server_urls)
    version_key = names.model_version(experiment, trial, config.model_role)
    stale_key = names.stale_dropped(experiment, trial)
    servers_key = names.gen_servers(experiment, trial)

    async def watch():
        await service.watch(lambda: _read_int(version_key), lambda: _read_int(stale_key),
                            lambda: sorted(set(name_resolve.get_subtree(servers_key))))

    thread = HttpServerThread(create_app(service), host=config.host, name="gserver-manager", tasks=[watch])
    thread.service = service
    return thread.start()


class GserverManager(Worker):
    config_cls = GserverManagerConfig

    def _configure(self) -> None:
        self._server: Optional[HttpServerThread] = None
        self._key = names.gserver_manager(self.ctx.experiment_name, self.ctx.trial_name)
        cfg = self.config
        self._server = serve_manager(cfg, self.ctx.experiment_name, self.ctx.trial_name)
        name_resolve.add(self._key, self._server.url, replace=True)
        self._last_log = time.monotonic()
        self.logger.info(
            f"serving on {self._server.url}: {len(self._server.service.router.servers())} servers, policy "
            f"{cfg.schedule_policy}, B={cfg.train_batch_size}, eta={cfg.max_head_offpolicyness}, "
            f"max_concurrent_rollouts={cfg.max_concurrent_rollouts}")

    def _poll(self) -> bool:
        self._server.check()
        if time.monotonic() - self._last_log > self.config.log_interval:
            self._last_log = time.monotonic()
            s = self._server.service.status()
            servers = " ".join(f"{x['url']}[req={x['requests']} v={x['version']}]" for x in s["servers"])
            self.logger.info(
                f"v={s['version']} running={s['running']} accepted={s['accepted']} capacity={s['capacity']} "
                f"stale_dropped={s['stale_dropped']} rejections={s['rejections']} "
                f"tok/s={s['throughput']['tokens_per_s']:.0f} servers: {servers}")
        time.sleep(0.1)
        return True

    def _exit_hook(self) -> None:
        if getattr(self, "_server", None) is None:
            return
        try:
            name_resolve.delete(self._key)
        except Exception:  # noqa: BLE001 - the trial may already be torn down
            pass
        self._server.stop()
