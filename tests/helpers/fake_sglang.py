"""A fake SGLang generation server: the HTTP protocol of docs/architecture.md §5 with deterministic outputs.

A real FastAPI/uvicorn app on 127.0.0.1 (in a thread of the test process, so tests can read its
counters). Output token k of a request is a pure function of the sequence so far and the weight
version, its log-prob a pure function of the token, so tests can check what the client
assembled. Knobs:

- `stop_at_len`: emit EOS when the whole sequence (prompt + output) reaches this length
  (None: never stop early, every request runs to its max_new_tokens);
- `token_delay`: seconds per generated token (lets a test pause a request mid-answer);
- `abort_after`: return `abort` after this many tokens of each request (simulated preemption).

`/pause_generation` makes running requests return `abort` with their tokens so far and holds
new ones until `/continue_generation`; `/update_weights_from_disk` sets `weight_version`.
Every call is recorded in `events` (name, weight_version, monotonic time) and `/generate` calls
are counted.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Dict, List, Optional

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from realhf.system.streams.http_thread import HttpServerThread

EOS = 2
FIRST_TOKEN = 4  # 0..3 are specials


def fake_token(seq_len: int, last_token: int, version: int, vocab_size: int) -> int:
    return FIRST_TOKEN + (31 * seq_len + 7 * last_token + 101 * version) % (vocab_size - FIRST_TOKEN)


def fake_logprob(token: int) -> float:
    return -0.1 * (1 + token % 7)


class SamplingParams(BaseModel):
    max_new_tokens: int = Field(16, ge=0)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: List[int] = []
    min_new_tokens: int = 0
    n: int = Field(1, ge=1)


class GenerateRequest(BaseModel):
    input_ids: List[int] = Field(min_length=1)
    sampling_params: SamplingParams = SamplingParams()
    return_logprob: bool = False
    rid: Optional[str] = None


class UpdateWeightsRequest(BaseModel):
    model_path: str
    # A string, as SGLang declares it (an integer gets 422 here, 400 from SGLang): the manager's
    # requests are checked on every test that updates a fake server.
    weight_version: Optional[str] = Field(None, strict=True)


class FakeSGLangServer:
    def __init__(
        self,
        vocab_size: int = 64,
        stop_at_len: Optional[int] = None,
        token_delay: float = 0.0,
        abort_after: Optional[int] = None,
        check_model_path: bool = False,
        update_delay: float = 0.0,
        weight_version: int = 0,
    ):
        self.vocab_size = vocab_size
        self.stop_at_len = stop_at_len
        self.token_delay = token_delay
        self.abort_after = abort_after
        self.check_model_path = check_model_path
        self.update_delay = update_delay
        self.weight_version = weight_version
        self.n_generate = 0
        self.n_running = 0
        self.max_running = 0
        self.events: List[tuple] = []
        self.requests: List[Dict[str, Any]] = []
        self.loaded_paths: List[str] = []
        self._lock = threading.Lock()
        self._paused = False
        self._resume: Optional[asyncio.Event] = None
        self._pause_gen = 0
        self._aborted_rids: set = set()
        self._http = HttpServerThread(self._build_app(), name="fake-sglang")
        self.url = self._http.url

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "FakeSGLangServer":
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def event_names(self) -> List[str]:
        with self._lock:
            return [e[0] for e in self.events]

    def _record(self, name: str) -> None:
        with self._lock:
            self.events.append((name, self.weight_version, time.monotonic()))

    # ---- the app --------------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(req: GenerateRequest):
            sp = req.sampling_params
            if self._resume is None:
                self._resume = asyncio.Event()
                self._resume.set()
            await self._resume.wait()  # paused: new requests wait
            with self._lock:
                self.n_generate += 1
                self.n_running += 1
                self.max_running = max(self.max_running, self.n_running)
                self.requests.append(
                    {"rid": req.rid, "input_len": len(req.input_ids), "sampling_params": sp.model_dump()}
                )
            pause_gen = self._pause_gen
            version = self.weight_version

            async def one(rid):
                seq = list(req.input_ids)
                out: List[int] = []
                reason = "length"
                while len(out) < sp.max_new_tokens:
                    if self._pause_gen != pause_gen or rid in self._aborted_rids:
                        reason = "abort"
                        break
                    if self.abort_after is not None and len(out) >= self.abort_after:
                        reason = "abort"
                        break
                    if self.stop_at_len is not None and len(seq) + 1 >= self.stop_at_len:
                        tok = EOS
                    else:
                        tok = fake_token(len(seq), seq[-1], version, self.vocab_size)
                    out.append(tok)
                    seq.append(tok)
                    if tok in sp.stop_token_ids or tok == EOS:
                        reason = "stop"
                        break
                    if self.token_delay:
                        await asyncio.sleep(self.token_delay)
                    elif len(out) % 32 == 0:
                        await asyncio.sleep(0)
                meta = {
                    "id": rid,
                    "finish_reason": {"type": reason},
                    "prompt_tokens": len(req.input_ids),
                    "completion_tokens": len(out),
                    "weight_version": str(version),  # a string, as SGLang's
                }
                if req.return_logprob:
                    meta["output_token_logprobs"] = [[fake_logprob(t), t, None] for t in out]
                return {"output_ids": out, "meta_info": meta}

            try:
                if sp.n == 1:
                    return await one(req.rid)
                # SGLang's n: a list of n answers (the same here: outputs are a function of the sequence).
                return list(await asyncio.gather(*(one(f"{req.rid}-{j}") for j in range(sp.n))))
            finally:
                with self._lock:
                    self.n_running -= 1

        @app.post("/pause_generation")
        async def pause_generation():
            if self._resume is None:
                self._resume = asyncio.Event()
            self._resume.clear()
            self._pause_gen += 1
            self._record("pause")
            return {"success": True}

        @app.post("/continue_generation")
        async def continue_generation():
            if self._resume is None:
                self._resume = asyncio.Event()
            self._resume.set()
            self._record("continue")
            return {"success": True}

        @app.post("/update_weights_from_disk")
        async def update_weights(req: UpdateWeightsRequest):
            if self.check_model_path and not os.path.isdir(req.model_path):
                return {"success": False, "message": f"model_path {req.model_path} is not a directory"}
            if self.update_delay:
                await asyncio.sleep(self.update_delay)
            if req.weight_version is not None:
                self.weight_version = int(req.weight_version)
            self.loaded_paths.append(req.model_path)
            self._record("update")
            return {"success": True, "message": "ok"}

        @app.post("/abort_request")
        async def abort_request(body: Dict[str, Any]):
            rid = body.get("rid")
            if not isinstance(rid, str):
                raise HTTPException(400, "abort_request needs a string rid")
            self._aborted_rids.add(rid)
            return {"success": True}

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(f"fake_generate_calls_total {self.n_generate}\n")

        @app.post("/flush_cache")
        async def flush_cache():
            return {"success": True}

        return app
