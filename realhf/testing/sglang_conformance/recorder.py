"""An HTTP server on loopback that records every call made to it: what realhf's clients send, and
what a server answers them.

    with Recorder(target="http://127.0.0.1:30000") as rec:   # a proxy: forwards, records both ways
        client_under_test(rec.url)
    rec.calls   # [Call(method, path, body, status, content_type, text), ...]

    with Recorder(answer=lambda method, path, body: (200, {...})) as rec:   # answers itself

Bodies are JSON (msgpack and pickle never cross it). Every forwarded call has `timeout` seconds,
after which it is answered 504 naming the call it waited for.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import Response

from realhf.system.streams.http_thread import HttpServerThread

Answer = Callable[[str, str, Any], Tuple[int, Any]]  # (method, path, body) -> (status, JSON or None)


@dataclass
class Call:
    method: str
    path: str
    body: Any  # the parsed JSON body; None when there was none
    status: int
    content_type: str
    text: str  # the answer's body as text

    def json(self) -> Any:
        return json.loads(self.text)


class Recorder:
    def __init__(
        self,
        target: Optional[str] = None,
        answer: Optional[Answer] = None,
        timeout: float = 120.0,
        headers: Optional[Dict[str, str]] = None,
    ):
        if (target is None) == (answer is None):
            raise ValueError("Recorder: give either target (a server to forward to) or answer (a function)")
        self.target = target.rstrip("/") if target else None
        self._answer, self.timeout, self._headers = answer, timeout, dict(headers or {})
        self.calls: List[Call] = []
        self._lock = threading.Lock()
        self._http = HttpServerThread(self._app(), "127.0.0.1", 0, name="conformance-recorder")
        self.url = self._http.url

    def __enter__(self) -> "Recorder":
        self._http.start(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self._http.stop()

    def calls_to(self, path: str) -> List[Call]:
        with self._lock:
            return [c for c in self.calls if c.path == path]

    def _app(self) -> FastAPI:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT"])
        async def any_call(path: str, request: Request):
            raw = await request.body()
            try:
                body = json.loads(raw) if raw.strip() else None
            except ValueError:
                body = raw.decode(errors="replace")
            path = "/" + path
            if self._answer is not None:
                status, out = self._answer(request.method, path, body)
                text = "" if out is None else json.dumps(out)
                ctype = "application/json" if out is not None else ""
            else:
                status, ctype, text = await self._forward(request.method, path, request.url.query, raw)
            with self._lock:
                self.calls.append(Call(request.method, path, body, status, ctype, text))
            return Response(text, status_code=status, media_type=ctype or None)

        return app

    async def _forward(self, method: str, path: str, query: str, raw: bytes) -> Tuple[int, str, str]:
        url = f"{self.target}{path}" + (f"?{query}" if query else "")
        headers = {**self._headers, **({"Content-Type": "application/json"} if raw else {})}
        try:
            # A session per call: a few calls a run, and nothing is left open when the thread stops.
            async with (
                aiohttp.ClientSession(headers=headers) as session,
                session.request(method, url, data=raw or None, timeout=aiohttp.ClientTimeout(total=self.timeout)) as r,
            ):
                text = await r.text()
                return r.status, r.headers.get("Content-Type", "").split(";")[0], text
        except asyncio.TimeoutError:
            return 504, "text/plain", f"{method} {url}: no answer within {self.timeout:.0f}s"
        except aiohttp.ClientError as e:
            return 502, "text/plain", f"{method} {url} failed: {type(e).__name__}: {e}"
