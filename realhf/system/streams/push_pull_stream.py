"""The trajectory stream: ZMQ PUSH (rollout workers) → PULL (model-worker DP heads), msgpack only.

Pushers are assigned to pullers by `grouping` (docs/architecture.md §6) and find their puller's address in
name resolve; a puller that receives garbage or an unauthenticated message logs it (rate-limited),
counts it and keeps delivering.
"""

import time
from typing import Any, Dict, List, Optional

import zmq

from realhf.base import logging, name_resolve, names, serialization, zmq_curve
from realhf.base import secret as auth
from realhf.base.body_limit import DEFAULT_MAX_MESSAGE_BYTES
from realhf.base.network import host_for_peers
from realhf.base.secret import RateLimitedLog

logger = logging.getLogger("push_pull_stream")


def grouping(n_senders: int, n_receivers: int) -> Dict[int, List[int]]:
    """Which senders feed which receiver.

    Receiver r gets senders [r·k, (r+1)·k) with k = n_senders // n_receivers; the remaining
    senders go one each to receivers 0, 1, …. Every receiver needs at least one sender.
    """
    if n_receivers <= 0:
        raise ValueError(f"need at least one receiver, got {n_receivers}")
    if n_senders < n_receivers:
        raise ValueError(
            f"{n_senders} senders cannot feed {n_receivers} receivers: every receiver (DP head) "
            "needs at least one sender (rollout worker)"
        )
    k = n_senders // n_receivers
    groups = {r: list(range(r * k, (r + 1) * k)) for r in range(n_receivers)}
    for i, sender in enumerate(range(k * n_receivers, n_senders)):
        groups[i].append(sender)
    return groups


def receiver_of(sender: int, n_senders: int, n_receivers: int) -> int:
    for receiver, senders in grouping(n_senders, n_receivers).items():
        if sender in senders:
            return receiver
    raise ValueError(f"sender index {sender} out of range [0, {n_senders})")


class MessageTooLarge(ValueError):
    """A message larger than the receiver accepts: refused at the sender, never sent."""


class ZMQPusher:
    """PUSH socket connected to one puller; `push` blocks at most `send_timeout` s. Every message
    carries the HMAC tag of the trial's `secret` (realhf.base.secret). A message larger than
    `max_message_bytes` (the puller's limit) raises MessageTooLarge instead of being sent: the
    receiving libzmq would drop it without a word and disconnect this sender."""

    def __init__(
        self,
        address: str,
        send_timeout: float = 60.0,
        hwm: int = 1000,
        secret: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.address = address
        self._secret = secret
        self._max_bytes = int(max_message_bytes)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
        self._sock.setsockopt(zmq.LINGER, 5000)  # let queued messages leave on close
        zmq_curve.secure_client(self._sock, secret)
        self._sock.connect(f"tcp://{address}")
        self._send_timeout = send_timeout

    def push(self, obj: Any) -> None:
        self.push_bytes(serialization.dumps(obj))

    def push_bytes(self, data: bytes) -> None:
        frames = auth.tag_frames(self._secret, auth.TRAJECTORY_LABEL, data)
        size = sum(len(f) for f in frames)
        if size > self._max_bytes:
            raise MessageTooLarge(
                f"a message of {size} bytes exceeds cluster.max_message_bytes={self._max_bytes} "
                f"(the receiver's limit): not sent; raise cluster.max_message_bytes or shorten "
                "the groups (ppo.gen.max_new_tokens, group_size)"
            )
        try:
            self._sock.send_multipart(frames, copy=len(data) < 65536)
        except zmq.Again:
            raise TimeoutError(
                f"could not push to puller at {self.address} within {self._send_timeout:.0f}s "
                "(puller gone or its queue full)"
            ) from None

    def close(self) -> None:
        self._sock.close()


class ZMQPuller:
    """PULL socket bound on `host` (port 0: any free port).

    A message without a valid tag of `secret` is refused (`n_forged`) before it is parsed; one
    larger than `max_message_bytes` never arrives: libzmq drops it and disconnects the sender,
    whose socket reconnects by itself (docs/architecture.md, Authentication)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        hwm: int = 1000,
        secret: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self._secret = secret
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        zmq_curve.secure_server(self._sock, secret)  # no connection, so no byte, without the secret
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.host, self.port = host, port
        self.address = f"{host_for_peers(host)}:{port}"
        self.n_received = 0
        self.n_malformed = 0
        self.n_forged = 0
        self._forged_log = RateLimitedLog(
            logger, f"puller {self.address} refused an unauthenticated message", level="error"
        )
        self._malformed_log = RateLimitedLog(
            logger, f"puller {self.address} dropped a malformed message", level="error"
        )

    def pull_bytes(self, timeout: Optional[float] = None) -> bytes:
        """Next authenticated raw message; TimeoutError after `timeout` s (None: wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is not None:
                remaining = max(0.0, deadline - time.monotonic())
                if not self._sock.poll(int(remaining * 1000)):
                    raise TimeoutError(f"no message on puller {self.address} within {timeout:.3f}s")
            frames = self._sock.recv_multipart(copy=True)
            payload = auth.check_frames(self._secret, auth.TRAJECTORY_LABEL, frames)
            if payload is not None:
                return payload
            self.n_forged += 1
            self._forged_log.event(f"{len(frames)} frames, {sum(len(f) for f in frames)} bytes, no valid tag")

    def pull(self, timeout: Optional[float] = None) -> Any:
        """Next well-formed message; malformed ones are logged, counted and skipped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            data = self.pull_bytes(remaining)
            try:
                obj = serialization.loads(data)
            except serialization.DeserializationError as e:
                self.n_malformed += 1
                self._malformed_log.event(f"{len(data)} bytes: {e}")
                continue
            self.n_received += 1
            return obj

    def close(self) -> None:
        self._sock.close()


class NameResolvingZmqPuller(ZMQPuller):
    """A DP head's puller, registered under `stream/puller<dp>` for the rollout workers."""

    def __init__(self, experiment: str, trial: str, puller_index: int, host: str = "127.0.0.1", **kw):
        super().__init__(host=host, **kw)
        self._key = names.stream_puller(experiment, trial, puller_index)
        name_resolve.add(self._key, self.address, replace=True)
        self._sub = name_resolve.add_subentry(names.stream_pullers(experiment, trial), str(puller_index))
        logger.debug(f"puller {puller_index} listening on {self.address}")

    def close(self) -> None:
        for key in (self._key, self._sub):
            try:
                name_resolve.delete(key)
            except name_resolve.NameEntryNotFoundError:
                pass
        super().close()


class NameResolvingZmqPusher(ZMQPusher):
    """A rollout worker's pusher, connected to the puller `grouping` assigns it."""

    def __init__(
        self,
        experiment: str,
        trial: str,
        pusher_index: int,
        pusher_cnt: int,
        n_pullers: int,
        discovery_timeout: float = 300.0,
        **kw,
    ):
        self.puller_index = receiver_of(pusher_index, pusher_cnt, n_pullers)
        address = name_resolve.wait(
            names.stream_puller(experiment, trial, self.puller_index), timeout=discovery_timeout
        )
        super().__init__(address, **kw)
        logger.debug(f"pusher {pusher_index}/{pusher_cnt} → puller {self.puller_index} at {address}")
