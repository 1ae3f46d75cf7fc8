"""The GserverManager: admits rollouts, routes generation requests, keeps servers' weights fresh.

HTTP endpoints (JSON; a body that does not validate gets a 422 naming the field):

    POST /allocate_rollout {qid, rank}                 → {success, reason}; `rank` (required): the
                                                         trainer DP rank the group will be pushed to,
                                                         whose budget admits it (422 if out of range)
    POST /schedule_request {qid, prompt_len, group_size, new_token_budget,
                            previous_server_url, previous_version}  → {url, version}; 409 for a
                                                         qid that is not an allocated, running rollout
    POST /finish_rollout   {qid, accepted, n_tokens, reason} → {success}; `reason`: why a rollout
                                                         that is not accepted ended without a group
                                                         (admission_ledger.ENDED_REASONS)
    GET  /routed_servers                               → {servers, joining}: the URLs routed now (a
                                                         client gives up a request on a server
                                                         dropped from routing instead of waiting
                                                         it out), and the healthy ones kept out of
                                                         routing until they hold the current weights
                                                         (the trainer's weight group takes both)
    POST /abandon_rollouts {qids}                      → {abandoned, unknown}: free the slots of
                                                         rollouts whose worker died (no count)
    GET  /status                                       → version, running, accepted, rejections,
                                                         the same per DP rank (`per_rank`),
                                                         per-server load and version, throughput
    GET  /metrics                                      → the same, Prometheus text format

What each endpoint does is `realhf.system.manager.manager_service.ManagerService` (admission docs/architecture.md §4,
routing, server health, weight versions). This file wires it to HTTP and to name resolve: a
watcher coroutine, in the same event loop as the app, every `poll_interval` s

    reads `model_version/<role>` and `stale_dropped` (a JSON list, one total per trainer DP rank;
        a missing key counts as zeros),
    routes to the servers registered under `gen_servers/` that answer `/health` (a killed server
        is dropped within ~`max_health_failures · health_check_interval` s; a restarted or added
        one is routed once the weight version it reports is the trainer's: `joining`),
    starts a sequential weight-update round (`realhf.system.manager.weight_update`) when servers are behind.

Health checks and update rounds run in tasks of their own, so the watcher and the handlers keep
answering while a server is being updated.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable, List, Optional

import aiohttp
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from realhf.api.worker_configs import GserverManagerConfig
from realhf.base import logging, name_resolve, names
from realhf.base.body_limit import BodySizeLimit
from realhf.base.secret import auth_headers, require_secret
from realhf.impl.inference.request import parse_weight_version
from realhf.system.manager.admission_ledger import AdmissionLedger
from realhf.system.manager.manager_metrics import METRICS_CONTENT_TYPE, render_metrics
from realhf.system.manager.manager_service import ManagerService
from realhf.system.streams.http_thread import HttpServerThread
from realhf.system.worker_base import Worker

logger = logging.getLogger("gserver_manager")


# ---- request bodies --------------------------------------------------------------------------
# Bounds of every number and string a client sends: far beyond any real value, far below what
# float arithmetic (throughput, token-usage routing) and the status page can carry without
# overflowing (a token count of 10**400 used to reach float()).
_MAX_COUNT = 2**31 - 1
_MAX_QID = 1024


class AllocateRequest(BaseModel):
    qid: str = Field(min_length=1, max_length=_MAX_QID)
    rank: int = Field(ge=0, le=_MAX_COUNT)  # required: a default would silently put every rollout in rank 0's budget


class ScheduleRequest(BaseModel):
    qid: str = Field(min_length=1, max_length=_MAX_QID)
    prompt_len: int = Field(ge=0, le=_MAX_COUNT)
    group_size: int = Field(1, ge=1, le=_MAX_COUNT)
    new_token_budget: int = Field(ge=0, le=_MAX_COUNT)
    previous_server_url: Optional[str] = Field(None, max_length=4096)
    previous_version: Optional[int] = Field(None, ge=0, le=_MAX_COUNT)


class FinishRequest(BaseModel):
    qid: str = Field(min_length=1, max_length=_MAX_QID)
    accepted: bool
    n_tokens: int = Field(0, ge=0, le=_MAX_COUNT)
    reason: str = Field("filtered", max_length=32)


class AbandonRequest(BaseModel):
    qids: List[str] = Field(max_length=100_000)


def _describe_validation_errors(errors) -> str:
    """`field: problem; ...` without echoing the input (it may be NaN, non-UTF-8 or huge)."""
    parts = []
    for err in list(errors)[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request body: " + "; ".join(parts)


def create_app(service: ManagerService, secret: str = "") -> FastAPI:
    app = FastAPI(title="realhf GserverManager")
    app.add_middleware(BodySizeLimit, max_bytes=service.config.max_request_bytes)
    # Every endpoint needs the run's secret (realhf.base.secret); refusals show in /status.
    auth_refused = require_secret(app, secret, logger, "gserver manager")

    @app.exception_handler(RequestValidationError)
    async def _on_invalid_body(request: Request, exc: RequestValidationError):
        # FastAPI's default handler echoes the offending input back and fails with a 500 when
        # that input is not UTF-8 or holds NaN/Infinity; answer 422 naming the field instead.
        return JSONResponse({"detail": _describe_validation_errors(exc.errors())}, status_code=422)

    @app.post("/allocate_rollout")
    async def allocate_rollout(req: AllocateRequest):
        try:
            return service.allocate(req.qid, req.rank)
        except ValueError as e:  # a rank beyond the trainer's DP size
            raise HTTPException(422, f"invalid request body: {e}") from None

    @app.post("/schedule_request")
    async def schedule_request(req: ScheduleRequest):
        try:
            return service.schedule(
                req.qid,
                req.prompt_len,
                req.group_size,
                req.new_token_budget,
                req.previous_server_url,
                req.previous_version,
            )
        except KeyError as e:
            raise HTTPException(409, str(e.args[0]) if e.args else str(e)) from None
        except RuntimeError as e:  # no generation server registered
            raise HTTPException(503, str(e)) from None

    @app.post("/finish_rollout")
    async def finish_rollout(req: FinishRequest):
        try:
            return service.finish(req.qid, req.accepted, req.n_tokens, req.reason)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else str(e)) from None
        except ValueError as e:  # an unknown reason
            raise HTTPException(422, f"invalid request body: {e}") from None

    @app.get("/routed_servers")
    async def routed_servers():
        return {"servers": service.routed_servers(), "joining": service.joining_servers()}

    @app.post("/abandon_rollouts")
    async def abandon_rollouts(req: AbandonRequest):
        return service.abandon(req.qids)

    @app.get("/status")
    async def status():
        return {**service.status(), "auth_refused": auth_refused.as_dict()}

    @app.get("/metrics")
    async def metrics():
        return Response(render_metrics(service.status()), media_type=METRICS_CONTENT_TYPE)

    return app


# ---- the watcher ----------------------------------------------------------------------------
async def run_watcher(
    service: ManagerService,
    read_version: Callable[[], int],
    read_stale_dropped: Callable[[], List[int]],
    list_servers: Callable[[], List[str]],
    secret: str = "",
) -> None:
    """Poll versions and servers; run weight-update rounds and health checks in tasks of their
    own. Routed servers = registered under gen_servers/ (a dead server's keep-alive entry
    expires) ∩ answering /health (a SIGKILLed one stops at once)."""
    config = service.config
    update_task: Optional[asyncio.Task] = None
    health_task: Optional[asyncio.Task] = None
    next_health = 0.0
    async with aiohttp.ClientSession(headers=auth_headers(secret)) as session:  # probes and weight updates
        try:
            while True:
                service.observe_trainer(read_version(), read_stale_dropped())
                urls = list_servers()
                service.observe_servers(urls)
                if health_task is not None and health_task.done():
                    health_task = None
                if health_task is None and time.monotonic() >= next_health:
                    next_health = time.monotonic() + config.health_check_interval
                    health_task = asyncio.create_task(check_health(service, session, urls))
                if update_task is not None and update_task.done():
                    update_task = None
                if update_task is None and service.update_due():
                    update_task = asyncio.create_task(service.updater.run_round(session, service.version.get_version))
                await asyncio.sleep(config.poll_interval)
        finally:
            for task in (update_task, health_task):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)


async def check_health(service: ManagerService, session: aiohttp.ClientSession, urls: List[str]) -> None:
    """GET /health of every registered server (and /get_model_info of one joining routing) and
    hand the results to the service's health rule."""
    timeout = aiohttp.ClientTimeout(total=service.config.health_timeout)

    async def probe(url: str) -> tuple:
        """(answered /health, the weight version a joining server reports or None, the trainer's
        version when it was asked for)."""
        try:
            async with session.get(f"{url}/health", timeout=timeout) as r:
                if r.status != 200:
                    return False, None, None
            if not service.is_joining(url):
                return True, None, None
            asked_at = service.current_version()
            async with session.get(f"{url}/get_model_info", timeout=timeout) as r:
                info = await r.json(content_type=None) if r.status == 200 else {}
            version = parse_weight_version(info.get("weight_version")) if isinstance(info, dict) else None
            return True, version, asked_at
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False, None, None

    results = await asyncio.gather(*(probe(u) for u in urls))
    for url, (ok, version, asked_at) in zip(urls, results):
        service.observe_health(url, ok, version, asked_at)
    service.forget_unregistered(urls)


# ---- name resolve ------------------------------------------------------------------------------
def _read_int(key: str) -> int:
    try:
        return int(name_resolve.get(key))
    except name_resolve.NameEntryNotFoundError:
        return 0


def read_stale_dropped(key: str, n_ranks: int) -> List[int]:
    """The trainer's stale-dropped totals per DP rank, published by the master as a JSON list;
    zeros while the key is missing (nothing dropped yet)."""
    try:
        raw = name_resolve.get(key)
    except name_resolve.NameEntryNotFoundError:
        return [0] * n_ranks
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise ValueError(f"{key}={raw!r}: expected a JSON list of stale-dropped totals per trainer DP rank")
    return value


def wait_for_servers(experiment: str, trial: str, n: int, timeout: float) -> List[str]:
    key = names.gen_servers(experiment, trial)
    deadline = time.monotonic() + timeout
    while True:
        urls = sorted(set(name_resolve.get_subtree(key)))
        if len(urls) >= n:
            return urls
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gserver_manager: {len(urls)} of {n} generation servers registered under "
                f"{key!r} within {timeout:.0f}s: {urls}"
            )
        time.sleep(0.1)


def serve_manager(
    config: GserverManagerConfig, experiment: str, trial: str, server_urls: Optional[List[str]] = None, secret: str = ""
) -> HttpServerThread:
    """Start the manager's HTTP server and watcher in a thread; `.service` is the ManagerService.
    The caller registers `.url` and calls `.stop()`. Servers passed in `server_urls` stay known
    (routed while they answer /health) besides those registered under gen_servers/."""
    static = list(server_urls or [])
    if server_urls is None:
        server_urls = wait_for_servers(experiment, trial, config.n_servers, config.discovery_timeout)
    ledger = AdmissionLedger(names.admission_ledger(experiment, trial), config.n_trainer_ranks)
    service = ManagerService(config, server_urls, ledger)
    version_key = names.model_version(experiment, trial, config.model_role)
    stale_key = names.stale_dropped(experiment, trial)
    servers_key = names.gen_servers(experiment, trial)

    async def watch():
        n_ranks = service.admission.n_ranks
        await run_watcher(
            service,
            lambda: _read_int(version_key),
            lambda: read_stale_dropped(stale_key, n_ranks),
            lambda: sorted(set(static) | set(name_resolve.get_subtree(servers_key))),
            secret,
        )

    thread = HttpServerThread(create_app(service, secret), host=config.host, name="gserver-manager", tasks=[watch])
    thread.service = service
    return thread.start()


class GserverManager(Worker):
    config_cls = GserverManagerConfig

    def _configure(self) -> None:
        self._server: Optional[HttpServerThread] = None
        self._key = names.gserver_manager(self.ctx.experiment_name, self.ctx.trial_name)
        cfg = self.config
        self._server = serve_manager(
            cfg,
            self.ctx.experiment_name,
            self.ctx.trial_name,
            server_urls=list(cfg.server_urls) or None,
            secret=self.ctx.secret,
        )
        name_resolve.add(self._key, self._server.url, replace=True)
        self._last_log = time.monotonic()
        self.logger.info(
            f"serving on {self._server.url}: {len(self._server.service.router.servers())} servers, policy "
            f"{cfg.schedule_policy}, B={cfg.groups_per_step} (per trainer rank "
            f"{self._server.service.admission.shares}), eta={cfg.max_head_offpolicyness}, "
            f"max_concurrent_rollouts={cfg.max_concurrent_rollouts}"
        )

    def _poll(self) -> bool:
        self._server.check()
        if time.monotonic() - self._last_log > self.config.log_interval:
            self._last_log = time.monotonic()
            s = self._server.service.status()
            servers = " ".join(f"{x['url']}[req={x['requests']} v={x['version']}]" for x in s["servers"])
            servers += "".join(f" {x['url']}[joining v={x['version']} {x['waited_s']:.0f}s]" for x in s["joining"])
            self.logger.info(
                f"v={s['version']} running={s['running']} accepted={s['accepted']} capacity={s['capacity']} "
                f"(per rank {s['per_rank']['capacity']}) stale_dropped={s['stale_dropped']} "
                f"rejections={s['rejections']} "
                f"tok/s={s['throughput']['tokens_per_s']:.0f} servers: {servers}"
            )
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
