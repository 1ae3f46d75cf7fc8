"""The GserverManager's state and the logic behind each endpoint, without sockets.

It wires together admission (`realhf.system.manager.staleness.StalenessManager`, docs/architecture.md §4), routing
(`realhf.system.manager.routing.Router`), server health (`realhf.system.manager.server_health.ServerHealth`), the
gate that keeps a late-joining server out of routing until it holds the current weights
(`realhf.system.manager.joining.JoinGate`), the per-server weight versions
(`realhf.system.manager.weight_update.WeightUpdater`: routed and joining servers) and the counters of
`/status`. The HTTP app and the watcher (`realhf.system.manager.gserver_manager`) call into it from one
event loop. Its only I/O is the admission ledger (`realhf.system.manager.admission_ledger`, optional):
one small Redis transaction per admission event, written before the answer, so that a
restarted manager continues from exactly what its predecessor told its clients.

One lock (`self.lock`, a threading.RLock) is held by every public method, so a reader in another
thread — the GserverManager worker's main thread logs `status()` while the HTTP thread's event
loop serves requests and health checks — sees one consistent snapshot and never iterates a dict
or deque that the loop is changing. A lock rather than routing reads through the event loop:
every caller, in any thread, is safe without knowing which loop owns the state. The methods never
await, so the lock is held for microseconds (a ledger write: ~0.1 ms) and never across a weight update; the
update round (`WeightUpdater.run_round`, on the loop) writes only single entries of
`updater.versions` and scalars, which `status()` reads one at a time.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import List, Optional

from realhf.api.worker_configs import GserverManagerConfig
from realhf.base import logging
from realhf.base.trial_files import published_version_dir
from realhf.system.manager.admission_ledger import ENDED_REASONS, AdmissionLedger
from realhf.system.manager.joining import JoinGate, Routed
from realhf.system.manager.manager_metrics import ThroughputWindow
from realhf.system.manager.routing import Router
from realhf.system.manager.server_health import DROPPED, UP, ServerHealth
from realhf.system.manager.staleness import StalenessManager, dp_shares, resumed_accepted
from realhf.system.manager.weight_update import WeightUpdater

logger = logging.getLogger("gserver_manager")


class _Version:
    """The trainer version as last read by the watcher (handlers never do I/O)."""

    def __init__(self):
        self.value = 0

    def get_version(self) -> int:
        return self.value


def trainer_shares(config: GserverManagerConfig) -> List[int]:
    """Groups per step each trainer DP rank takes (the master's `dp_shares`, same function)."""
    return dp_shares(config.groups_per_step, config.n_trainer_ranks)


def _locked(method):
    """Run `method` holding the service's lock (see the module docstring)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return wrapper


class ManagerService:
    """Admission + routing + server health + weight versions + counters; no sockets.
    Every public method holds `self.lock`: callable from any thread."""

    def __init__(self, config: GserverManagerConfig, server_urls: List[str], ledger: Optional[AdmissionLedger] = None):
        """`ledger`: where admissions are recorded (None: in memory only, for tests of one
        component); a manager that finds its predecessor's record continues from it."""
        self.config = config
        self.version = _Version()
        shares = trainer_shares(config)
        self.accepted_at_start = resumed_accepted(shares, config.trained_groups_at_start)
        self.admission = StalenessManager(
            config.max_concurrent_rollouts,
            shares,
            config.max_head_offpolicyness,
            self.version,
            accepted=self.accepted_at_start,
        )
        self.router = Router(config.schedule_policy, server_urls)
        self.updater = WeightUpdater(
            config.run_dir,
            config.model_role,
            config.update_timeout,
            from_disk_only_if_written=config.weight_sync == "distributed",
            pause=config.pause_for_update,
        )
        self.updater.set_servers(server_urls)
        self.health = ServerHealth(server_urls, config.max_health_failures)
        self.joins = JoinGate(config.join_timeout, config.max_head_offpolicyness)
        self.updater.on_served = self._served
        self.n_joined = 0  # servers routed after joining late
        self.throughput = ThroughputWindow()
        self.n_abandoned = 0
        self.ended = {reason: 0 for reason in ENDED_REASONS}  # rollouts that ended without a group
        self.lock = threading.RLock()
        self.ledger = ledger
        self.starts = 1
        if ledger is not None:
            self._continue(ledger.start(self.accepted_at_start))

    def _continue(self, state) -> None:
        """Take over a predecessor's admissions (a no-op for the first manager of a run)."""
        self.starts = state.starts
        if state.starts <= 1:
            return
        self.admission.load_state_dict(
            {
                "accepted": state.accepted,
                "stale_dropped": self.admission.stale_dropped(),
                "running": sorted(state.running.items()),
            }
        )
        self.ended.update(state.ended)
        self.n_abandoned = state.abandoned
        logger.info(
            f"restarted (start {state.starts} of this run): continuing from the admission ledger with "
            f"{len(state.running)} rollouts running, accepted per rank {state.accepted}, "
            f"{sum(state.ended.values())} ended without a group, {state.abandoned} abandoned"
        )

    # ---- the endpoints ------------------------------------------------------------------------
    @_locked
    def allocate(self, qid: str, rank: int) -> dict:
        """`rank`: the trainer DP rank the rollout's worker pushes to (ValueError if out of range)."""
        d = self.admission.allocate(qid, rank)
        if d.success and self.ledger is not None:
            try:
                self.ledger.admitted(qid, rank)
            except BaseException:  # not recorded: not admitted (the client sees an error and retries)
                self.admission.abandon(qid)
                raise
        return {"success": d.success, "reason": d.reason}

    @_locked
    def schedule(
        self,
        qid: str,
        prompt_len: int,
        group_size: int,
        new_token_budget: int,
        previous_url: Optional[str] = None,
        previous_version: Optional[int] = None,
    ) -> dict:
        if not self.admission.is_running(qid):
            # Routing it would count load on a server until a /finish_rollout that never comes.
            raise KeyError(
                f"schedule_request({qid!r}): no running rollout with this qid "
                "(call /allocate_rollout first, or it already finished)"
            )
        version = self.version.value
        url = self.router.schedule(
            qid,
            prompt_len,
            group_size,
            new_token_budget,
            previous_url=previous_url,
            previous_version=previous_version,
            current_version=version,
        )
        return {"url": url, "version": version}

    @_locked
    def finish(self, qid: str, accepted: bool, n_tokens: int, reason: str = "filtered") -> dict:
        """`reason`: why a rollout that is not `accepted` ended without a group (ENDED_REASONS)."""
        if not accepted and reason not in self.ended:
            raise ValueError(f"finish_rollout({qid!r}): reason {reason!r} is not one of {list(ENDED_REASONS)}")
        rank = self.admission.rank_of(qid)  # KeyError: never allocated or already finished
        if self.ledger is not None:
            self.ledger.ended(qid, rank, accepted, reason)
        self.admission.finish(qid, accepted)
        self.router.release(qid)
        self.throughput.add(accepted, n_tokens)
        if not accepted:
            self.ended[reason] += 1
        return {"success": True}

    @_locked
    def abandon(self, qids: List[str]) -> dict:
        """Free the slots of rollouts that died with their worker (a restarted rollout worker
        reports its previous incarnation's in-flight qids); unknown qids are ignored."""
        running = self.admission.running_qids()
        done = [q for q in dict.fromkeys(qids) if q in running]
        if self.ledger is not None:
            self.ledger.abandoned(done)
        for qid in done:
            self.admission.abandon(qid)
            self.router.release(qid)
        self.n_abandoned += len(done)
        if done:
            logger.info(f"abandoned {len(done)} rollouts of a dead worker: {done[:5]}{' ...' if len(done) > 5 else ''}")
        return {"abandoned": len(done), "unknown": len(set(qids)) - len(done)}

    @_locked
    def routed_servers(self) -> List[str]:
        return list(self.router.servers())

    @_locked
    def joining_servers(self) -> List[str]:
        """Healthy servers kept out of routing until they hold the current weights: the trainer
        makes them members of its weight group, so its next broadcast reaches them."""
        return self.joins.joining()

    @_locked
    def status(self) -> dict:
        s = self.admission.status()
        loads = self.router.loads()
        s["servers"] = [
            {
                "url": url,
                "requests": load.requests,
                "tokens": load.tokens,
                "version": self.updater.versions.get(url),
                "updating": self.updater.updating == url,
            }
            for url, load in loads.items()
        ]
        now = self.joins.clock()
        s["joining"] = [
            {"url": j.url, "version": j.version, "waited_s": round(j.waited(now), 1)}
            for j in self.joins.joiners.values()
        ]
        s["servers_joined"] = self.n_joined
        s["schedule_policy"] = self.router.policy
        s["unhealthy_servers"] = sorted(self.health.failures)
        s["servers_dropped"] = self.health.n_dropped
        s["abandoned"] = self.n_abandoned
        s["ended"] = dict(self.ended)
        s["manager_starts"] = self.starts
        s["weight_updates"] = {
            "done": self.updater.n_updates,
            "failed": self.updater.n_failures,
            "last_error": self.updater.last_error,
        }
        s["throughput"] = self.throughput.summary()
        return s

    # ---- what the watcher reads ---------------------------------------------------------------
    @_locked
    def observe_trainer(self, version: int, stale_dropped: List[int]) -> None:
        """The trainer's published version and stale-dropped totals per DP rank (all only ever
        grow: an older read, e.g. from another replica of name resolve, changes nothing). A list
        of the wrong length — a trainer of another DP size — is a ValueError."""
        if version > self.version.value:
            logger.info(f"model version {self.version.value} → {version}")
            self.version.value = version
        current = self.admission.stale_dropped()
        if len(stale_dropped) != len(current):
            raise ValueError(
                f"the trainer published stale_dropped for {len(stale_dropped)} DP ranks {stale_dropped}, "
                f"but this manager budgets {len(current)} (gserver_manager.n_trainer_ranks)"
            )
        merged = [max(old, int(new)) for old, new in zip(current, stale_dropped)]
        if merged != current:
            self.admission.set_stale_dropped(merged)

    @_locked
    def observe_servers(self, registered: List[str]) -> None:
        """Route to the registered servers that pass their health checks, except those joining
        (`joining`): a server new to routing is routed once it holds the trainer's current
        version. The weight updater serves both: a joiner is brought up from disk when the
        current version is there."""
        healthy = self.health.routable(registered)
        current = self.version.value
        if self.joins.joiners:
            others = [u for u in healthy if not self.joins.is_joining(u)]
            on_disk = os.path.isdir(published_version_dir(self.config.run_dir, self.config.model_role, current))
            for r in self.joins.admit(current, bool(others), on_disk):
                self._log_routed(r, current)
            self._log_overdue(current, on_disk)
        urls = [u for u in healthy if not self.joins.is_joining(u)]
        known = set(self.updater.versions)
        self.updater.set_servers(healthy)  # routed and joining
        for url in set(healthy) - known:
            if self.joins.is_joining(url):
                self.updater.versions[url] = self.joins.joiners[url].version
            elif url in self.health.reported_versions:
                self.updater.versions[url] = self.health.reported_versions[url]
        old = self.router.servers()
        if set(urls) == set(old):
            return
        self.router.set_servers(urls)
        logger.info(
            f"routed generation servers: {old} → {urls}"
            + ("" if urls else " (none alive: rollouts wait for a server to come back)")
        )

    @_locked
    def _served(self, url: str, version: int, target: int) -> None:
        """An update round found `version` on `url` (or loaded it); `target`: the trainer's
        version when the round asked."""
        self.joins.report(url, version, asked_at=target)

    def _log_routed(self, r: Routed, current: int) -> None:
        self.n_joined += 1
        if r.current:
            logger.info(
                f"generation server {r.url} caught up with the trainer's weights (it reported version "
                f"{r.version}, current when asked; the trainer is at {current} now): routed after waiting "
                f"{r.waited_s:.1f}s"
            )
        else:
            logger.warning(
                f"generation server {r.url} routed at weight version {r.version}, behind the trainer's {current}, "
                f"after waiting {r.waited_s:.1f}s: no other server is routed, its groups are within "
                f"max_head_offpolicyness ({self.joins.max_behind}) of it, and version {current} "
                + (
                    f"did not load from disk within join_timeout ({self.joins.timeout:.0f}s)"
                    if os.path.isdir(published_version_dir(self.config.run_dir, self.config.model_role, current))
                    else "is not on disk (the trainer makes the next version only from rollouts)"
                )
            )

    def _log_overdue(self, current: int, on_disk: bool) -> None:
        for j in self.joins.overdue():
            if on_disk:
                source = f"its update to version {current} from disk (last error: {self.updater.last_error or 'none'})"
            elif self.config.weight_sync == "distributed":
                source = (
                    f"the trainer's next broadcast, or version {current} sent again while the trainer waits "
                    f"for data (it is a member of the weight group; version {current} is not on disk)"
                )
            else:
                source = f"version {current} on disk"
            logger.warning(
                f"generation server {j.url} has waited {j.waited(self.joins.clock()):.0f}s to be routed "
                f"(join_timeout {self.joins.timeout:.0f}s): it holds weight version {j.version}, the trainer "
                f"is at {current}; waiting for {source}. It stays unrouted; the other servers serve."
            )

    @_locked
    def current_version(self) -> int:
        return self.version.value

    @_locked
    def observe_health(
        self, url: str, ok: bool, weight_version: Optional[int] = None, asked_at: Optional[int] = None
    ) -> None:
        """One /health check's result (`weight_version`: what a server not routed yet reported;
        `asked_at`: the trainer's version, as this manager knew it, when that was asked for)."""
        change = self.health.record(url, ok, weight_version)
        if change == UP:
            self.joins.arrive(url, weight_version, asked_at)
            held, current = self.joins.joiners[url].version, self.version.value
            logger.info(
                f"generation server {url} is up (weight version "
                f"{weight_version if weight_version is not None else 'unknown'})"
                + (f"; not routed until it holds the trainer's version {current}" if held < current else "")
            )
        elif change == DROPPED:
            self.joins.leave(url)
            logger.warning(
                f"generation server {url} failed {self.health.failures[url]} health checks in a row; "
                "dropped from routing"
            )
        elif ok:
            self.joins.report(url, weight_version, asked_at)

    @_locked
    def is_joining(self, url: str) -> bool:
        """Not routed yet: a successful health check should also ask for its weight version."""
        return self.health.is_joining(url) or self.joins.is_joining(url)

    @_locked
    def forget_unregistered(self, registered: List[str]) -> None:
        """Forget the health records of servers no longer registered."""
        self.health.forget_unregistered(registered)
        for url in set(self.joins.joining()) - set(registered):
            self.joins.leave(url)

    @_locked
    def update_due(self) -> bool:
        """Some routed server holds older weights than the trainer's version."""
        return self.updater.due(self.version.value)
