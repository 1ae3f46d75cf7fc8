"""Name resolve: the small key/value service through which realhf processes find each other.

Two backends behind one API (docs/architecture.md §3): `redis` (a real redis-server shared by every process of
a trial) and `memory` (one process; unit tests). `make_repository(config)` builds one;
`reconfigure(config)` sets the process-wide repository used by the module-level functions.

Keep-alive keys expire `keepalive_ttl` seconds after their process stops refreshing them (a
background thread refreshes every ttl/3), so a dead worker's heartbeat disappears by itself.
"""

import atexit
import threading
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from typing import Dict, List, Optional, Protocol, Tuple

from realhf.base import logging
from realhf.base.network import redact_url

logger = logging.getLogger("name_resolve")

_WAIT_POLL_S = 0.05


class NameResolveError(Exception):
    pass


class NameResolveSettings(Protocol):
    """What a repository is built from (`cluster.name_resolve` in the config tree)."""

    type: str
    redis_url: str


class NameEntryExistsError(NameResolveError):
    pass


class NameEntryNotFoundError(NameResolveError):
    pass


class NameResolveTimeoutError(NameResolveError, TimeoutError):
    pass


def _norm_prefix(prefix: str) -> str:
    return prefix.rstrip("/")


def _in_subtree(key: str, prefix: str) -> bool:
    """`a/b` holds `a/b` and `a/b/c` but not `a/bc`."""
    return key == prefix or key.startswith(prefix + "/")


class NameRecordRepository(ABC):
    """The API of docs/architecture.md §3; backends implement the primitive `_set/_get/_keys/_del/_touch`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._keepalive: Dict[str, Tuple[str, float]] = {}  # name -> (value, ttl)
        self._delete_on_exit: set = set()
        self._stop = threading.Event()
        self._refresher: Optional[threading.Thread] = None
        _live_repositories.add(self)

    # ---- primitives -------------------------------------------------------------------------
    @abstractmethod
    def _set(self, name: str, value: str, nx: bool, ttl: Optional[float]) -> bool:
        """Store; with `nx`, only if absent. Returns whether it stored."""

    @abstractmethod
    def _get(self, name: str) -> Optional[str]: ...

    @abstractmethod
    def _keys(self, prefix: str) -> List[str]:
        """Every key equal to `prefix` or under `prefix/`."""

    @abstractmethod
    def _del(self, names: List[str]) -> int: ...

    @abstractmethod
    def _touch(self, name: str, ttl: float) -> bool:
        """Extend a key's time to live; False when it no longer exists."""

    @abstractmethod
    def _update_record(self, name: str, put: Dict[str, str], remove: List[str], incr: Dict[str, int]) -> None:
        """Apply all three changes to record `name` at once (a Redis hash; MULTI/EXEC)."""

    @abstractmethod
    def _get_record(self, name: str) -> Dict[str, str]: ...

    # ---- API ------------------------------------------------------------------------------
    def add(
        self,
        name: str,
        value,
        replace: bool = False,
        keepalive_ttl: Optional[float] = None,
        delete_on_exit: bool = True,
    ) -> None:
        value = str(value)
        if keepalive_ttl is not None and keepalive_ttl <= 0:
            raise ValueError(f"keepalive_ttl must be > 0, got {keepalive_ttl} for key {name!r}")
        if not self._set(name, value, nx=not replace, ttl=keepalive_ttl):
            raise NameEntryExistsError(f"name-resolve key {name!r} already exists (use replace=True to overwrite)")
        with self._lock:
            if delete_on_exit:
                self._delete_on_exit.add(name)
            if keepalive_ttl is not None:
                self._keepalive[name] = (value, keepalive_ttl)
                self._ensure_refresher()
            else:
                self._keepalive.pop(name, None)

    def add_subentry(self, name: str, value, keepalive_ttl: Optional[float] = None, delete_on_exit: bool = True) -> str:
        sub = f"{_norm_prefix(name)}/{uuid.uuid4().hex}"
        self.add(sub, value, replace=False, keepalive_ttl=keepalive_ttl, delete_on_exit=delete_on_exit)
        return sub

    def update_record(
        self,
        name: str,
        put: Optional[Dict[str, object]] = None,
        remove: Optional[List[str]] = None,
        incr: Optional[Dict[str, int]] = None,
    ) -> None:
        """A record is a key holding named fields (a Redis hash), changed field by field and
        atomically: a reader, or a process that dies in between, sees all of one update or none.
        Written for state that changes many times a second in small pieces (the manager's
        admission ledger), where rewriting one JSON value whole would grow with the state.
        A record is deleted like a key (`delete`, `clear_subtree`); read it with `get_record`."""
        put = {str(k): str(v) for k, v in (put or {}).items()}
        incr = {str(k): int(v) for k, v in (incr or {}).items()}
        remove = [str(k) for k in (remove or [])]
        if put or incr or remove:
            self._update_record(name, put, remove, incr)

    def get_record(self, name: str) -> Dict[str, str]:
        """Every field of record `name` ({} if there is none)."""
        return dict(self._get_record(name))

    def get(self, name: str) -> str:
        value = self._get(name)
        if value is None:
            raise NameEntryNotFoundError(f"name-resolve key {name!r} not found")
        return value

    def find_subtree(self, prefix: str) -> List[str]:
        return sorted(self._keys(_norm_prefix(prefix)))

    def get_subtree(self, prefix: str) -> List[str]:
        values = []
        for key in self.find_subtree(prefix):
            value = self._get(key)
            if value is not None:  # expired between listing and reading
                values.append(value)
        return values

    def wait(self, name: str, timeout: float, poll_interval: float = _WAIT_POLL_S) -> str:
        if timeout is None or timeout <= 0:
            raise ValueError(f"wait({name!r}) needs a finite timeout > 0")
        deadline = time.monotonic() + timeout
        while True:
            value = self._get(name)
            if value is not None:
                return value
            if time.monotonic() >= deadline:
                raise NameResolveTimeoutError(
                    f"timed out after {timeout:.1f}s waiting for name-resolve key {name!r}; "
                    f"workers alive: {self._alive_workers_hint(name)}"
                )
            time.sleep(poll_interval)

    def delete(self, name: str) -> None:
        with self._lock:
            self._keepalive.pop(name, None)
            self._delete_on_exit.discard(name)
        if self._del([name]) == 0:
            raise NameEntryNotFoundError(f"cannot delete name-resolve key {name!r}: not found")

    def clear_subtree(self, prefix: str) -> None:
        keys = self.find_subtree(prefix)
        with self._lock:
            for k in keys:
                self._keepalive.pop(k, None)
                self._delete_on_exit.discard(k)
        if keys:
            self._del(keys)

    def reset(self) -> None:
        """Delete every key this repository added with delete_on_exit, and stop refreshing."""
        with self._lock:
            names = list(self._delete_on_exit)
            self._delete_on_exit.clear()
            self._keepalive.clear()
        if names:
            try:
                self._del(names)
            except Exception as e:  # the server may already be gone at interpreter exit
                logger.warning(f"could not delete {len(names)} name-resolve keys on reset: {e}")

    def close(self) -> None:
        self.reset()
        self._stop.set()
        if self._refresher is not None and self._refresher is not threading.current_thread():
            self._refresher.join(timeout=5)

    # ---- keep-alive -----------------------------------------------------------------------
    def _ensure_refresher(self):
        if self._refresher is None or not self._refresher.is_alive():
            self._stop.clear()
            self._refresher = threading.Thread(target=self._refresh_loop, name="name-resolve-keepalive", daemon=True)
            self._refresher.start()

    def _refresh_loop(self):
        while not self._stop.is_set():
            with self._lock:
                entries = dict(self._keepalive)
            interval = min((ttl for _, ttl in entries.values()), default=1.0) / 3
            for name, (value, ttl) in entries.items():
                try:
                    if not self._touch(name, ttl):
                        # Expired while this process stalled: put it back rather than vanish,
                        # unless it was deleted on purpose meanwhile.
                        with self._lock:
                            still_wanted = name in self._keepalive
                        if still_wanted:
                            self._set(name, value, nx=True, ttl=ttl)
                except Exception as e:
                    logger.warning(f"keep-alive refresh of {name!r} failed: {e}")
            self._stop.wait(max(interval, 0.01))

    def _alive_workers_hint(self, name: str) -> str:
        parts = name.split("/")
        if len(parts) < 2:
            return "unknown"
        try:
            root = f"{parts[0]}/{parts[1]}/worker/"
            workers = [k[len(root) :] for k in self.find_subtree(root)]
        except Exception as e:
            return f"unknown ({e})"
        return ", ".join(workers) if workers else "none"


class MemoryNameRecordRepository(NameRecordRepository):
    """Everything in one dict: for a single process (unit tests, single-process tools)."""

    def __init__(self):
        super().__init__()
        self._store: Dict[str, Tuple[str, Optional[float]]] = {}  # name -> (value, expiry)
        self._store_lock = threading.Lock()

    def _live(self, name: str) -> Optional[str]:
        entry = self._store.get(name)
        if entry is None:
            return None
        value, expiry = entry
        if expiry is not None and time.monotonic() >= expiry:
            del self._store[name]
            return None
        return value

    def _set(self, name, value, nx, ttl):
        with self._store_lock:
            if nx and self._live(name) is not None:
                return False
            self._store[name] = (value, None if ttl is None else time.monotonic() + ttl)
            return True

    def _get(self, name):
        with self._store_lock:
            return self._live(name)

    def _keys(self, prefix):
        with self._store_lock:
            return [k for k in list(self._store) if _in_subtree(k, prefix) and self._live(k) is not None]

    def _del(self, names):
        with self._store_lock:
            return sum(1 for n in names if self._live(n) is not None and self._store.pop(n, None) is not None)

    def _touch(self, name, ttl):
        with self._store_lock:
            value = self._live(name)
            if value is None:
                return False
            self._store[name] = (value, time.monotonic() + ttl)
            return True

    # A record is stored as a dict in place of the value string (records never expire).
    def _update_record(self, name, put, remove, incr):
        with self._store_lock:
            fields = self._live(name)
            if fields is not None and not isinstance(fields, dict):
                raise NameResolveError(f"name-resolve key {name!r} holds a value, not a record")
            fields = dict(fields or {})
            fields.update(put)
            for k in remove:
                fields.pop(k, None)
            for k, n in incr.items():
                fields[k] = str(int(fields.get(k, 0)) + n)
            if fields:
                self._store[name] = (fields, None)
            else:
                self._store.pop(name, None)

    def _get_record(self, name):
        with self._store_lock:
            fields = self._live(name)
            if fields is not None and not isinstance(fields, dict):
                raise NameResolveError(f"name-resolve key {name!r} holds a value, not a record")
            return dict(fields or {})


def _safe_redact(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:  # unparsable (e.g. a bad port): show the scheme and host part only
        return url.split("@")[-1]


class RedisNameRecordRepository(NameRecordRepository):
    """Keys and values in a real redis-server; `add` without replace is an atomic SET NX."""

    def __init__(self, url: str, connect_timeout: float = 10.0):
        import redis  # imported here so the memory backend needs no Redis client

        super().__init__()
        self._url = url
        try:
            self._redis = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=30,
                socket_connect_timeout=5,
                health_check_interval=30,
                retry_on_timeout=True,
            )
        except ValueError as e:  # its message may quote the URL, password included
            raise NameResolveError(
                f"cluster.name_resolve.redis_url={_safe_redact(url)!r} is not a Redis URL "
                f"(expected redis://[:password@]host:port/db): {str(e).replace(url, _safe_redact(url))}"
            ) from None
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._redis.ping()
                break
            except (redis.AuthenticationError, redis.ResponseError) as e:
                if not isinstance(e, redis.AuthenticationError) and "auth" not in str(e).lower():
                    raise
                if self._redis.connection_pool.connection_kwargs.get("password") is None:
                    # The server has a password, the URL none (NOAUTH / HELLO without AUTH).
                    raise NameResolveError(
                        f"Redis at {redact_url(url)} requires a password: put it in the URL as "
                        "redis://:PASSWORD@host:port/db (cluster.name_resolve.redis_url)"
                    ) from None
                raise NameResolveError(f"Redis at {redact_url(url)} rejected the password: {e}") from None
            except redis.ConnectionError as e:
                if time.monotonic() >= deadline:
                    raise NameResolveError(
                        f"cannot reach Redis at {redact_url(url)} within {connect_timeout:.0f}s: {e}"
                    ) from None
                time.sleep(0.1)

    @staticmethod
    def _glob_escape(s: str) -> str:
        return "".join("\\" + c if c in "*?[]\\" else c for c in s)

    def _set(self, name, value, nx, ttl):
        px = None if ttl is None else max(1, int(ttl * 1000))
        return bool(self._redis.set(name, value, nx=nx, px=px))

    def _get(self, name):
        return self._redis.get(name)

    def _keys(self, prefix):
        keys = [k for k in self._redis.scan_iter(match=self._glob_escape(prefix) + "/*", count=1000)]
        if self._redis.exists(prefix):
            keys.append(prefix)
        return keys

    def _del(self, names):
        total = 0
        for i in range(0, len(names), 1000):
            total += self._redis.delete(*names[i : i + 1000])
        return total

    def _touch(self, name, ttl):
        return bool(self._redis.pexpire(name, max(1, int(ttl * 1000))))

    def _update_record(self, name, put, remove, incr):
        with self._redis.pipeline(transaction=True) as p:
            if put:
                p.hset(name, mapping=put)
            if remove:
                p.hdel(name, *remove)
            for k, n in incr.items():
                p.hincrby(name, k, n)
            p.execute()

    def _get_record(self, name):
        return self._redis.hgetall(name)

    def close(self):
        super().close()
        self._redis.close()


def make_repository(config: NameResolveSettings) -> NameRecordRepository:
    if config.type == "memory":
        return MemoryNameRecordRepository()
    if config.type == "redis":
        if not config.redis_url:
            raise NameResolveError(
                "cluster.name_resolve.redis_url is empty: start a redis-server (the launcher does "
                "this for you) or set cluster.name_resolve.type=memory for a single process"
            )
        return RedisNameRecordRepository(config.redis_url)
    raise ValueError(f"cluster.name_resolve.type must be 'redis' or 'memory', got {config.type!r}")


# ---- the process-wide repository behind the module-level functions -----------------------------

_live_repositories: "weakref.WeakSet[NameRecordRepository]" = weakref.WeakSet()
_default: NameRecordRepository = MemoryNameRecordRepository()


def reconfigure(config: NameResolveSettings) -> NameRecordRepository:
    """Make a repository for `config` the process-wide one (the previous one is closed)."""
    global _default
    new = make_repository(config)
    old, _default = _default, new
    old.close()
    return new


def repository() -> NameRecordRepository:
    return _default


def add(name, value, replace=False, keepalive_ttl=None, delete_on_exit=True):
    return _default.add(name, value, replace=replace, keepalive_ttl=keepalive_ttl, delete_on_exit=delete_on_exit)


def add_subentry(name, value, keepalive_ttl=None, delete_on_exit=True):
    return _default.add_subentry(name, value, keepalive_ttl=keepalive_ttl, delete_on_exit=delete_on_exit)


def get(name):
    return _default.get(name)


def get_subtree(prefix):
    return _default.get_subtree(prefix)


def find_subtree(prefix):
    return _default.find_subtree(prefix)


def wait(name, timeout, poll_interval=_WAIT_POLL_S):
    return _default.wait(name, timeout, poll_interval)


def delete(name):
    return _default.delete(name)


def clear_subtree(prefix):
    return _default.clear_subtree(prefix)


def reset():
    return _default.reset()


def update_record(name, put=None, remove=None, incr=None):
    return _default.update_record(name, put=put, remove=remove, incr=incr)


def get_record(name):
    return _default.get_record(name)


@atexit.register
def _reset_all_at_exit():
    for repo in list(_live_repositories):
        try:
            repo.close()
        except Exception:
            pass
