"""One trial, one run, across machines: a lease on the trial in the Redis that its runs share.

Why: the lock file (`trial_lock.py`) only sees launches that share its file system. Two launches
of the same experiment/trial on different machines, pointed at one Redis
(`cluster.name_resolve.redis_url`), would both run and clobber each other's name-resolve keys (the
launcher clears the trial's keys when it starts). So the launcher also takes this lease, after the
lock and before anything is deleted or cleared, and holds it while it lives.

How: the key `names.trial_lease` holds {host, pid, started, cmdline} and is taken with SET NX and
a TTL (`cluster.name_resolve.keepalive_ttl`), renewed every TTL/3 by a thread of the launcher and
deleted at a normal end. A launcher killed with -9 renews nothing: its lease expires after the TTL
and the next launch takes it (one on the same host whose holder's pid is dead waits that long
instead of being refused). name_resolve's own keep-alive does not fit: it extends whatever the key
holds, so a launcher whose lease expired and was taken by another (a stall longer than the TTL)
would extend and then delete that other run's lease. Renewal and release here compare the record
first, atomically (a Lua script), and a lost lease is reported (`on_lost`).

No shared Redis (`redis_url` empty: each launch starts a private redis-server) means nothing to
clobber and no lease. The memory backend (one process: tests) keeps leases in this process.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
import threading
import time
from typing import Callable, Optional, Tuple

import psutil

from realhf.base import logging, names
from realhf.base.network import redact_url

logger = logging.getLogger("trial_lease")


class TrialLeaseError(RuntimeError):
    """The lease could not be taken: Redis unreachable or refusing us."""


class TrialLeaseHeldError(TrialLeaseError):
    """Another launch, still alive, holds the trial's lease."""


_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_DROP = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class _RedisStore:
    def __init__(self, url: str):
        import redis

        self.where = f"Redis at {redact_url(url)}"
        try:
            self._r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5)
        except ValueError as e:  # its message may quote the URL, password included
            raise TrialLeaseError(
                f"cluster.name_resolve.redis_url is not a Redis URL "
                f"(redis://[:password@]host:port/db): {str(e).replace(url, redact_url(url))}"
            ) from None
        self._renew, self._drop = self._r.register_script(_RENEW), self._r.register_script(_DROP)

    def take(self, key: str, value: str, ttl: float) -> bool:
        return bool(self._r.set(key, value, nx=True, px=_ms(ttl)))

    def renew(self, key: str, value: str, ttl: float) -> bool:
        return bool(self._renew(keys=[key], args=[value, _ms(ttl)]))

    def drop(self, key: str, value: str) -> bool:
        return bool(self._drop(keys=[key], args=[value]))

    def read(self, key: str) -> Tuple[Optional[str], float]:
        """(the record, seconds until it expires) or (None, 0)."""
        with self._r.pipeline(transaction=True) as p:
            value, ms = p.get(key).pttl(key).execute()
        return value, max(ms, 0) / 1000

    def close(self) -> None:
        self._r.close()


class _MemoryStore:
    """The memory backend's leases: one dict for the whole process, like the backend itself."""

    where = "this process (cluster.name_resolve.type=memory)"
    _leases: dict = {}  # key -> (value, monotonic expiry)
    _lock = threading.Lock()

    def _live(self, key):
        value, expiry = self._leases.get(key, (None, 0.0))
        return (value, expiry - time.monotonic()) if expiry > time.monotonic() else (None, 0.0)

    def take(self, key, value, ttl):
        with self._lock:
            if self._live(key)[0] is not None:
                return False
            self._leases[key] = (value, time.monotonic() + ttl)
            return True

    def renew(self, key, value, ttl):
        with self._lock:
            if self._live(key)[0] != value:
                return False
            self._leases[key] = (value, time.monotonic() + ttl)
            return True

    def drop(self, key, value):
        with self._lock:
            return self._live(key)[0] == value and self._leases.pop(key, None) is not None

    def read(self, key):
        with self._lock:
            return self._live(key)

    def close(self):
        pass


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _redacted(text: str) -> str:
    """A command line with the passwords of its URLs (e.g. redis_url=redis://:pw@host) hidden."""
    return re.sub(r"(://[^/@\s:]*:)[^@\s]+@", r"\1***@", text)


def _dead_here(holder: dict) -> bool:
    """Whether the holder ran on this host and its process is gone (or its pid is another's now)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        return psutil.Process(int(holder["pid"])).create_time() > float(holder["started"]) + 1
    except psutil.NoSuchProcess:
        return True
    except (KeyError, TypeError, ValueError, psutil.Error):
        return False


class TrialLease:
    """`with TrialLease(store, key, ttl): ...` holds the lease; see the module's docstring."""

    def __init__(self, store, key: str, ttl: float, on_lost: Optional[Callable[[str], None]] = None):
        if not ttl > 0:
            raise ValueError(f"the trial lease's TTL (cluster.name_resolve.keepalive_ttl) must be > 0, got {ttl}")
        self.store, self.key, self.ttl, self.on_lost = store, key, float(ttl), on_lost
        self.value = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
                "cmdline": _redacted(shlex.join([sys.executable, *sys.argv])),
            }
        )
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None

    def acquire(self) -> "TrialLease":
        """Take the lease, or raise TrialLeaseHeldError naming its live holder."""
        try:
            self._take()
        except TrialLeaseError:
            raise
        except Exception as e:  # redis.ConnectionError, AuthenticationError, …
            raise TrialLeaseError(
                f"cannot take the trial's lease {self.key!r} in {self.store.where}: "
                f"{type(e).__name__}: {_redacted(str(e))}"
            ) from None
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="trial-lease", daemon=True)
        self._renewer.start()
        return self

    def _take(self) -> None:
        # A dead holder on this host has stopped renewing: its lease is gone within one TTL.
        deadline, told = time.monotonic() + self.ttl + 1, False
        while not self.store.take(self.key, self.value, self.ttl):
            value, left = self.store.read(self.key)
            holder = _record(value) if value is not None else {}  # None: expired or released just now
            if value is not None and not _dead_here(holder):
                raise TrialLeaseHeldError(self._refusal(holder, left))
            if time.monotonic() > deadline and value is None:
                raise TrialLeaseError(
                    f"could not take the trial's lease {self.key!r} in {self.store.where} within "
                    f"{self.ttl + 1:.0f} s: SET NX failed, yet no record could be read"
                )
            if time.monotonic() > deadline:
                raise TrialLeaseHeldError(
                    self._refusal(holder, left)
                    + (
                        f" (pid {holder.get('pid')} is not alive on this host, yet its lease was renewed for "
                        f"{self.ttl + 1:.0f} s: another machine with the same host name?)"
                    )
                )
            if value is not None and not told:
                told = True
                logger.info(
                    f"the trial's lease {self.key!r} is held by pid {holder.get('pid')}, no longer alive on "
                    f"this host: taking it over when it expires, in {left:.1f} s"
                )
            time.sleep(min(0.2, max(left, 0.01)))

    def _refusal(self, holder: dict, left: float) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
        return (
            f"this trial is already running: pid {holder.get('pid')} on host {holder.get('host')}, started "
            f"{started} ({holder.get('cmdline')}), holds its lease {self.key!r} in {self.store.where}; the "
            f"lease expires in {left:.1f} s unless that launcher renews it (it does every {self.ttl / 3:.1f} s "
            f"while it lives). Wait for that run to end, stop it (`kill {holder.get('pid')}` on "
            f"{holder.get('host')}), or choose another trial_name"
        )

    def _renew_loop(self) -> None:
        failing = False
        while not self._stop.wait(self.ttl / 3):
            try:
                if self.store.renew(self.key, self.value, self.ttl):
                    failing = False
                    continue
                # Expired while this launcher stalled (or Redis lost it): take it again if it is free.
                if self.store.take(self.key, self.value, self.ttl):
                    logger.warning(
                        f"the trial's lease {self.key!r} had expired (this launcher stalled longer "
                        f"than {self.ttl:g} s, or {self.store.where} lost it); taken again"
                    )
                    continue
                value, _ = self.store.read(self.key)
                holder = _record(value) if value else {}
                message = (
                    f"the trial's lease {self.key!r} in {self.store.where} was taken by pid "
                    f"{holder.get('pid')} on host {holder.get('host')} ({holder.get('cmdline')}) after it "
                    f"expired (this launcher stalled longer than {self.ttl:g} s?): this run no longer owns "
                    "the trial's keys"
                )
                logger.error(message)
                if self.on_lost is not None:
                    self.on_lost(message)
                return
            except Exception as e:  # Redis unreachable for now: the launcher notices Redis loss itself
                if not failing:
                    logger.warning(f"could not renew the trial's lease {self.key!r} in {self.store.where}: {e}")
                failing = True

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours (never another run's)."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=15)
        self._renewer = None
        try:
            self.store.drop(self.key, self.value)
        except Exception as e:  # it expires after its TTL anyway
            logger.warning(
                f"could not release the trial's lease {self.key!r} in {self.store.where} "
                f"(it expires in {self.ttl:g} s): {e}"
            )
        finally:
            self.store.close()

    def __enter__(self) -> "TrialLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _record(value: str) -> dict:
    try:
        record = json.loads(value)
        return record if isinstance(record, dict) else {}
    except ValueError:
        return {}


def trial_lease(
    name_resolve_config, experiment: str, trial: str, on_lost: Optional[Callable[[str], None]] = None
) -> Optional[TrialLease]:
    """The (not yet taken) lease of a trial under `cluster.name_resolve`; None without a shared Redis."""
    if name_resolve_config.type == "memory":
        store = _MemoryStore()
    elif name_resolve_config.type == "redis" and name_resolve_config.redis_url:
        store = _RedisStore(name_resolve_config.redis_url)
    else:  # a private redis-server per launch: no other launch can see (or clobber) its keys
        return None
    return TrialLease(store, names.trial_lease(experiment, trial), name_resolve_config.keepalive_ttl, on_lost)
