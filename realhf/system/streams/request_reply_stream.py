"""Request/reply between the master (one ROUTER) and the model workers (one DEALER each).

A worker's DEALER identity is its index, so the master routes by index. Requests carry ids;
replies echo them, so several requests can be in flight at once and gathered in any order.
An exception in a worker's handler comes back as `RemoteError(type, message, worker)`.

Every message, the hello included, carries the HMAC tag of the trial's secret
(realhf.base.secret); one without a valid tag is counted (`n_forged`), logged (rate-limited) and
dropped before it is parsed, so a forged hello never marks a worker connected. Messages larger
than `max_message_bytes` are dropped by libzmq, which disconnects the sender (it reconnects).
"""

import time
import traceback
import uuid
from dataclasses import dataclass
from logging import Logger
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import zmq

from realhf.base import logging, name_resolve, names, serialization, zmq_curve
from realhf.base import secret as auth
from realhf.base.body_limit import DEFAULT_MAX_MESSAGE_BYTES
from realhf.base.network import host_for_peers
from realhf.base.secret import RateLimitedLog

logger = logging.getLogger("request_reply")

_HELLO = "__hello__"


class RemoteError(RuntimeError):
    """An exception raised by a handler in a worker, re-raised on the master."""

    def __init__(self, type: str, message: str, worker: int, traceback: str = ""):
        super().__init__(f"{type} in model worker {worker}: {message}")
        self.type, self.message, self.worker, self.remote_traceback = type, message, worker, traceback


@dataclass
class Request:
    request_id: str
    handler: int
    handle_name: str
    data: Any


def _identity(index: int) -> bytes:
    return str(int(index)).encode()


class MasterStream:
    """The master's end: `call(worker, name, data)` or `post(...)` then `wait([...])`."""

    def __init__(
        self,
        experiment: str,
        trial: str,
        n_workers: int,
        host: str = "127.0.0.1",
        secret: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        n_node_workers: int = 0,
    ):
        # Model workers are 0..n_workers-1 (what call_all reaches by default); node workers
        # (realhf.system.node) follow them.
        self.n_workers = n_workers
        self.n_node_workers = n_node_workers
        self._secret = secret
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an unknown worker raises
        self._sock.setsockopt(zmq.LINGER, 0)
        zmq_curve.secure_server(self._sock, secret)  # no connection, so no byte, without the secret
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"{host_for_peers(host)}:{port}"
        self._key = names.request_reply_master(experiment, trial)
        name_resolve.add(self._key, self.address, replace=True)
        self._connected: set = set()
        self._replies: Dict[str, dict] = {}
        self._pending: Dict[str, Request] = {}
        self.n_malformed = 0  # undecodable or not a map: logged and dropped
        self.n_unmatched = 0  # replies to no pending request (late, duplicate or foreign): dropped
        self.n_forged = 0  # no valid tag of the secret: dropped unparsed
        # Called while waiting for replies (every 0.5 s at most): the master raises from it once it
        # is asked to stop, so that a wait on a trainer that died ends with the run, not after
        # request_timeout (and a launcher's SIGKILL).
        self.check_stop: Callable[[], None] = lambda: None
        self._forged_log = RateLimitedLog(logger, "master refused an unauthenticated message", level="error")
        self._malformed_log = RateLimitedLog(logger, "master dropped a malformed message", level="error")

    # ---- connection -------------------------------------------------------------------------
    def wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        total = self.n_workers + self.n_node_workers
        while len(self._connected) < total:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(total)) - self._connected)
                groups = [
                    (kind, [i for i in missing if (i < self.n_workers) == (kind == "model")])
                    for kind in ("model", "node")
                ]
                who = " and ".join(f"{kind} workers {ids}" for kind, ids in groups if ids)
                raise TimeoutError(f"{who} did not connect to the master at {self.address} within {timeout:.0f}s")
            self._receive(min(remaining, 0.5))

    # ---- requests ---------------------------------------------------------------------------
    def post(self, worker: int, handle_name: str, data: Any = None) -> str:
        request_id = uuid.uuid4().hex
        msg = {"request_id": request_id, "handler": int(worker), "handle_name": handle_name, "data": data}
        try:
            self._sock.send_multipart(
                [_identity(worker), *auth.tag_frames(self._secret, auth.REQUEST_REPLY_LABEL, serialization.dumps(msg))]
            )
        except zmq.error.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                raise ConnectionError(
                    f"model worker {worker} is not connected to the master (request {handle_name!r})"
                ) from None
            raise
        self._pending[request_id] = Request(request_id, int(worker), handle_name, None)
        return request_id

    def wait(self, request_ids: Sequence[str], timeout: float) -> List[Any]:
        """Replies in the order of `request_ids`; the first remote error is raised as RemoteError
        after every reply has arrived (so no reply is left behind to confuse later calls)."""
        deadline = time.monotonic() + timeout
        while any(rid not in self._replies for rid in request_ids):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = [
                    f"{self._pending[r].handle_name}@worker{self._pending[r].handler}"
                    for r in request_ids
                    if r not in self._replies and r in self._pending
                ]
                raise TimeoutError(f"no reply within {timeout:.1f}s from: {', '.join(waiting)}")
            self.check_stop()
            self._receive(min(remaining, 0.5))
        replies = [self._replies.pop(rid) for rid in request_ids]
        # The worker index is the one the request was sent to, not whatever the reply claims.
        workers = [self._pending.pop(rid).handler if rid in self._pending else -1 for rid in request_ids]
        for reply, worker in zip(replies, workers):
            if reply.get("ok", False) is not True:
                err = reply.get("error")
                err = err if isinstance(err, dict) else {"type": "MalformedReply", "message": repr(reply)[:500]}
                raise RemoteError(
                    str(err.get("type", "Error")), str(err.get("message", "")), worker, str(err.get("traceback", ""))
                )
        return [reply.get("data") for reply in replies]

    def call(self, worker: int, handle_name: str, data: Any = None, timeout: float = 300.0) -> Any:
        return self.wait([self.post(worker, handle_name, data)], timeout)[0]

    def call_all(
        self,
        handle_name: str,
        data: Any = None,
        workers: Optional[Iterable[int]] = None,
        timeout: float = 300.0,
        per_worker_data: Optional[Dict[int, Any]] = None,
    ) -> List[Any]:
        workers = list(range(self.n_workers)) if workers is None else list(workers)
        ids = [self.post(w, handle_name, per_worker_data[w] if per_worker_data is not None else data) for w in workers]
        return self.wait(ids, timeout)

    # ---- receiving --------------------------------------------------------------------------
    def _receive(self, timeout: float) -> None:
        if not self._sock.poll(int(timeout * 1000)):
            return
        while True:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            payload = auth.check_frames(self._secret, auth.REQUEST_REPLY_LABEL, frames[1:])
            if payload is None:
                self.n_forged += 1
                self._forged_log.event(f"{len(frames) - 1} frames from {identity[:64]!r}, no valid tag")
                continue
            try:
                msg = serialization.loads(payload)
                if not isinstance(msg, dict):
                    raise serialization.DeserializationError("reply is not a map")
            except serialization.DeserializationError as e:
                self.n_malformed += 1
                self._malformed_log.event(f"from {identity[:64]!r}: {e}")
                continue
            if msg.get("handle_name") == _HELLO:
                try:
                    index = int(identity.decode())
                except ValueError:
                    index = -1
                if 0 <= index < self.n_workers + self.n_node_workers:
                    self._connected.add(index)
                else:
                    self.n_malformed += 1
                    self._malformed_log.event(
                        f"hello from {identity[:64]!r}: not a worker index in [0, {self.n_workers + self.n_node_workers})"
                    )
                continue
            rid = msg.get("request_id")
            # Accepted only from the worker the request went to (identity = its index).
            if isinstance(rid, str) and rid in self._pending and identity == _identity(self._pending[rid].handler):
                self._replies[rid] = msg
            else:
                self.n_unmatched += 1
                logger.warning(f"master dropped a reply to unknown request {str(rid)[:64]!r} from {identity[:64]!r}")

    def close(self) -> None:
        try:
            name_resolve.delete(self._key)
        except name_resolve.NameEntryNotFoundError:
            pass
        self._sock.close()


class WorkerStream:
    """A model worker's end: `poll()` a request, then `reply()` or `reply_error()`."""

    def __init__(
        self,
        experiment: str,
        trial: str,
        worker_index: int,
        discovery_timeout: float = 300.0,
        secret: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.index = worker_index
        self._secret = secret
        address = name_resolve.wait(names.request_reply_master(experiment, trial), timeout=discovery_timeout)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, _identity(worker_index))
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        zmq_curve.secure_client(self._sock, secret)
        self._sock.connect(f"tcp://{address}")
        self.n_malformed = 0
        self.n_forged = 0
        self._forged_log = RateLimitedLog(
            logger, f"model worker {worker_index} refused an unauthenticated message", level="error"
        )
        self._malformed_log = RateLimitedLog(
            logger, f"model worker {worker_index} dropped a malformed request", level="error"
        )
        self._send({"request_id": "", "handler": worker_index, "handle_name": _HELLO})

    def _send(self, msg: dict) -> None:
        self._sock.send_multipart(auth.tag_frames(self._secret, auth.REQUEST_REPLY_LABEL, serialization.dumps(msg)))

    def poll(self, timeout: float) -> Optional[Request]:
        """The next request, or None if none arrived within `timeout` s."""
        if not self._sock.poll(int(timeout * 1000)):
            return None
        frames = self._sock.recv_multipart()
        payload = auth.check_frames(self._secret, auth.REQUEST_REPLY_LABEL, frames)
        if payload is None:
            self.n_forged += 1
            self._forged_log.event(f"{len(frames)} frames, no valid tag")
            return None
        try:
            msg = serialization.loads(payload)
            if not isinstance(msg, dict) or not isinstance(msg.get("handle_name"), str):
                raise serialization.DeserializationError("request is not a map with a handle_name")
        except serialization.DeserializationError as e:
            self.n_malformed += 1
            self._malformed_log.event(str(e))
            return None
        return Request(str(msg.get("request_id", "")), self.index, msg["handle_name"], msg.get("data"))

    def reply(self, request: Request, data: Any = None) -> None:
        self._send({"request_id": request.request_id, "handler": self.index, "ok": True, "data": data})

    def reply_error(self, request: Request, exc: BaseException) -> None:
        err = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:],
        }
        self._send({"request_id": request.request_id, "handler": self.index, "ok": False, "error": err})

    def serve(
        self,
        request: Request,
        handlers: Mapping[str, Callable[[Any], Any]],
        log: Logger,
        fatal: Callable[[Exception], Optional[Exception]] = lambda e: None,
    ) -> None:
        """Run `request`'s handler and reply with its result, or with its error (logged with its
        traceback; the worker goes on). `fatal(e)` names an error the worker cannot go on after:
        what it returns is replied, logged and raised."""
        handler = handlers.get(request.handle_name)
        try:
            if handler is None:
                raise ValueError(f"unknown handler {request.handle_name!r}; known: {sorted(handlers)}")
            result = handler(request.data if request.data is not None else {})
        except Exception as e:
            error = fatal(e)
            if error is not None:
                log.error(str(error))
                self.reply_error(request, error)
                raise error from None
            log.exception(f"handler {request.handle_name!r} failed: {e}")
            self.reply_error(request, e)
        else:
            self.reply(request, result)

    def close(self) -> None:
        self._sock.close()
