"""The SGLang HTTP protocol (docs/architecture.md §5) in front of a native `Engine`.

    POST /generate                  {input_ids, sampling_params, return_logprob, rid?}
    POST /pause_generation          running requests return now with finish_reason abort
    POST /continue_generation
    POST /update_weights_from_disk  {model_path, weight_version?} -> {success, message}
    POST /abort_request             {rid} or {abort_all: true}
    GET  /health, /health_generate, /v1/models, /get_model_info, /metrics; GET|POST /flush_cache
    GET  /openapi.json              the request bodies above as an OpenAPI spec

The JSON fields are re-declared here (importing sglang drags in torchvision). Unknown fields are
ignored, as SGLang ignores options it does not use. A body that does not validate — malformed
JSON, wrong types, an empty prompt, token ids out of the vocabulary, a prompt that does not fit
the context — gets a 400 with `{"error": {"message": ...}}` naming the field, never a 5xx.

With a `secret`, every endpoint requires `Authorization: Bearer <secret>` (401 without, 403 with
a wrong one; realhf.base.secret). With a `weights_root` (a run's publish directory),
/update_weights_from_disk loads only from inside it (400 naming model_path); it never goes back to
a lower weight_version (409 naming weight_version; equal is allowed). Refusals of both kinds are
counted in /metrics (`realhf_http_auth_refused_total`, `realhf_weight_update_refused_total`).

The handlers stay thin: they validate, hand the request to the engine thread and await a future
that the engine resolves (`asyncio.wrap_future` → `call_soon_threadsafe`), so the event loop
never waits on the model. A client that disconnects has its request aborted (slot freed).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, List, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from realhf.base import logging
from realhf.base.body_limit import DEFAULT_MAX_REQUEST_BYTES, BodySizeLimit
from realhf.base.secret import RateLimitedLog, require_secret
from realhf.impl.inference.engine import Engine
from realhf.impl.inference.metrics import PROMETHEUS_CONTENT_TYPE, engine_registry
from realhf.impl.inference.request import (
    DEFAULT_MAX_NEW_TOKENS,
    EngineClosedError,
    EngineStepError,
    GenerateRequest,
    SamplingParams,
)

logger = logging.getLogger("gen_server")

_COMMAND_TIMEOUT = 60.0  # seconds a pause/continue/abort may wait for the engine thread


# --------------------------------------------------------------------------------------------
# Request bodies (SGLang's field names)
# --------------------------------------------------------------------------------------------


class SamplingParamsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: Optional[List[int]] = None
    stop: Optional[Union[str, List[str]]] = None
    ignore_eos: bool = False
    n: int = 1


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input_ids: Optional[List[int]] = None
    text: Optional[Union[str, List[str]]] = None
    sampling_params: SamplingParamsBody = Field(default_factory=SamplingParamsBody)
    return_logprob: bool = False
    rid: Optional[str] = None
    stream: bool = False


class UpdateWeightsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: str
    weight_version: Optional[int] = None
    load_format: Optional[str] = None


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: str = "abort"  # SGLang also has "retract" and "in_place"


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: bool = False


class BadRequest(Exception):
    pass


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def _body_spec(model: type, required: bool = True) -> dict:
    """`openapi_extra` declaring `model` as the JSON request body.

    The handlers read the body themselves (any Content-Type, 400 instead of FastAPI's 422), so
    FastAPI cannot infer the schema; this puts it in `/openapi.json` for clients and fuzzers.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref[len("#/$defs/") :]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {"requestBody": {"required": required, "content": {"application/json": {"schema": inline(schema)}}}}


def _json(obj: Any, status: int = 200) -> Response:
    # json.dumps directly: FastAPI's jsonable_encoder walks every list element in Python.
    return Response(json.dumps(obj), status_code=status, media_type="application/json")


async def _parse(request: Request, model: type):
    """The JSON body as `model`, whatever the Content-Type (curl -d sends a form type)."""
    raw = await request.body()
    try:
        obj = json.loads(raw) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(obj).__name__}")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        parts = []
        for err in e.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
        raise BadRequest("invalid request body: " + "; ".join(parts)) from None


def _to_engine_request(body: GenerateBody) -> GenerateRequest:
    sp = body.sampling_params
    if body.input_ids is None:
        if body.text is not None:
            raise BadRequest(
                "this server runs without a tokenizer (like --skip-tokenizer-init): send input_ids, not text"
            )
        raise BadRequest("input_ids is required")
    if sp.stop:
        raise BadRequest("sampling_params.stop (stop strings) needs a tokenizer; use stop_token_ids")
    if sp.n != 1:
        raise BadRequest(f"sampling_params.n must be 1 (send one request per sample), got {sp.n}")
    if body.stream:
        raise BadRequest("stream=true is not supported by this server")
    return GenerateRequest(
        input_ids=list(body.input_ids),
        sampling=SamplingParams(
            max_new_tokens=sp.max_new_tokens,
            min_new_tokens=sp.min_new_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop_token_ids=list(sp.stop_token_ids or []),
            ignore_eos=sp.ignore_eos,
        ),
        rid=body.rid or "",
    )


async def _result_or_disconnect(request: Request, fut, engine: Engine, rid: str):
    """The engine's result, or None once the client disconnected — then the request is aborted
    so that its slot is freed instead of decoding an answer nobody reads."""
    result = asyncio.wrap_future(fut)
    # With the body read, the next ASGI message is `http.disconnect`, and only if the client goes.
    disconnect = asyncio.ensure_future(request.receive())
    try:
        done, _ = await asyncio.wait({result, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        _abort_quietly(engine, rid)
        raise
    finally:
        if not disconnect.done():
            disconnect.cancel()
    if result in done:
        return result.result()
    if disconnect.result().get("type") == "http.disconnect":
        _abort_quietly(engine, rid)
        return None
    return await result


def _abort_quietly(engine: Engine, rid: str) -> None:
    try:
        engine.abort(rid)
    except EngineClosedError:
        pass


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


def _inside(path: str, root: str) -> bool:
    """`path` is `root` or below it once symlinks and `..` are resolved."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def create_app(
    engine: Engine,
    served_model_name: str = "",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    secret: str = "",
    weights_root: str = "",
) -> FastAPI:
    # /openapi.json documents the request bodies (SGLang's server publishes one too); no docs UI.
    app = FastAPI(title="realhf native generation server", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    # Added last = outermost: an unauthenticated request is refused before its body is read.
    auth_refused = require_secret(app, secret, logger, "generation server")
    update_refused = {"model_path": 0, "weight_version": 0}
    update_log = RateLimitedLog(logger, "refused a weight update")
    model_name = served_model_name or engine.model_path or "model"
    started = time.time()
    metrics_registry = engine_registry(engine, model_name)

    @app.exception_handler(BadRequest)
    async def _on_bad_request(request: Request, exc: BadRequest):
        return _error(400, str(exc))

    @app.exception_handler(EngineClosedError)
    async def _on_engine_closed(request: Request, exc: EngineClosedError):
        return _error(503, str(exc))

    @app.exception_handler(EngineStepError)
    async def _on_failed_step(request: Request, exc: EngineStepError):
        return _error(500, str(exc))  # this request failed; the engine serves on

    async def _wait(fut, what: str):
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout=_COMMAND_TIMEOUT)
        except asyncio.TimeoutError:
            raise TimeoutError(f"engine did not complete {what} within {_COMMAND_TIMEOUT:.0f}s") from None

    @app.post("/generate", openapi_extra=_body_spec(GenerateBody))
    async def generate(request: Request):
        body = await _parse(request, GenerateBody)
        try:
            req = _to_engine_request(body)
            fut = engine.submit(req)
        except (BadRequest, ValueError) as e:
            return _error(400, str(e))
        except EngineClosedError as e:
            return _error(503, str(e))
        result = await _result_or_disconnect(request, fut, engine, req.rid)
        if result is None:
            return Response(status_code=499)  # nobody is listening any more
        return _json(result.to_sglang(body.return_logprob))

    @app.post("/pause_generation", openapi_extra=_body_spec(PauseBody, required=False))
    async def pause_generation(request: Request):
        body = await _parse(request, PauseBody)
        if body.mode != "abort":
            raise BadRequest(f"pause_generation: only mode 'abort' is supported, got {body.mode!r}")
        n = await _wait(engine.pause(), "pause_generation")
        return _json({"success": True, "message": f"paused; {n} running requests aborted"})

    @app.post("/continue_generation")
    async def continue_generation():
        await _wait(engine.resume(), "continue_generation")
        return _json({"success": True, "message": "continued"})

    @app.post("/update_weights_from_disk", openapi_extra=_body_spec(UpdateWeightsBody))
    async def update_weights_from_disk(request: Request):
        body = await _parse(request, UpdateWeightsBody)
        if weights_root and not _inside(body.model_path, weights_root):
            update_refused["model_path"] += 1
            update_log.event(f"model_path {body.model_path[:300]!r} is outside the publish directory {weights_root}")
            return _error(
                400,
                f"model_path {body.model_path[:300]!r} is outside this run's publish directory "
                f"(GenerationServerConfig.weights_root)",
            )
        if body.weight_version is not None and body.weight_version < engine.weight_version:
            update_refused["weight_version"] += 1
            update_log.event(f"weight_version {body.weight_version} < served {engine.weight_version}")
            return _json(
                {
                    "success": False,
                    "weight_version": engine.weight_version,
                    "error": {
                        "message": f"weight_version {body.weight_version} is lower than the served "
                        f"version {engine.weight_version}; versions never go back",
                        "code": 409,
                    },
                },
                status=409,
            )
        try:
            version = await asyncio.to_thread(engine.update_weights, body.model_path, body.weight_version)
        except EngineClosedError:
            raise
        except Exception as e:  # any unloadable checkpoint (missing, corrupt, other shape) is the caller's
            logger.warning(f"update_weights_from_disk {body.model_path!r} failed: {e}")
            return _json({"success": False, "message": f"failed to load {body.model_path!r}: {e}"}, status=400)
        return _json(
            {
                "success": True,
                "message": f"loaded {body.model_path} as weight version {version}",
                "weight_version": version,
            }
        )

    @app.post("/abort_request", openapi_extra=_body_spec(AbortBody, required=False))
    async def abort_request(request: Request):
        body = await _parse(request, AbortBody)
        if body.abort_all:
            n = await _wait(engine.abort_all(), "abort_request")
            return _json({"success": True, "message": f"{n} requests aborted"})
        if not body.rid:
            return _error(400, "abort_request needs rid (or abort_all: true)")
        found = await _wait(engine.abort(body.rid), "abort_request")
        return _json({"success": bool(found), "message": "aborted" if found else f"no request with rid {body.rid!r}"})

    @app.get("/flush_cache", operation_id="flush_cache_get")
    @app.post("/flush_cache", operation_id="flush_cache_post")
    async def flush_cache():
        await _wait(engine.flush_cache(), "flush_cache")
        return _json({"success": True, "message": "cache flushed"})

    @app.get("/health")
    async def health():
        if not engine.is_alive():
            return _error(503, "engine thread is not running")
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        return await health()

    @app.get("/v1/models")
    async def models():
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": model_name,
                        "object": "model",
                        "created": int(started),
                        "owned_by": "realhf",
                        "root": engine.model_path,
                        "max_model_len": engine.context_len,
                    }
                ],
            }
        )

    @app.get("/get_model_info")
    async def model_info():
        return _json(
            {
                "model_path": engine.model_path,
                "tokenizer_path": None,
                "is_generation": True,
                "weight_version": engine.weight_version,
            }
        )

    @app.get("/metrics")
    async def metrics():
        extra = "".join(
            [f'realhf_http_auth_refused_total{{reason="{k}"}} {v}\n' for k, v in auth_refused.as_dict().items()]
            + [f'realhf_weight_update_refused_total{{field="{k}"}} {v}\n' for k, v in update_refused.items()]
        )
        return Response(generate_latest(metrics_registry) + extra.encode(), media_type=PROMETHEUS_CONTENT_TYPE)

    return app
