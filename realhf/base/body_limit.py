"""A bound on the size of HTTP request bodies, for every server of a run (the native generation
server and the GserverManager): a larger body is answered 413 before the endpoint parses it, so
one request cannot make a server buffer and decode gigabytes.

    app.add_middleware(BodySizeLimit, max_bytes=cfg.max_request_bytes)

A declared `Content-Length` over the bound is refused without reading the body; a chunked body
is counted as it arrives and refused at the first chunk past the bound.
"""

from __future__ import annotations

import json

# The default of cluster.max_request_bytes, and what a server built outside a run uses
# (python -m realhf.launch_server, tests).
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
# The default of cluster.max_message_bytes (ZMQ: a trajectory group, a master/worker message),
# kept here beside its HTTP sibling so both bounds are declared once.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            # Endpoints read the whole body before they answer, so no response has started.
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = json.dumps({"detail": f"request body larger than max_request_bytes={self.max_bytes}"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
