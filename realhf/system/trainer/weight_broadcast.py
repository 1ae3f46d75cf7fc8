"""New weights from the trainer to every generation server at once, in memory (`weight_sync=distributed`).

DP rank 0 of the trainer is rank 0 of a process group whose other members are the generation
servers the manager routes to and those joining routing (a restarted or added server is routed
only once it holds the current weights, and this broadcast is how it gets them; `Members`), built
through SGLang's own HTTP protocol, so the code that drives the built-in engine drives SGLang too:

    once per member set    POST /init_weights_update_group  {master_address, master_port,
                           rank_offset: i + 1, world_size: n + 1, group_name, backend}
    per version            POST /pause_generation (SGLang only: running requests return abort
                           with their partial output, as for a disk update)
                           per bucket of at most `bucket_bytes`: POST /update_weights_from_distributed
                           {names, dtypes, shapes, group_name[, weight_version on the last]} to
                           every member while rank 0 broadcasts the bucket's tensors
                           POST /continue_generation (SGLang only)

The tensors come from the trainer's `hf_tensors()` (gathered from the FSDP shards one at a
time), so no rank holds the whole model twice. Every wait is bounded by `timeout_s`. A member
that fails or hangs makes the version's broadcast fail: the group is closed, the members that
answered are continued, and the next version builds a new group from whoever the manager then
routes; the caller writes this version to disk, from where the manager brings the servers that
missed it up to date. The group is rebuilt whenever its set of members changes, so a server that
restarts or is added gets the next version, and the manager routes it then; while the trainer
waits for a step's data it sends the current version again to such a server (`missing`, the model
worker's `catch_up`), since the next version may need the groups only an up-to-date server makes. A joining server
whose broadcast failed sits out the next 1, 2, 4, … versions (`JoinerSitOut`): one that cannot
take a broadcast must not fail every version for the servers already routed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import aiohttp
import torch

from realhf.base import logging
from realhf.base.network import host_for_peers
from realhf.base.secret import auth_headers
from realhf.base.weight_group import HostedStore, WeightGroup, WeightGroupError
from realhf.system.streams.http_json import post_json, request_json

logger = logging.getLogger("weight_broadcast")

ROUTED_CHECK_S = 0.25  # while waiting on the servers, how often the manager's routing is checked
LEFT_ROUTING = "left routing (failed the manager's health checks) while waited on"


MAX_SIT_OUT = 32  # versions a joining server that keeps failing its broadcast sits out at most


@dataclass(frozen=True)
class Members:
    """Who gets a version: the servers the manager routes, and those joining routing (healthy,
    kept out of routing until they hold the trainer's current weights)."""

    servers: Sequence[str]
    joining: Sequence[str] = ()

    def all(self) -> set:
        return set(self.servers) | set(self.joining)


class JoinerSitOut:
    """A joining server whose broadcast failed sits out the next 1, 2, 4, … versions (doubling
    per failure in a row, at most MAX_SIT_OUT). The failed version goes to disk, from where the
    manager brings the joiner up and routes it; meanwhile a joiner that cannot take a broadcast
    does not fail every version for the servers already routed. Routed servers never sit out
    (a dead one leaves routing); a server is forgotten here once it is routed or gone."""

    def __init__(self):
        self._failed: Dict[str, Tuple[int, int]] = {}  # url -> (failures in a row, first version it is back for)

    def members(self, m: Members, version: int) -> List[str]:
        """The group's members for `version`, sorted."""
        joining = set(m.joining) - set(m.servers)
        self._failed = {u: f for u, f in self._failed.items() if u in joining}
        back = {u for u in joining if version >= self._failed.get(u, (0, 0))[1]}
        return sorted(set(m.servers) | back)

    def sitting_out(self) -> List[str]:
        return sorted(self._failed)

    def record(self, joiners: Iterable[str], failed: Dict[str, str], version: int) -> List[str]:
        """After `version`'s broadcast to a group with `joiners`: those it failed for sit out;
        returns them. A failure that names no server (the group's rendezvous, the broadcast
        itself) counts against every joiner of the group; one that names only routed servers,
        against none."""
        joiners = sorted(joiners)
        if not failed:
            for u in joiners:
                self._failed.pop(u, None)
            return []
        named = [u for u in failed if not u.startswith("(")]
        culprits = [u for u in joiners if u in failed] if named else joiners
        for u in culprits:
            n = self._failed.get(u, (0, 0))[0] + 1
            self._failed[u] = (n, version + 1 + min(2 ** (n - 1), MAX_SIT_OUT))
        return culprits


@dataclass
class BroadcastResult:
    version: int
    servers: List[str]  # the members that now serve `version`
    failed: Dict[str, str] = field(default_factory=dict)  # url -> why it did not get it
    seconds: float = 0.0
    n_bytes: int = 0
    n_buckets: int = 0
    rebuilt: bool = False  # a new group was built for this version

    @property
    def ok(self) -> bool:
        return not self.failed and bool(self.servers)


class _Loop:
    """An event loop on its own thread: the HTTP calls run there while this thread broadcasts."""

    def __init__(self, secret: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="weight-broadcast-http", daemon=True)
        self._thread.start()
        self.session = self.run(self._session(secret), 10.0)

    @staticmethod
    async def _session(secret: str) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=auth_headers(secret))

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float):
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        try:
            self.run(self.session.close(), 5.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5.0)


def buckets(tensors: Iterable[Tuple[str, torch.Tensor]], bucket_bytes: int):
    """(name, tensor) pairs in groups of at most `bucket_bytes` (a larger tensor goes alone)."""
    bucket, size = [], 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


class WeightBroadcaster:
    """Rank 0's side: the group, and one broadcast per published version."""

    def __init__(
        self,
        members: Callable[[], Union[Members, List[str]]],
        bind_host: str,
        backend: str,
        timeout_s: float,
        bucket_bytes: int,
        secret: str = "",
        ranks_per_server: int = 1,
        pause: bool = True,
    ):
        # SGLang loads each bucket as it arrives, so its servers are paused around a version;
        # the built-in engine swaps the whole version in between two decode steps (aborting the
        # running requests with their partial output, as a pause does) and is never paused: a
        # member that hangs then holds up the broadcast, not the other servers' generation.
        self.pause = pause
        self.ranks_per_server = ranks_per_server  # a tensor-parallel SGLang server joins with each of its ranks
        self._members = members  # the servers to update now (the manager's: `ask_manager`; a list: all routed)
        self._sit_out = JoinerSitOut()
        self.bind_host, self.backend, self.timeout_s, self.bucket_bytes = bind_host, backend, timeout_s, bucket_bytes
        self._http = _Loop(secret)
        self._store: Optional[HostedStore] = None
        self._group: Optional[WeightGroup] = None
        self._group_members: List[str] = []
        self._inflight: Optional[concurrent.futures.Future] = None  # the last bucket's broadcast
        self._n_groups = 0
        self._sent: Tuple[int, frozenset] = (-1, frozenset())  # the last version sent, and to whom

    def ask_manager(self, manager_url: str) -> Members:
        """The servers the manager at `manager_url` routes to now, and those joining routing."""
        try:
            return self._http.run(weight_members(self._http.session, manager_url, self.timeout_s), self.timeout_s + 5)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"GET {manager_url}/routed_servers: no answer within {self.timeout_s + 5:.0f}s"
            ) from None

    def missing(self, version: int) -> List[str]:
        """The servers that would get `version` now (routed or joining, less those sitting out)
        and have not had it from this trainer: those that joined since it was sent, and those
        the manager still keeps out of routing for want of it (a server restarted at the same
        address, say, which this trainer's record cannot tell from the one it sent to)."""
        sent_version, sent_to = self._sent
        now = self._members_now()
        joining = set(now.joining) - set(now.servers)
        urls = self._sit_out.members(now, version)
        return [u for u in urls if sent_version != version or u not in sent_to or u in joining]

    def _members_now(self) -> Members:
        m = self._members()
        return m if isinstance(m, Members) else Members(list(m))

    # ---- the group -------------------------------------------------------------------------------
    def _post_all(self, urls: List[str], path: str, body_of: Callable[[int, str], dict], stop_at_failure=False):
        """POST to every url at once; {url: answer or the exception}. `stop_at_failure`: at the
        first failed answer the others are cancelled (and left out): a group's rendezvous never
        completes without every member, so the members still in it would only run out the timeout."""

        async def one(i, url):
            a = await post_json(self._http.session, f"{url}{path}", body_of(i, url), self.timeout_s)
            if stop_at_failure and not a.get("success", False):
                raise RuntimeError(str(a.get("message", a))[:300])
            return a

        async def every():
            tasks = {asyncio.ensure_future(one(i, u)): u for i, u in enumerate(urls)}
            answers = {}
            pending = set(tasks)
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        answers[tasks[t]] = t.exception() or t.result()
                    if stop_at_failure and any(isinstance(a, BaseException) for a in answers.values()):
                        break
                return answers
            finally:  # stopped early, or this call cancelled (a member left routing)
                for t in pending:
                    t.cancel()

        return self._http.submit(every())

    def _close_group(self) -> None:
        if self._group is not None:
            name = self._group.group_name
            stuck = self._inflight is not None and not self._inflight.done()
            self._group.close(abort=not stuck)
            self._group = None
            members, self._group_members = self._group_members, []
            # Not waited on: a member that is gone (or partitioned) would hold the trainer for the
            # whole timeout, and one that is alive drops the group at its next init anyway.
            self._post_all(members, "/destroy_weights_update_group", lambda i, u: {"group_name": name})
        if self._store is not None:
            self._store.close()
            self._store = None

    def _build_group(self, urls: List[str]) -> Dict[str, str]:
        """A new group of rank 0 and `urls`; {url: why it failed} (empty: built)."""
        self._close_group()
        self._n_groups += 1
        name = f"realhf-weights-{self._n_groups}"
        self._store = HostedStore(self.bind_host, self.timeout_s)
        address = host_for_peers(self.bind_host)
        world = len(urls) * self.ranks_per_server + 1
        fut = self._post_all(
            urls,
            "/init_weights_update_group",
            stop_at_failure=True,
            body_of=lambda i, u: {
                "master_address": address,
                "master_port": self._store.port,
                "rank_offset": i * self.ranks_per_server + 1,
                "world_size": world,
                "group_name": name,
                "backend": self.backend,
            },
        )
        # Rank 0 joins on a thread of its own: its rendezvous waits for every member, and a member
        # whose /init_weights_update_group failed (refused: it died after its last health check)
        # never comes, so the answers decide, not the rendezvous' timeout.
        store = self._store.store
        joined = self._in_thread(
            f"{name}-join",
            lambda: WeightGroup(address, self._store.port, 0, world, name, self.backend, self.timeout_s, store=store),
        )
        try:
            answers = fut.result(self.timeout_s + 10)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            joined.add_done_callback(lambda f: f.exception() is None and f.result().close(abort=False))
            return {"(init)": f"no answer to /init_weights_update_group from {urls} within {self.timeout_s + 10:.0f}s"}
        failed: Dict[str, str] = {}
        for url, a in answers.items():
            if isinstance(a, BaseException) or not a.get("success", False):
                failed[url] = str(a)[:300] if isinstance(a, BaseException) else str(a.get("message", a))[:300]
        if failed:
            # Abandoned: the join thread ends at its timeout; its group, if any, is never used.
            joined.add_done_callback(lambda f: f.exception() is None and f.result().close(abort=False))
            return failed
        try:
            self._group = joined.result(self.timeout_s + 10)
        except concurrent.futures.TimeoutError:
            return {
                "(rank 0)": f"the trainer's join of weight group {name} did not finish within {self.timeout_s + 10:.0f}s"
            }
        except (RuntimeError, ValueError, WeightGroupError) as e:
            return {"(rank 0)": str(e).splitlines()[0][:300]}
        self._group_members = list(urls)
        logger.info(f"weight group {name} ({self.backend}): the trainer and {len(urls)} server(s) {urls}")
        return {}

    # ---- one version -----------------------------------------------------------------------------
    def publish(self, version: int, tensors: Iterable[Tuple[str, torch.Tensor]]) -> BroadcastResult:
        """Broadcast `tensors` (consumed to the end whatever happens: on other DP ranks the same
        generator gathers shards in step with this one) as `version` to the routed servers and
        those joining routing."""
        t0 = time.monotonic()
        tensors = iter(tensors)
        result = BroadcastResult(version, [])
        try:
            now = self._members_now()
        except Exception as e:  # noqa: BLE001 - the manager is restarting, say: disk this time
            result.failed["(manager)"] = f"routed servers unknown: {type(e).__name__}: {e}"
            _drain(tensors)
            return result
        urls = self._sit_out.members(now, version)
        joiners = [u for u in urls if u in set(now.joining) - set(now.servers)]
        try:
            return self._publish_to(version, tensors, urls, result, t0)
        finally:
            culprits = self._sit_out.record(joiners, result.failed, version)
            if culprits:
                logger.warning(
                    f"version {version}: joining server(s) {culprits} did not take the broadcast; they sit out "
                    "the next version(s) of the weight group, and the manager brings them up from disk "
                    "(where this version goes) before it routes them"
                )

    def _publish_to(self, version: int, tensors, urls: List[str], result: BroadcastResult, t0: float):
        if not urls:
            _drain(tensors)
            result.failed["(none)"] = "no routed or joining generation server"
            return result
        if urls != self._group_members or self._group is None:
            failed = self._build_group(urls)
            result.rebuilt = True
            if failed:
                result.failed.update(failed)
                _drain(tensors)
                return self._finish(result, t0)
        members = self._group_members
        if self.pause:
            paused = self._answers(
                self._post_all(members, "/pause_generation", lambda i, u: {}), members, result, "pause"
            )
            for url, a in paused.items():
                if isinstance(a, BaseException):
                    result.failed[url] = f"pause: {a}"
        try:
            if not result.failed:
                self._send(version, tensors, members, result)
        finally:
            _drain(tensors)
            if result.failed:
                self._close_group()  # broken or incomplete: the next version builds a new one
            if self.pause:
                # Not to a server that left routing: it could hang this call for the whole
                # timeout; it is paused and continued again by the first version after it is back.
                routed = [u for u in members if not result.failed.get(u, "").endswith(LEFT_ROUTING)]
                self._answers(
                    self._post_all(routed, "/continue_generation", lambda i, u: {}), routed, result, "continue"
                )
        if not result.failed:
            result.servers = list(members)
        return self._finish(result, t0)

    def _send(self, version: int, tensors, members: List[str], result: BroadcastResult) -> None:
        pending = None
        group = self._group
        for bucket in _with_last(buckets(tensors, self.bucket_bytes)):
            items, last = bucket
            if self.backend == "gloo":
                items = [(n, t.to("cpu")) for n, t in items]
            body = {
                "names": [n for n, _ in items],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in items],
                "shapes": [list(t.shape) for _, t in items],
                "group_name": group.group_name,
                "flush_cache": last,
            }
            if last:
                body["weight_version"] = str(version)
            pending = self._post_all(members, "/update_weights_from_distributed", lambda i, u, b=body: b)
            tensors_now = [t.contiguous() for _, t in items]
            sent = self._inflight = self._in_thread(
                f"{group.group_name}-broadcast", lambda ts=tensors_now: group.broadcast(ts)
            )
            answers = self._answers(pending, members, result, "update_weights_from_distributed", also=sent)
            if sent.done() and sent.exception() is not None:
                result.failed["(broadcast)"] = str(sent.exception())
            elif not sent.done():
                # Given up on a member that left routing: the broadcast thread runs out the
                # group's timeout on its own; this group is never used again.
                result.failed.setdefault("(broadcast)", "abandoned: a member left routing")
            for url, a in answers.items():
                if isinstance(a, BaseException) or not a.get("success", False):
                    result.failed[url] = (
                        str(a)[:300] if isinstance(a, BaseException) else str(a.get("message", a))[:300]
                    )
            if result.failed:
                return
            result.n_buckets += 1
            result.n_bytes += sum(t.numel() * t.element_size() for _, t in items)

    @staticmethod
    def _in_thread(name: str, call) -> concurrent.futures.Future:
        """`call()` on a thread of its own: gloo's waits cannot be interrupted, and a member that
        never comes (refused, its HTTP call blackholed) must not hold this thread for the whole
        timeout."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                fut.set_result(call())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                # Its message only: the traceback would keep the group's frames (and sockets) alive.
                fut.set_exception(WeightGroupError(str(e)))

        threading.Thread(target=run, name=name, daemon=True).start()
        return fut

    def _answers(self, fut, members: List[str], result: BroadcastResult, what: str, also=None) -> dict:
        """The answers of a `_post_all` (once `also`, a future, is done too). A member that the
        manager stops routing meanwhile (it failed its health checks: dead, hung, partitioned)
        is given up at once, the calls cancelled, instead of waited on for the whole timeout;
        a broadcast that failed (`also`) cancels the calls too."""
        deadline = time.monotonic() + self.timeout_s + 10
        while True:
            try:
                answers = fut.result(timeout=ROUTED_CHECK_S)
                if also is None:
                    return answers
                try:
                    also.result(timeout=ROUTED_CHECK_S)
                    return answers
                except concurrent.futures.TimeoutError:
                    pass  # the answers are in, the broadcast is not: still waiting on a member
                except Exception:  # noqa: BLE001 - the broadcast failed; the caller reads why
                    return answers
            except concurrent.futures.TimeoutError:
                if also is not None and also.done() and also.exception() is not None:
                    self._group_broken(also)
            except concurrent.futures.CancelledError:
                return {}
            if time.monotonic() > deadline:
                fut.cancel()
                result.failed[f"({what})"] = f"no answer within {self.timeout_s + 10:.0f}s"
                return {}
            try:
                routed = self._members_now().all()
            except Exception:  # noqa: BLE001 - the manager is away: keep waiting, up to the deadline
                continue
            gone = [u for u in members if u not in routed]
            if gone:
                fut.cancel()
                for u in gone:
                    result.failed[u] = f"{what}: {LEFT_ROUTING}"
                return {}

    def _group_broken(self, failed_broadcast) -> None:
        """The broadcast failed (a peer closed its connection): close the group now, so that
        the members still waiting in it fail at once instead of at their timeout."""
        if self._group is not None:
            self._group.close(abort=failed_broadcast.done())

    def _finish(self, result: BroadcastResult, t0: float) -> BroadcastResult:
        result.seconds = time.monotonic() - t0
        if result.ok:
            self._sent = (result.version, frozenset(result.servers))
            # The trainer's step line says it per version; here only what changes (a new group).
            (logger.info if result.rebuilt else logger.debug)(
                f"version {result.version} broadcast to {len(result.servers)} server(s) in {result.seconds:.2f}s "
                f"({result.n_bytes / 2**20:.1f} MiB in {result.n_buckets} bucket(s)"
                f"{', new group' if result.rebuilt else ''})"
            )
        else:
            logger.warning(
                f"version {result.version}: broadcast failed after {result.seconds:.1f}s ({result.failed}); "
                "it goes to disk, the group is rebuilt at the next version"
            )
        return result

    def close(self) -> None:
        try:
            self._close_group()
        finally:
            self._http.close()


def _drain(it) -> None:
    for _ in it:
        pass


def _with_last(it):
    """(item, is_last) for each item of `it`."""
    it = iter(it)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


async def weight_members(session: aiohttp.ClientSession, manager_url: str, timeout: float) -> Members:
    """The manager's `GET /routed_servers`: {servers, joining} (an older manager: no `joining`)."""
    answer = await request_json(session, "GET", f"{manager_url}/routed_servers", timeout)
    return Members(list(answer["servers"]), list(answer.get("joining", [])))
