"""ZMQ's own authentication for the run's sockets: CURVE keys derived from the trial's secret.

The HMAC tag on every message (realhf.base.secret) is checked only once libzmq has handed the
message over, and libzmq receives a multi-part message whole before it hands over any part; its
size cap (`ZMQ_MAXMSGSIZE`) is per part. So a peer without the secret could make a receiver hold
an unbounded message in memory (measured: 34 → 334 MB from one forged multi-part message) before
any tag was looked at. With CURVE the handshake itself needs keys only a holder of the secret can
compute, and ZAP (ZMQ's authentication protocol, here pyzmq's ThreadAuthenticator) accepts only
the client key of this trial: a peer without the secret never gets a connection, so it cannot send
a byte of a message. CURVE also encrypts the stream (trajectories and requests on a shared network).

    server key pair  (binding sockets: trajectory PULL, master ROUTER)  from sha256("…server…" + secret)
    client key pair  (connecting sockets: PUSH, DEALER)                 from sha256("…client…" + secret)

Each trial's keys are their own ZAP domain, so in one process (tests) sockets of two secrets do
not accept each other's clients. An empty secret (components built by hand in unit tests) turns
this off, like the tags.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Dict, Tuple

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

_lock = threading.Lock()
_authenticators: Dict[int, ThreadAuthenticator] = {}  # per context: ZAP binds one endpoint in each
_client_keys: Dict[str, bytes] = {}  # ZAP domain → the client public key it accepts


def _pair(secret: str, role: bytes) -> Tuple[bytes, bytes]:
    """(public, secret) z85 keys; any 32 bytes are a Curve25519 secret key."""
    secret_key = z85.encode(hashlib.sha256(b"realhf/curve/" + role + b"\0" + secret.encode()).digest())
    return zmq.curve_public(secret_key), secret_key


def _domain(secret: str) -> str:
    return "realhf-" + hashlib.sha256(b"realhf/zap-domain\0" + secret.encode()).hexdigest()[:16]


def _allowed(domain: str, client_key: bytes) -> bool:
    return _client_keys.get(domain) == client_key


def _ensure_authenticator(ctx: zmq.Context, secret: str) -> str:
    domain = _domain(secret)
    with _lock:
        auth = _authenticators.get(id(ctx))
        if auth is None:
            auth = ThreadAuthenticator(ctx)
            auth.start()
            _authenticators[id(ctx)] = auth
        if domain not in _client_keys:
            _client_keys[domain] = _pair(secret, b"client")[0]
            auth.configure_curve_callback(domain, credentials_provider=_CallbackProvider())
    return domain


class _CallbackProvider:
    """pyzmq asks `callback(domain, z85 client key)` for every CURVE handshake."""

    def callback(self, domain: str, client_key: bytes) -> bool:
        return _allowed(domain, client_key)


def secure_server(sock: zmq.Socket, secret: str) -> None:
    """Make a binding socket accept only CURVE clients holding `secret`'s client key (call before bind)."""
    if not secret:
        return
    sock.zap_domain = _ensure_authenticator(sock.context, secret).encode()
    sock.curve_secretkey = _pair(secret, b"server")[1]
    sock.curve_server = True


def secure_client(sock: zmq.Socket, secret: str) -> None:
    """Make a connecting socket handshake with CURVE using `secret`'s keys (call before connect)."""
    if not secret:
        return
    public, secret_key = _pair(secret, b"client")
    sock.curve_serverkey = _pair(secret, b"server")[0]
    sock.curve_publickey = public
    sock.curve_secretkey = secret_key
