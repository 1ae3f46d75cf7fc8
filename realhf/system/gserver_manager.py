"""The GserverManager: admits rollouts, routes generation requests, keeps servers' weights fresh.

HTTP endpoints (JSON; a body that does not validate gets a 422 naming the field):

    POST /allocate_rollout {qid}                       → {success, reason}
    POST /schedule_request {qid, prompt_len, group_size, new_token_budget,
                            previous_server_url, previous_version}  → {url, version}; 409 for a
                                                         qid that is not an allocated, running rollout
    POST /finish_rollout   {qid, accepted, n_tokens}   → {success}
    POST /abandon_rollouts {qids}                      → {abandoned, unknown}: free the slots of
                                                         rollouts whose worker died (no count)
    GET  /status                                       → version, running, accepted, rejections,
                                                         per-server load and version, throughput
    GET  /metrics                                      → the same, Prometheus text format

Admission is `realhf.impl.admission.StalenessManager` (DESIGN §4), routing
`realhf.impl.routing.Router`, weight updates `realhf.system.weight_update`. This file only wires
them to HTTP and to name resolve: a watcher coroutine, in the same event loop as the app, reads
`model_version/<role>` and `stale_dropped` every `poll_interval` s (a missing key counts as 0),
refreshes the server list under `gen_servers/` (routing only to servers that answer `/health`:
a killed server is dropped within ~`max_health_failures · health_check_interval` s, a
restarted one joins at the weight version it reports), and starts a sequential weight-update round when
servers are behind. Nothing in a request handler does I/O, so admission keeps answering while a
server is being updated.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable, Dict, List, Optional

import aiohttp
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
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


class AbandonRequest(BaseModel):
    qids: List[str] = Field(max_length=100_000)


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
                                          config.max_head_offpolicyness, self.version,
                                          accepted=config.trained_groups_at_start)
        self.router = Router(config.schedule_policy, server_urls)
        self.updater = WeightUpdater(config.fileroot, config.model_role, config.update_timeout)
        self.updater.set_servers(server_urls)
        self.t0 = time.monotonic()
        self.n_finished = 0
        self.n_filtered = 0
        self.total_tokens = 0
        self._recent = collections.deque()  # (time, n_tokens) of finished rollouts
        self._healthy = set(server_urls)  # answered /health (the initial servers are trusted)
        self._health_failures: Dict[str, int] = {}  # url -> failed checks in a row
        self._reported_versions: Dict[str, int] = {}  # url -> weight version it reported on joining
        self.n_servers_dropped = 0
        self.n_abandoned = 0

    # ---- handlers' logic ----------------------------------------------------------------------
    def allocate(self, qid: str) -> dict:
        d = self.admission.allocate(qid)
        return {"success": d.success, "reason": d.reason}

    def schedule(self, r: ScheduleRequest) -> dict:
        if not self.admission.is_running(r.qid):
            # Routing it would count load on a server until a /finish_rollout that never comes.
            raise KeyError(f"schedule_request({r.qid!r}): no running rollout with this qid "
                           "(call /allocate_rollout first, or it already finished)")
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

    def abandon(self, qids: List[str]) -> dict:
        """Free the slots of rollouts that died with their worker (a restarted rollout worker
        reports its previous incarnation's in-flight qids); unknown qids are ignored."""
        running = self.admission.running_qids()
        done = [q for q in dict.fromkeys(qids) if q in running]
        for qid in done:
            self.admission.abandon(qid)
            self.router.release(qid)
        self.n_abandoned += len(done)
        if done:
            logger.info(f"abandoned {len(done)} rollouts of a dead worker: {done[:5]}{' ...' if len(done) > 5 else ''}")
        return {"abandoned": len(done), "unknown": len(set(qids)) - len(done)}

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
        s["unhealthy_servers"] = sorted(self._health_failures)
        s["servers_dropped"] = self.n_servers_dropped
        s["abandoned"] = self.n_abandoned
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
        """Poll versions and servers; run weight-update rounds and health checks in tasks of
        their own. Routed servers = registered under gen_servers/ (a dead server's keep-alive
        entry expires) ∩ answering /health (a SIGKILLed one stops at once)."""
        update_task: Optional[asyncio.Task] = None
        health_task: Optional[asyncio.Task] = None
        next_health = 0.0
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
                    self._route_to([u for u in urls if u in self._healthy])
                    if health_task is not None and health_task.done():
                        health_task = None
                    if health_task is None and time.monotonic() >= next_health:
                        next_health = time.monotonic() + self.config.health_check_interval
                        health_task = asyncio.create_task(self.check_health(session, urls))
                    if update_task is not None and update_task.done():
                        update_task = None
                    if update_task is None and self.updater.due(self.version.value):
                        update_task = asyncio.create_task(self.updater.run_round(session, self.version.get_version))
                    await asyncio.sleep(self.config.poll_interval)
            finally:
                for task in (update_task, health_task):
                    if task is not None:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)

    def _route_to(self, urls: List[str]) -> None:
        """Make `urls` the routed servers; a server new to routing starts at the weight version
        it reported (a restarted server loads the current weights itself)."""
        old = self.router.servers()
        if set(urls) == set(old):
            return
        self.router.set_servers(urls)
        self.updater.set_servers(urls)
        for url in set(urls) - set(old):
            if url in self._reported_versions:
                self.updater.versions[url] = self._reported_versions[url]
        logger.info(f"routed generation servers: {old} → {urls}"
                    + ("" if urls else " (none alive: rollouts wait for a server to come back)"))

    async def check_health(self, session: aiohttp.ClientSession, urls: List[str]) -> None:
        """GET /health of every registered server; `max_health_failures` failures in a row drop
        a server from routing, one success brings it (back) in."""
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout)

        async def probe(url: str) -> bool:
            try:
                async with session.get(f"{url}/health", timeout=timeout) as r:
                    if r.status != 200:
                        return False
                if url not in self._healthy:  # new or returning: which weights does it hold?
                    async with session.get(f"{url}/get_model_info", timeout=timeout) as r:
                        info = await r.json(content_type=None) if r.status == 200 else {}
                    version = info.get("weight_version") if isinstance(info, dict) else None
                    if isinstance(version, int) and version >= 0:
                        self._reported_versions[url] = version
                return True
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                return False

        results = await asyncio.gather(*(probe(u) for u in urls))
        for url, ok in zip(urls, results):
            if ok:
                self._health_failures.pop(url, None)
                if url not in self._healthy:
                    self._healthy.add(url)
                    logger.info(f"generation server {url} is up (weight version "
                                f"{self._reported_versions.get(url, 'unknown')})")
                continue
            n = self._health_failures[url] = self._health_failures.get(url, 0) + 1
            if n >= self.config.max_health_failures and url in self._healthy:
                self._healthy.discard(url)
                self.n_servers_dropped += 1
                logger.warning(f"generation server {url} failed {n} health checks in a row; dropped from routing")
        for url in (self._healthy | set(self._health_failures)) - set(urls):  # deregistered or expired
            self._healthy.discard(url)
            self._health_failures.pop(url, None)
            self._reported_versions.pop(url, None)


def _describe_validation_errors(errors) -> str:
    """`field: problem; ...` without echoing the input (it may be NaN, non-UTF-8 or huge)."""
    parts = []
    for err in list(errors)[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request body: " + "; ".join(parts)


def create_app(service: ManagerService) -> FastAPI:
    app = FastAPI(title="realhf GserverManager")

    @app.exception_handler(RequestValidationError)
    async def _on_invalid_body(request: Request, exc: RequestValidationError):
        # FastAPI's default handler echoes the offending input back and fails with a 500 when
        # that input is not UTF-8 or holds NaN/Infinity; answer 422 naming the field instead.
        return JSONResponse({"detail": _describe_validation_errors(exc.errors())}, status_code=422)

    @app.post("/allocate_rollout")
    async def allocate_rollout(req: AllocateRequest):
        return service.allocate(req.qid)

    @app.post("/schedule_request")
    async def schedule_request(req: ScheduleRequest):
        try:
            return service.schedule(req)
        except KeyError as e:
            raise HTTPException(409, str(e.args[0]) if e.args else str(e))
        except RuntimeError as e:  # no generation server registered
            raise HTTPException(503, str(e))

    @app.post("/finish_rollout")
    async def finish_rollout(req: FinishRequest):
        try:
            return service.finish(req.qid, req.accepted, req.n_tokens)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else str(e))

    @app.post("/abandon_rollouts")
    async def abandon_rollouts(req: AbandonRequest):
        return service.abandon(req.qids)

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
    The caller registers `.url` and calls `.stop()`. Servers passed in `server_urls` stay known
    (routed while they answer /health) besides those registered under gen_servers/."""
    static = list(server_urls or [])
    if server_urls is None:
        server_urls = wait_for_servers(experiment, trial, config.n_servers, config.discovery_timeout)
    service = ManagerService(config, server_urls)
    version_key = names.model_version(experiment, trial, config.model_role)
    stale_key = names.stale_dropped(experiment, trial)
    servers_key = names.gen_servers(experiment, trial)

    async def watch():
        await service.watch(lambda: _read_int(version_key), lambda: _read_int(stale_key),
                            lambda: sorted(set(static) | set(name_resolve.get_subtree(servers_key))))

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
