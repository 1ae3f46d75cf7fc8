"""How the trial's shared secret authenticates messages and requests (docs/architecture.md, Authentication).

    ZMQ (trajectory stream, master/worker request-reply): a message is the frames
        [tag, payload], tag = HMAC-SHA256(secret, label || payload) (32 bytes); `tag_frames`
        builds them, `check_frames` returns the payload or None (constant-time compare), before
        anything parses it. The label separates the streams, so a tag of one is no tag of another.
    HTTP (generation server, manager): `Authorization: Bearer <secret>` on every request;
        `RequireSecret` answers 401 without it, 403 with a wrong one, and counts both.
        Clients send `auth_headers(secret)` (as the default headers of their aiohttp session).

An empty secret turns all of it off (components built by hand in unit tests): then messages are
the single frame [payload] and every request passes. A launched run always has a secret.
Neither the secret nor a tag is ever logged.

`RateLimitedLog` is the one helper for logging refused or malformed input: an attacker (or a
broken peer) must not be able to fill the disk through our error log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from typing import List, Optional, Sequence

TAG_BYTES = 32

TRAJECTORY_LABEL = b"realhf/trajectory\0"
REQUEST_REPLY_LABEL = b"realhf/request-reply\0"


def _key(secret: str) -> bytes:
    return secret.encode()


def tag(secret: str, label: bytes, payload: bytes) -> bytes:
    mac = hmac.new(_key(secret), label, hashlib.sha256)
    mac.update(payload)  # no concatenation: a trajectory group can be megabytes
    return mac.digest()


def tag_frames(secret: str, label: bytes, payload: bytes) -> List[bytes]:
    """The frames to send for `payload`: [tag, payload], or [payload] without a secret."""
    if not secret:
        return [payload]
    return [tag(secret, label, payload), payload]


def check_frames(secret: str, label: bytes, frames: Sequence[bytes]) -> Optional[bytes]:
    """The payload of received `frames` if they carry a valid tag (any single frame without a
    secret), else None. Nothing of the payload is parsed before this says yes."""
    if not secret:
        return frames[-1] if len(frames) == 1 else None
    if len(frames) != 2 or len(frames[0]) != TAG_BYTES:
        return None
    payload = frames[1]
    if not hmac.compare_digest(frames[0], tag(secret, label, payload)):
        return None
    return payload


def write_private(path: str, text: str) -> None:
    """Write `path` readable by its owner only (worker configs carry the secret and the Redis
    password). The mode is set at creation, so the text is never readable by others."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


# ---- HTTP --------------------------------------------------------------------------------------
def auth_headers(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


class AuthCounters:
    def __init__(self):
        self.missing = 0  # answered 401
        self.wrong = 0  # answered 403

    def as_dict(self) -> dict:
        return {"missing": self.missing, "wrong": self.wrong}


class RequireSecret:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <secret>`.

    Pure ASGI (not BaseHTTPMiddleware) so that it refuses before the body is read and does not
    break the disconnect detection of /generate. `counters` is shared with the app's status page."""

    def __init__(self, app, secret: str, counters: AuthCounters, log: "RateLimitedLog"):
        self.app, self.counters, self.log = app, counters, log
        self._expected = f"Bearer {secret}".encode() if secret else b""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._expected:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        if given and hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        if not given:
            self.counters.missing += 1
            status, message = 401, "missing Authorization header: this server requires the run's secret"
        else:
            self.counters.wrong += 1
            status, message = 403, "wrong secret in the Authorization header"
        self.log.event(
            f"refused {scope.get('method', '?')} {scope.get('path', '?')[:200]} from "
            f"{(scope.get('client') or ('?',))[0]} with HTTP {status}"
        )
        body = json.dumps({"error": {"message": message, "code": status}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def require_secret(app, secret: str, logger, what: str) -> AuthCounters:
    """Add `RequireSecret` to a FastAPI/Starlette `app`; returns its counters."""
    counters = AuthCounters()
    app.add_middleware(
        RequireSecret, secret=secret, counters=counters, log=RateLimitedLog(logger, f"{what}: unauthenticated request")
    )
    return counters


# ---- rate-limited logging ----------------------------------------------------------------------
class RateLimitedLog:
    """Logs the first event, then at most one line per `interval` s or when the count doubles,
    each saying how many events were not logged since the previous line."""

    def __init__(self, logger, what: str, interval: float = 10.0, level: str = "warning"):
        self._log = getattr(logger, level)
        self.what, self.interval = what, interval
        self.count = 0
        self._logged_at_count = 0
        self._last = float("-inf")

    def event(self, detail: str) -> bool:
        """Count one event; True if it was logged."""
        self.count += 1
        now = time.monotonic()
        doubled = self.count >= 2 * self._logged_at_count
        if self._logged_at_count and not doubled and now - self._last < self.interval:
            return False
        dropped = self.count - self._logged_at_count - 1
        since = f" ({dropped} more not logged since the last line)" if dropped else ""
        self._log(f"{self.what} #{self.count}: {detail}{since}")
        self._logged_at_count, self._last = self.count, now
        return True
