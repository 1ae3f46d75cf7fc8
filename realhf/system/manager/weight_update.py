"""Bringing generation servers to the trainer's latest weights, one server at a time (docs/architecture.md §5).

With `weight_sync=distributed` the trainer broadcasts each version to the servers itself
(`realhf.system.trainer.weight_broadcast`) and announces it after; a round then finds those
servers already there (/get_model_info) and only brings from disk the ones a broadcast missed
(the trainer writes such a version to disk) — a version that is not on disk is left to the next
broadcast.

For each server behind the target version (as the server itself reports it in /get_model_info:
an update never asks a server to go back to a lower version, which it would refuse with a 409),
routed or joining routing (the manager routes a joining one once a round, or a broadcast, brought
it to the trainer's version of when it was asked: `on_served`, realhf.system.manager.joining):

    POST /pause_generation                      running requests return `abort` with partial output
    POST /update_weights_from_disk {model_path: <published_weights>/<v>, weight_version: v}
    POST /continue_generation                   always, even when the update failed

Only one server is paused at any moment, so the others keep generating, and the manager's
admission and routing (same event loop, other coroutines) keep answering throughout. A server
that fails is left at its old version and retried, after 1 s, then 2, 4, … up to 30 s while it
keeps failing; its log lines say for how long and how often it has failed (the first failure,
then at each doubling of the attempts), not one line per second. The wait is per server: a dead
server that is still registered (its key lives until its TTL ends; a restarted manager lists it)
must not hold the live ones at old weights, where everything they generate arrives too stale to
train (measured in the chaos run before this: 70 groups dropped as stale in one second).

A server that leaves routing while the round is at it (the manager dropped it after failed
health checks: partitioned, stopped, hung) is given up at once — the round goes on to the others
instead of waiting up to `update_timeout` on a server that does not answer, which would leave
every other server on old weights (their groups stale) for that long. Such a server may hold a
pause that never got its continue, so when it is routed again its next round sends
/continue_generation even if it needs no new weights.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Dict, Iterable, Optional, Set

import aiohttp

from realhf.base import logging
from realhf.base.trial_files import published_version_dir
from realhf.impl.inference.request import parse_weight_version
from realhf.system.streams.http_json import post_json

logger = logging.getLogger("weight_update")


RETRY_DELAY_S = 1.0  # a failed server is retried after this, not at every poll
MAX_RETRY_DELAY_S = 30.0  # ... doubling per consecutive failure up to this
ROUTED_CHECK_S = 0.25  # while updating a server, how often the round checks it is still routed


class WeightUpdateError(RuntimeError):
    pass


class LeftRouting(Exception):
    """The server being updated was dropped from routing meanwhile."""


LEFT_ROUTING = "the server left routing"  # the message of the cancellation of its update


async def served_version(session: aiohttp.ClientSession, url: str, timeout: float) -> Optional[int]:
    """The weight version `url` says it serves (None if it does not say: a backend without
    /get_model_info; one that is down fails at the pause that follows)."""
    async with session.get(f"{url}/get_model_info", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        if r.status != 200:
            return None
        try:
            info = await r.json(content_type=None)
        except ValueError:
            return None
    # SGLang's string ("3") or an older server's integer; a name such as "default" says nothing.
    return parse_weight_version(info.get("weight_version")) if isinstance(info, dict) else None


async def update_server(
    session: aiohttp.ClientSession, url: str, model_path: str, version: int, timeout: float, pause: bool = True
) -> float:
    """pause → update_weights_from_disk → continue on one server; returns the seconds it took.
    Without `pause` (a built-in engine that keeps its running requests across a swap) only the
    update: the engine swaps between two decode steps."""
    t0 = time.monotonic()
    if not pause:
        await _load(session, url, model_path, version, timeout)
        return time.monotonic() - t0
    await post_json(session, f"{url}/pause_generation", {}, timeout)
    try:
        await _load(session, url, model_path, version, timeout)
    except asyncio.CancelledError as e:
        if e.args and e.args[0] == LEFT_ROUTING:
            # Given up because the server left routing: a continue sent now could overtake the
            # pause still in flight to it; the round sends one when the server is back.
            raise
        await post_json(session, f"{url}/continue_generation", {}, timeout)  # the manager stops
        raise
    except BaseException:
        await post_json(session, f"{url}/continue_generation", {}, timeout)
        raise
    await post_json(session, f"{url}/continue_generation", {}, timeout)
    return time.monotonic() - t0


async def _load(session: aiohttp.ClientSession, url: str, model_path: str, version: int, timeout: float) -> None:
    # A string, as SGLang declares it: SGLang refuses an integer weight_version with 400.
    r = await post_json(
        session,
        f"{url}/update_weights_from_disk",
        {"model_path": model_path, "weight_version": str(int(version))},
        timeout,
    )
    if not r.get("success", False):
        raise WeightUpdateError(f"{url} refused weights {model_path} (version {version}): {r.get('message', r)}")


class WeightUpdater:
    """Per-server weight versions and the sequential update round."""

    def __init__(
        self,
        run_dir: str,
        role: str,
        timeout: float,
        initial_version: int = 0,
        from_disk_only_if_written: bool = False,
        pause: bool = True,
    ):
        self.pause = pause  # False: built-in engines that keep running requests across a swap
        self.run_dir, self.role, self.timeout = os.path.abspath(run_dir), role, timeout
        # weight_sync=distributed: the trainer broadcasts every version and writes only some to
        # disk; a server behind a version that is not on disk waits for the next broadcast.
        self.from_disk_only_if_written = from_disk_only_if_written
        self.n_left_to_broadcast = 0
        self.initial_version = initial_version
        self.versions: Dict[str, int] = {}
        self.updating: Optional[str] = None
        self.n_updates = 0
        self.n_failures = 0
        self.last_error = ""
        self.retry_at: Dict[str, float] = {}  # url -> monotonic time before which it is not retried
        self._failing: Dict[str, list] = {}  # url -> [monotonic time of the first failure, attempts]
        self.owes_continue: Set[str] = set()  # left routing mid-update: may still be paused
        self.n_abandoned = 0  # updates given up because their server left routing
        self.n_superseded = 0  # updates whose version was pruned before the server loaded it
        # Told each version a round finds or puts on a server, with the round's target when it
        # asked (the served version is at least that): the manager routes a joining server then.
        self.on_served: Callable[[str, int, int], None] = lambda url, version, target: None

    def set_servers(self, urls: Iterable[str]) -> None:
        # A server we have not updated yet is assumed to hold the initial weights.
        urls = list(urls)
        self.versions = {u: self.versions.get(u, self.initial_version) for u in urls}

    def behind(self, target: int) -> list:
        return [u for u, v in self.versions.items() if v < target or u in self.owes_continue]

    def _ready(self, url: str) -> bool:
        return time.monotonic() >= self.retry_at.get(url, 0.0)

    def due(self, target: int) -> bool:
        """Some server is behind (or owes a continue) and not waiting out an earlier failure."""
        return any(self._ready(u) for u in self.behind(target))

    async def _while_routed(self, url: str, coro):
        """Await `coro` (a call to `url`) unless `url` leaves routing first: then cancel it and
        raise LeftRouting."""
        task = asyncio.ensure_future(coro)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=ROUTED_CHECK_S)
                if done:
                    return task.result()
                if url not in self.versions:
                    raise LeftRouting(url)
        finally:
            if not task.done():
                left = url not in self.versions
                task.cancel(LEFT_ROUTING if left else None)
                if not left:  # the round itself is cancelled (the manager stops): the update still
                    await asyncio.gather(task, return_exceptions=True)  # ends with its continue

    async def run_round(self, session: aiohttp.ClientSession, target_version) -> None:
        """Update every server that is behind, one at a time, to the newest version at its turn
        (`target_version()` is re-read per server, so a round never loads a version that is
        already outdated)."""
        for url in list(self.versions):
            version = int(target_version())
            if url not in self.versions or (self.versions[url] >= version and url not in self.owes_continue):
                continue
            if not self._ready(url):
                continue
            path = str(published_version_dir(self.run_dir, self.role, version))
            self.updating = url
            t0 = time.monotonic()
            try:
                current = await self._while_routed(url, served_version(session, url, self.timeout))
                if current is not None and current >= version:  # already there (or beyond): never go back
                    if url in self.owes_continue:
                        await self._while_routed(
                            url, post_json(session, f"{url}/continue_generation", {}, self.timeout)
                        )
                        self.owes_continue.discard(url)
                    if url in self.versions:
                        self.versions[url] = current
                        self.on_served(url, current, version)
                    continue
                if self.from_disk_only_if_written and not os.path.isdir(path):
                    self.n_left_to_broadcast += 1
                    continue
                seconds = await self._while_routed(
                    url, update_server(session, url, path, version, self.timeout, self.pause)
                )
                self.owes_continue.discard(url)  # update_server ends with a continue
            except LeftRouting:
                self.owes_continue.add(url)
                self.n_abandoned += 1
                logger.warning(
                    f"weight update of {url} to version {version} given up after "
                    f"{time.monotonic() - t0:.1f}s: the server left routing (failed health checks); "
                    "going on with the others (it gets a /continue_generation when it is back)"
                )
                continue
            except Exception as e:  # noqa: BLE001 - reported, retried next round
                if not os.path.isdir(path) and int(target_version()) > version:
                    # The trainer pruned this version while the server was on its way to it (it
                    # was paused, say): not the server's fault, and waiting out a back-off at old
                    # weights would make everything it generates too stale. The next round (the
                    # watcher's next poll) loads the newest version.
                    self.n_superseded += 1
                    logger.info(
                        f"server {url}: version {version} was pruned before it loaded it; loading the "
                        f"newest ({int(target_version())}) next"
                    )
                    continue
                self._failed(url, version, e)
                continue
            finally:
                self.updating = None
            if url in self.versions:
                self.versions[url] = version
                self.on_served(url, version, version)
            self.n_updates += 1
            self.retry_at.pop(url, None)
            since = self._failing.pop(url, None)
            recovered = f" after {since[1]} failed attempts over {time.monotonic() - since[0]:.0f}s" if since else ""
            logger.info(f"server {url} now at version {version} ({path}); update took {seconds:.2f}s{recovered}")

    def _failed(self, url: str, version: int, error: Exception) -> None:
        now = time.monotonic()
        since = self._failing.setdefault(url, [now, 0])
        since[1] += 1
        attempts = since[1]
        self.n_failures += 1
        self.last_error = f"{url}: {error}"
        self.retry_at[url] = now + min(RETRY_DELAY_S * 2 ** (attempts - 1), MAX_RETRY_DELAY_S)
        if attempts & (attempts - 1) == 0:  # 1, 2, 4, 8, ...: the log says it without flooding
            logger.error(
                f"weight update of {url} to version {version} failed ({attempts} attempts over "
                f"{now - since[0]:.0f}s; it keeps generating with version {self.versions.get(url)}; "
                f"next try in {self.retry_at[url] - now:.0f}s): {error}"
            )
