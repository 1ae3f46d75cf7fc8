"""Bringing generation servers to the trainer's latest weights, one server at a time (docs/architecture.md §5).

For each server behind the target version (as the server itself reports it in /get_model_info:
an update never asks a server to go back to a lower version, which it would refuse with a 409):

    POST /pause_generation                      running requests return `abort` with partial output
    POST /update_weights_from_disk {model_path: <published_weights>/<v>, weight_version: v}
    POST /continue_generation                   always, even when the update failed

Only one server is paused at any moment, so the others keep generating, and the manager's
admission and routing (same event loop, other coroutines) keep answering throughout. A server
that fails is left at its old version and retried, after 1 s, then 2, 4, … up to 30 s while it
keeps failing; its log lines say for how long and how often it has failed (the first failure,
then at each doubling of the attempts), not one line per second.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Iterable, Optional

import aiohttp

from realhf.base import logging
from realhf.base.trial_files import published_version_dir
from realhf.system.http_json import post_json

logger = logging.getLogger("weight_update")


RETRY_DELAY_S = 1.0  # a failed server is retried after this, not at every poll
MAX_RETRY_DELAY_S = 30.0  # ... doubling per consecutive failure up to this


class WeightUpdateError(RuntimeError):
    pass


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
    version = info.get("weight_version") if isinstance(info, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


async def update_server(session: aiohttp.ClientSession, url: str, model_path: str, version: int,
                        timeout: float) -> float:
    """pause → update_weights_from_disk → continue on one server; returns the seconds it took."""
    t0 = time.monotonic()
    await post_json(session, f"{url}/pause_generation", {}, timeout)
    try:
        r = await post_json(session, f"{url}/update_weights_from_disk",
                            {"model_path": model_path, "weight_version": int(version)}, timeout)
        if not r.get("success", False):
            raise WeightUpdateError(f"{url} refused weights {model_path} (version {version}): {r.get('message', r)}")
    finally:
        await post_json(session, f"{url}/continue_generation", {}, timeout)
    return time.monotonic() - t0


class WeightUpdater:
    """Per-server weight versions and the sequential update round."""

    def __init__(self, run_dir: str, role: str, timeout: float, initial_version: int = 0):
        self.run_dir, self.role, self.timeout = os.path.abspath(run_dir), role, timeout
        self.initial_version = initial_version
        self.versions: Dict[str, int] = {}
        self.updating: Optional[str] = None
        self.n_updates = 0
        self.n_failures = 0
        self.last_error = ""
        self.retry_at = 0.0  # monotonic time before which a failed round is not retried
        self._failing: Dict[str, list] = {}  # url -> [monotonic time of the first failure, attempts]

    def set_servers(self, urls: Iterable[str]) -> None:
        # A server we have not updated yet is assumed to hold the initial weights.
        urls = list(urls)
        self.versions = {u: self.versions.get(u, self.initial_version) for u in urls}

    def behind(self, target: int) -> list:
        return [u for u, v in self.versions.items() if v < target]

    def due(self, target: int) -> bool:
        """Some server is behind and no failure asks to wait."""
        return bool(self.behind(target)) and time.monotonic() >= self.retry_at

    async def run_round(self, session: aiohttp.ClientSession, target_version) -> None:
        """Update every server that is behind, one at a time, to the newest version at its turn
        (`target_version()` is re-read per server, so a round never loads a version that is
        already outdated)."""
        for url in list(self.versions):
            version = int(target_version())
            if url not in self.versions or self.versions[url] >= version:
                continue
            path = str(published_version_dir(self.run_dir, self.role, version))
            self.updating = url
            try:
                current = await served_version(session, url, self.timeout)
                if current is not None and current >= version:  # already there (or beyond): never go back
                    if url in self.versions:
                        self.versions[url] = current
                    continue
                seconds = await update_server(session, url, path, version, self.timeout)
            except Exception as e:  # noqa: BLE001 - reported, retried next round
                self._failed(url, version, e)
                continue
            finally:
                self.updating = None
            if url in self.versions:
                self.versions[url] = version
            self.n_updates += 1
            since = self._failing.pop(url, None)
            recovered = (f" after {since[1]} failed attempts over {time.monotonic() - since[0]:.0f}s"
                         if since else "")
            logger.info(f"server {url} now at version {version} ({path}); update took {seconds:.2f}s{recovered}")

    def _failed(self, url: str, version: int, error: Exception) -> None:
        now = time.monotonic()
        since = self._failing.setdefault(url, [now, 0])
        since[1] += 1
        attempts = since[1]
        self.n_failures += 1
        self.last_error = f"{url}: {error}"
        self.retry_at = now + min(RETRY_DELAY_S * 2 ** (attempts - 1), MAX_RETRY_DELAY_S)
        if attempts & (attempts - 1) == 0:  # 1, 2, 4, 8, ...: the log says it without flooding
            logger.error(f"weight update of {url} to version {version} failed ({attempts} attempts over "
                         f"{now - since[0]:.0f}s; it keeps generating with version {self.versions.get(url)}; "
                         f"next try in {self.retry_at - now:.0f}s): {error}")
