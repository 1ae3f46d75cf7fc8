"""What an agent calls to generate: manager-routed, chunked, resumable requests (docs/architecture.md §5).

    result = await client.generate(qid, prompt_ids, gconfig, group_size)

For one sample this loops
    ask the manager `/schedule_request` for a server → POST `<server>/generate`
until the answer stops (EOS / stop token) or reaches its token budget. A request that comes back
with `finish_reason.type == "abort"` (the server was paused for a weight update) or that hit the
`new_tokens_per_chunk` limit is resubmitted as prompt + tokens so far; the manager is told the
previous server and version, so the group stays on its server while the weights are unchanged.
Every output token keeps the `weight_version` of the response that produced it, and its
behaviour log-prob.

A generation server that cannot be reached (killed, restarting: connection refused or dropped,
HTTP 502/503), that gives no answer within `request_timeout` s (alive but hung: its engine
stuck, its process stopped; with `new_tokens_per_chunk` the timeout is per chunk), or a manager
that has no live server to offer (503) is not the episode's failure:
the request is scheduled again — to another server once the manager dropped the dead one — with
the tokens already generated kept, backing off up to 5 s, for at most `server_wait_timeout` s
without progress. With one server only, that is how rollouts wait for its restart.

All samples of a group share one route (url, version) and, mostly, one scheduling call: a sample
that needs a server takes the route a sibling scheduled since this sample's own last request (the
group's first wave, or the wave of resubmissions after a weight update) and asks the manager only
when no sibling did. The manager routes by group anyway (all samples on one server, its load
counted per group), so a call per sample would only cost an HTTP round trip each. A failed
server clears the route, so the next sample schedules afresh.

One kept-alive aiohttp session serves every call of a worker, those to the manager included
(`.manager`, a `ManagerClient` on the same session; NOTES: aiohttp ≫ httpx at 64+ concurrent
requests). Every call has a timeout whose error names the URL.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import aiohttp

from realhf.base import logging
from realhf.base.secret import auth_headers
from realhf.impl.inference.request import parse_weight_version
from realhf.system.manager.manager_client import ManagerClient
from realhf.system.streams.http_json import GenerationError, ServerUnavailableError, post_json

logger = logging.getLogger("generation_client")

# How often a request still waiting for its answer checks that its server is routed (one read of
# the manager per client per period, shared by all its requests).
ROUTE_CHECK_S = 2.0


@dataclass
class GenerationResult:
    output_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)  # behaviour log-prob of each output token
    versions: List[int] = field(default_factory=list)  # weight version that produced each token
    finish_reason: str = ""  # "stop" (EOS or a stop token) or "length" (budget or server limit)
    n_requests: int = 0  # /generate calls it took

    @property
    def no_eos(self) -> bool:
        return self.finish_reason != "stop"


@dataclass
class _Route:
    url: Optional[str] = None
    version: Optional[int] = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    epoch: int = 0  # scheduling calls made for the group so far


class GenerationClient:
    """Generation for one worker's episodes. `.manager` is the `ManagerClient` it schedules
    through, on the same session; the worker admits and finishes rollouts with it."""

    def __init__(
        self,
        manager_url: str,
        *,
        new_tokens_per_chunk: int = 0,
        request_timeout: float = 300.0,
        manager_timeout: float = 30.0,
        eos_token_id: Optional[int] = None,
        server_wait_timeout: float = 300.0,
        secret: str = "",
        manager_resolve: Optional[Callable[[], str]] = None,
        manager_wait_timeout: float = 0.0,
        stopped: Callable[[], bool] = lambda: False,
    ):
        """`manager_resolve`, `manager_wait_timeout`, `stopped`: how the ManagerClient finds a
        restarted manager (realhf.system.manager.manager_client)."""
        # new_tokens_per_chunk >= 0: the config's rule, checked at start and at the worker's entry.
        self.new_tokens_per_chunk = new_tokens_per_chunk
        self.request_timeout = request_timeout
        self.eos_token_id = eos_token_id
        self.server_wait_timeout = server_wait_timeout
        self._headers = auth_headers(secret)  # the run's secret, on every call to the manager and servers
        self._session: Optional[aiohttp.ClientSession] = None
        self.manager = ManagerClient(
            manager_url,
            self.session,
            manager_timeout,
            resolve=manager_resolve,
            wait_timeout=manager_wait_timeout,
            stopped=stopped,
        )
        self._routes: Dict[str, _Route] = {}
        self._rids = itertools.count()
        self._rid_prefix = f"{os.getpid()}-{id(self):x}"
        self.n_generate_calls = 0
        self.n_aborts = 0
        self.n_unavailable = 0  # requests resubmitted because their server or the manager was unavailable
        self.n_dropped = 0  # requests given up because the manager dropped their server from routing
        self._routed_cache: Optional[Tuple[float, frozenset]] = None
        self._routed_read: Optional[asyncio.Future] = None
        self.n_timeouts = 0  # /generate calls that got no answer within request_timeout (hung server)
        self.n_shared_routes = 0  # requests that went by a sibling's route, without a scheduling call
        self._warned: Dict[str, int] = {}  # qid -> highest unavailable attempt logged

    # ---- session ------------------------------------------------------------------------------
    async def __aenter__(self) -> "GenerationClient":
        self.session()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No connection cap: a worker may have hundreds of samples in flight on loopback.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- a group's route -----------------------------------------------------------------------
    def forget(self, qid: str) -> None:
        """Drop the group's route (the episode ended; call before `manager.finish_rollout`)."""
        self._routes.pop(qid, None)
        self._warned.pop(qid, None)

    async def _schedule(
        self, qid: str, prompt_len: int, group_size: int, budget: int, seen_epoch: int
    ) -> Tuple[str, int, int]:
        """(url, version, epoch) for a sample whose last request used the route of `seen_epoch`."""
        route = self._routes.setdefault(qid, _Route())
        async with route.lock:
            if route.url is not None and route.epoch > seen_epoch:
                self.n_shared_routes += 1
                return route.url, route.version, route.epoch
            route.url, route.version = await self.manager.schedule_request(
                qid, prompt_len, group_size, budget, previous_url=route.url, previous_version=route.version
            )
            route.epoch += 1
            return route.url, route.version, route.epoch

    # ---- generation ---------------------------------------------------------------------------
    async def generate(
        self,
        qid: str,
        input_ids: Sequence[int],
        gconfig: Any,
        group_size: int = 1,
        max_new_tokens: Optional[int] = None,
    ) -> GenerationResult:
        """One sample of group `qid`: `max_new_tokens` (default `gconfig.max_new_tokens`) at most."""
        budget = int(gconfig.max_new_tokens if max_new_tokens is None else max_new_tokens)
        return await self._continue(qid, [int(t) for t in input_ids], gconfig, group_size, budget, GenerationResult())

    async def _continue(
        self, qid: str, prompt: List[int], gconfig: Any, group_size: int, budget: int, result: GenerationResult, epoch=0
    ) -> GenerationResult:
        """`generate` from `result` (the sample's tokens so far; `epoch`: the group route its last
        request went by) until it stops or reaches `budget`."""
        if result.finish_reason:
            return result
        empty_aborts, progress_at = 0, time.monotonic()
        unavailable, down_since = 0, 0.0  # the current streak of unreachable servers
        while True:
            remaining = budget - len(result.output_ids)
            if remaining <= 0:
                result.finish_reason = "length"
                return result
            chunk = min(remaining, self.new_tokens_per_chunk) if self.new_tokens_per_chunk else remaining
            url = None
            try:
                try:
                    url, version, epoch = await self._schedule(
                        qid, len(prompt) + len(result.output_ids), group_size, remaining, epoch
                    )
                except ServerUnavailableError as e:
                    if e.status != 503:  # the manager itself is gone: that is not a server to wait for
                        raise GenerationError(str(e)) from None
                    raise  # the manager has no live server right now
                ids, logprobs, reason, weight_version = await self._generate_once(
                    url, prompt + result.output_ids, gconfig, chunk, len(result.output_ids)
                )
            except ServerUnavailableError as e:
                unavailable += 1
                down_since = down_since if unavailable > 1 else time.monotonic()
                await self._wait_for_server(qid, url, e, unavailable, down_since)
                continue
            unavailable = 0
            result.n_requests += 1
            result.output_ids += ids
            result.logprobs += logprobs
            result.versions += token_versions(weight_version, version, len(ids))
            if reason == "stop":
                result.finish_reason = "stop"
                return result
            if reason == "abort":
                self.n_aborts += 1
                if ids:
                    empty_aborts, progress_at = 0, time.monotonic()
                    continue
                # Aborted before any token: back off, and give up if the server makes no progress
                # for as long as one request may take (it stays paused?).
                empty_aborts += 1
                if time.monotonic() - progress_at > self.request_timeout:
                    raise GenerationError(
                        f"{url}/generate aborted {empty_aborts} times without a new token in "
                        f"{self.request_timeout:.0f}s for qid {qid!r} (server stuck paused?)"
                    )
                await asyncio.sleep(min(0.5, 0.01 * 2 ** min(empty_aborts, 6)))
                continue
            if _ended_short(reason, ids, chunk):
                result.finish_reason = "length"
                return result

    async def _wait_for_server(
        self, qid: str, url: Optional[str], error: Exception, attempt: int, down_since: float
    ) -> None:
        """Back off before resubmitting a request whose server (or the manager) was unavailable;
        raise once the streak of failures lasted `server_wait_timeout` s."""
        self.n_unavailable += 1
        waited = time.monotonic() - down_since
        if waited > self.server_wait_timeout:
            raise GenerationError(
                f"qid {qid!r}: no generation server reachable for {waited:.0f}s "
                f"(server_wait_timeout={self.server_wait_timeout:.0f}s); last error: {error}"
            )
        route = self._routes.get(qid)
        if route is not None and url is not None and route.url == url:
            route.url = None  # no affinity to a server that just failed
        delay = min(5.0, 0.1 * 2 ** min(attempt - 1, 6))
        # One line per group at attempts 1, 2, 4, 8, ... (its samples fail together): a waiting
        # group logs rarely.
        if attempt & (attempt - 1) == 0 and attempt > self._warned.get(qid, 0):
            self._warned[qid] = attempt
            logger.warning(
                f"qid {qid!r}: {error}; resubmitting in {delay:.1f}s (attempt {attempt}, "
                f"{waited:.0f}s of server_wait_timeout={self.server_wait_timeout:.0f}s)"
            )
        await asyncio.sleep(delay)

    async def generate_group(
        self,
        qid: str,
        input_ids: Sequence[int],
        gconfig: Any,
        n: int,
        max_new_tokens: Optional[int] = None,
        one_request: bool = False,
    ) -> List[GenerationResult]:
        """`n` samples of one prompt, concurrently, on the group's server. `one_request`: their
        first requests go as one /generate with `sampling_params.n = n` (SGLang's parallel
        sampling: one HTTP round trip, one prefill of the prompt on the server); a sample that
        needs more (aborted by a weight update, a `new_tokens_per_chunk` chunk done) goes on by
        itself as `generate` does, and all of them do when that request fails (server unavailable)."""
        budget = int(gconfig.max_new_tokens if max_new_tokens is None else max_new_tokens)
        prompt = [int(t) for t in input_ids]
        starts = [(GenerationResult(), 0) for _ in range(n)]
        if one_request and n > 1 and budget > 0:
            starts = await self._first_wave(qid, prompt, gconfig, n, budget) or starts
        return list(
            await asyncio.gather(
                *(self._continue(qid, prompt, gconfig, n, budget, result, epoch) for result, epoch in starts)
            )
        )

    async def _first_wave(
        self, qid: str, prompt: List[int], gconfig: Any, n: int, budget: int
    ) -> Optional[List[Tuple[GenerationResult, int]]]:
        """(the sample's result so far, the route epoch) for each of the `n` samples of one
        /generate with sampling_params.n = n; None when the request failed for want of a server
        (the samples then start afresh, waiting for one as `generate` does)."""
        chunk = min(budget, self.new_tokens_per_chunk) if self.new_tokens_per_chunk else budget
        url = None
        try:
            url, version, epoch = await self._schedule(qid, len(prompt), n, budget, 0)
            answers = await self._generate_once(url, prompt, gconfig, chunk, 0, n=n)
        except ServerUnavailableError as e:
            if url is None and e.status != 503:
                raise GenerationError(str(e)) from None  # the manager itself is gone
            # Backed off and logged as any resubmission is; the samples then go on one by one.
            await self._wait_for_server(qid, url, e, 1, time.monotonic())
            return None
        starts = []
        for ids, logprobs, reason, weight_version in answers:
            result = GenerationResult(list(ids), list(logprobs), token_versions(weight_version, version, len(ids)))
            result.n_requests = 1  # the group's one request, counted for each of its samples
            if reason == "stop":
                result.finish_reason = "stop"
            elif _ended_short(reason, ids, chunk) or len(ids) >= budget:
                result.finish_reason = "length"
            self.n_aborts += reason == "abort"
            starts.append((result, epoch))
        return starts

    async def _generate_once(self, url: str, input_ids: List[int], gconfig: Any, max_new_tokens: int, n_done: int, n=1):
        """(output_ids, logprobs, finish type, weight_version) of one /generate; with `n` > 1 a
        list of them, one per sample (SGLang's answer to sampling_params.n)."""
        rid = f"{self._rid_prefix}-{next(self._rids)}"
        params = sampling_params(gconfig, max_new_tokens, self.eos_token_id, n_done)
        if n > 1:
            params["n"] = n
        body = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True, "rid": rid}
        self.n_generate_calls += 1
        try:
            r = await self._unless_dropped(
                url, post_json(self.session(), f"{url}/generate", body, self.request_timeout, allow_list=n > 1)
            )
        except TimeoutError as e:
            # Alive but hung (engine stuck, process stopped): like a dead server, resubmit
            # elsewhere; the manager drops it once its health checks time out.
            self.n_timeouts += 1
            raise ServerUnavailableError(f"{e} (request_timeout; treating the server as hung)") from None
        if n == 1:
            return parse_generate_response(url, r)
        if not isinstance(r, list) or len(r) != n:
            raise GenerationError(
                f"{url}/generate answered sampling_params.n={n} with "
                f"{f'{len(r)} items' if isinstance(r, list) else 'one object'}, not a list of {n}"
            )
        return [parse_generate_response(url, item) for item in r]

    async def _unless_dropped(self, url: str, call):
        """Await `call` (a request to `url`) unless the manager drops `url` from routing first
        (its health checks failed: dead, partitioned, stopped); then give it up with a
        ServerUnavailableError, so the sample is resubmitted elsewhere with its tokens now, not
        after `request_timeout` (300 s: a partitioned server used to hold every rollout slot
        that long)."""
        task = asyncio.ensure_future(call)
        missing = 0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=ROUTE_CHECK_S)
                if done:
                    return task.result()
                routed = await self._routed()
                missing = missing + 1 if routed is not None and url not in routed else 0
                if missing >= 2:  # twice in a row: not a moment between a drop and a rejoin
                    self.n_dropped += 1
                    raise ServerUnavailableError(
                        f"POST {url}/generate given up: the manager dropped {url} from routing (failed health checks)"
                    )
        finally:
            if not task.done():
                task.cancel()

    async def _routed(self) -> Optional[frozenset]:
        """The manager's routed servers, read at most once per ROUTE_CHECK_S for all requests;
        None if it cannot be read now (then nothing is given up)."""
        now = time.monotonic()
        if self._routed_cache is not None and now - self._routed_cache[0] < ROUTE_CHECK_S:
            return self._routed_cache[1]
        if self._routed_read is None or self._routed_read.done():
            self._routed_read = asyncio.ensure_future(self.manager.routed_servers())
        try:
            urls = frozenset(await asyncio.shield(self._routed_read))
        except (GenerationError, TimeoutError):
            return None
        self._routed_cache = (time.monotonic(), urls)
        return urls


def _ended_short(reason: str, ids: List[int], chunk: int) -> bool:
    """The server stopped at `length` short of the `chunk` asked for: its context is full."""
    return reason == "length" and len(ids) < chunk


def sampling_params(
    gconfig: Any, max_new_tokens: int, eos_token_id: Optional[int] = None, n_done: int = 0
) -> Dict[str, Any]:
    """The `sampling_params` of a /generate request for `gconfig` (a GenerationHyperparameters),
    `n_done` tokens into the answer; EOS is a stop token besides gconfig's own."""
    stop = [int(t) for t in getattr(gconfig, "stop_token_ids", [])]
    if eos_token_id is not None and eos_token_id not in stop:
        stop.append(int(eos_token_id))
    params = {
        "max_new_tokens": int(max_new_tokens),
        "temperature": float(gconfig.temperature),
        "top_p": float(gconfig.top_p),
        "top_k": int(gconfig.top_k),
        "stop_token_ids": stop,
    }
    min_new = int(getattr(gconfig, "min_new_tokens", 0)) - n_done
    if min_new > 0:
        params["min_new_tokens"] = min(min_new, int(max_new_tokens))
    return params


def token_versions(weight_version: Union[None, int, List[int]], routed: Optional[int], n: int) -> List[int]:
    """The version of each of `n` output tokens: per token where the answer said
    (meta_info.weight_versions), else its one version, else the version the manager routed by."""
    if isinstance(weight_version, list):
        return weight_version
    return [routed if weight_version is None else weight_version] * n


def parse_generate_response(
    url: str, r: Dict[str, Any]
) -> Tuple[List[int], List[float], str, Union[None, int, List[int]]]:
    """(output_ids, logprobs, finish type, weight version) of an SGLang /generate answer; the
    version is None (not said), one int, or one per token when the weights changed while the
    request ran (SGLang's `meta_info.weight_versions` spans, or `weight_version_changes` of an
    older realhf server)."""
    where = f"{url}/generate answer"
    ids = r.get("output_ids")
    meta = r.get("meta_info")
    if not isinstance(ids, list) or not isinstance(meta, dict):
        raise GenerationError(f"{where} lacks output_ids or meta_info: {str(r)[:200]}")
    finish = meta.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, dict) else finish
    if reason not in ("stop", "length", "abort"):
        raise GenerationError(f"{where}: unknown finish_reason {finish!r}")
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise GenerationError(
            f"{where}: {len(entries) if isinstance(entries, list) else 'no'} output_token_logprobs "
            f"for {len(ids)} output_ids (was return_logprob honoured?)"
        )
    try:
        logprobs = [float(e[0]) for e in entries]
        ids = [int(t) for t in ids]
    except (TypeError, ValueError, IndexError):
        raise GenerationError(f"{where}: malformed output_ids or output_token_logprobs") from None
    per_token = _versions_per_token(where, meta, len(ids))
    if per_token is not None:
        return ids, logprobs, reason, per_token
    # SGLang's string ("3"), an older server's integer; None for a name such as SGLang's "default"
    # (then the version the manager routed by stands for it).
    return ids, logprobs, reason, parse_weight_version(meta.get("weight_version"))


def _versions_per_token(where: str, meta: Dict[str, Any], n: int) -> Optional[List[int]]:
    """The version of each of the `n` output tokens when the answer says they differ; None when
    they are all of one version (or the versions are names, such as SGLang's "default")."""
    spans = meta.get("weight_versions")  # SGLang's: [{version, start, end}] tiling the output
    if spans:
        try:
            marks = [(int(s["start"]), int(s["end"]), parse_weight_version(s["version"])) for s in spans]
        except (TypeError, ValueError, KeyError):
            raise GenerationError(f"{where}: malformed weight_versions {str(spans)[:200]}") from None
        tiles = [m[0] for m in marks] == [0] + [m[1] for m in marks[:-1]] and marks[-1][1] == n
        if not tiles or any(start > end for start, end, _ in marks):
            raise GenerationError(f"{where}: weight_versions {str(spans)[:200]} do not tile the {n} output tokens")
        versions = {v for _, _, v in marks}
        if len(versions) == 1 or None in versions:
            return None  # one version (meta_info.weight_version says it), or names this project cannot order
        return [v for start, end, v in marks for _ in range(end - start)]
    changes = meta.get("weight_version_changes")  # realhf's own field before it spoke SGLang's
    if changes:
        try:
            starts = [(int(i), parse_weight_version(v)) for i, v in changes]
        except (TypeError, ValueError):
            raise GenerationError(f"{where}: malformed weight_version_changes {str(changes)[:200]}") from None
        if (
            starts[0][0] != 0
            or any(v is None for _, v in starts)
            or [i for i, _ in starts] != sorted(i for i, _ in starts)
        ):
            raise GenerationError(f"{where}: malformed weight_version_changes {str(changes)[:200]}")
        ends = [i for i, _ in starts[1:]] + [n]
        return [v for (i, v), end in zip(starts, ends) for _ in range(end - i)]
    return None
