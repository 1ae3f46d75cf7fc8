"""The SGLang HTTP protocol (docs/architecture.md §5) in front of a native `Engine`.

    POST /generate                  SGLang's GenerateReqInput: {text | input_ids (one or a batch),
                                    sampling_params (dict or list; n samples), return_logprob,
                                    stream, rid} (realhf.system.gen_server.sglang_generate)
    POST /pause_generation          running requests return now with finish_reason abort
    POST /continue_generation
    POST /update_weights_from_disk  {model_path, weight_version?} -> {success, message, num_paused_requests}
    POST /init_weights_update_group, /update_weights_from_distributed, /destroy_weights_update_group
                                    new weights broadcast by the trainer (realhf.impl.inference.weight_receiver)
    POST /abort_request             {rid} or {abort_all: true} -> 200, an empty body (SGLang's)
    GET  /health, /health_generate, /v1/models, /get_model_info, /get_server_info, /metrics;
         GET|POST /flush_cache
    GET  /openapi.json              the request bodies above as an OpenAPI spec

The JSON fields are re-declared here (importing sglang drags in torchvision). Unknown fields are
ignored, as SGLang ignores them, except in `sampling_params`, where SGLang refuses a key it does
not know and so does this server. Requests and answers are checked against SGLang's own shapes
(realhf.testing.sglang_conformance; docs/scaling.md). A body that does not validate — malformed
JSON, wrong types, an empty prompt, token ids out of the vocabulary, a prompt that does not fit
the context, text without a tokenizer — gets a 400 with `{"error": {"message": ...}}` naming the
field, never a 5xx. Weight versions are integers here and strings on the wire, as SGLang's
(`weight_version` of /generate's meta_info and of /get_model_info; /update_weights_from_disk takes
either form).

With a `secret`, every endpoint requires `Authorization: Bearer <secret>` (401 without, 403 with
a wrong one; realhf.base.secret). With a `weights_root` (a run's publish directory),
/update_weights_from_disk loads only from inside it (400 naming model_path); it never goes back to
a lower weight_version (409 naming weight_version; equal is allowed). Refusals of both kinds are
counted in /metrics (`realhf_http_auth_refused_total`, `realhf_weight_update_refused_total`).

The handlers stay thin: they validate, hand the request to the engine thread and await a future
that the engine resolves (`asyncio.wrap_future` → `call_soon_threadsafe`), so the event loop
never waits on the model. A client that disconnects has its requests aborted (slots freed), a
streaming one too (`stream: true`: server-sent events fed by the engine's per-token callback).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from realhf.base import logging
from realhf.base.body_limit import DEFAULT_MAX_REQUEST_BYTES, BodySizeLimit
from realhf.base.daemon_threads import DaemonThreads
from realhf.base.secret import RateLimitedLog, require_secret
from realhf.base.weight_group import WeightGroupError
from realhf.impl.inference.engine import Engine
from realhf.impl.inference.metrics import PROMETHEUS_CONTENT_TYPE, engine_registry
from realhf.impl.inference.request import EngineClosedError, EngineStepError, parse_weight_version
from realhf.impl.inference.weight_receiver import VersionWentBack, WeightReceiver, WeightSyncRefused
from realhf.system.gen_server.sglang_generate import (
    DEFAULT_MAX_SAMPLES_PER_REQUEST,
    BadRequest,
    GenerateBody,
    Plan,
    answer_item,
    partial_item,
    plan_generate,
)

logger = logging.getLogger("gen_server")

_COMMAND_TIMEOUT = 60.0  # seconds a pause/continue/abort may wait for the engine thread


# --------------------------------------------------------------------------------------------
# Request bodies (SGLang's field names)
# --------------------------------------------------------------------------------------------


class UpdateWeightsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: str
    weight_version: Optional[Union[int, str]] = None  # SGLang's is a string; this server's are integers
    load_format: Optional[str] = None


class InitGroupBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"  # SGLang's default; on a CPU server the sender must ask for gloo


class DistributedWeightsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    names: Optional[List[str]] = None
    dtypes: Optional[List[str]] = None
    shapes: Optional[List[List[int]]] = None
    name: Optional[str] = None  # older SGLang: one tensor per request
    dtype: Optional[str] = None
    shape: Optional[List[int]] = None
    group_name: str = "weight_update_group"
    flush_cache: bool = True  # no prefix cache here: nothing to flush
    abort_all_requests: bool = False
    weight_version: Optional[Union[int, str]] = None


class GroupNameBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    group_name: str = "weight_update_group"


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: str = "abort"  # SGLang also has "retract" and "in_place"


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: bool = False


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


async def _results_or_disconnect(request: Request, futs, engine: Engine, rids: List[str]):
    """The engine's results, or None once the client disconnected — then the requests are
    aborted so that their slots are freed instead of decoding answers nobody reads."""
    results = asyncio.gather(*(asyncio.wrap_future(f) for f in futs))
    # With the body read, the next ASGI message is `http.disconnect`, and only if the client goes.
    disconnect = asyncio.ensure_future(request.receive())
    try:
        done, _ = await asyncio.wait({results, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        _abort_quietly(engine, rids)
        raise
    finally:
        if not disconnect.done():
            disconnect.cancel()
    if results in done:
        return results.result()
    if disconnect.result().get("type") == "http.disconnect":
        _abort_quietly(engine, rids)
        results.cancel()
        await asyncio.gather(results, return_exceptions=True)
        return None
    return await results


class _AbortOnClose(StreamingResponse):
    """A streamed answer whose requests are aborted however the stream ends (the client went
    away, the task was cancelled); `on_close` aborts only those still unfinished."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _abort_quietly(engine: Engine, rids: List[str]) -> None:
    try:
        for rid in rids:
            engine.abort(rid)
    except EngineClosedError:
        pass


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


def _hf_identity(model_path: str) -> Tuple[Optional[str], Optional[List[str]]]:
    """(model_type, architectures) of the HF config in `model_path`, None where it does not say."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError, TypeError):
        return None, None
    if not isinstance(config, dict):
        return None, None
    model_type, arch = config.get("model_type"), config.get("architectures")
    return (
        model_type if isinstance(model_type, str) else None,
        list(arch) if isinstance(arch, list) and all(isinstance(a, str) for a in arch) else None,
    )


def _inside(path: str, root: str) -> bool:
    """`path` is `root` or below it once symlinks and `..` are resolved."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def _realhf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("realhf")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "unknown"


# A gloo wait cannot be interrupted, and asyncio.to_thread's threads are joined when the server
# stops: a rendezvous or receive stuck in a group its sender gave up on (a member died) would hold a
# stopping server for the group's whole timeout. The weight groups' calls run on these daemon
# threads instead (one pool per process, started as calls come); a stuck one returns at its timeout.
_GROUP_THREADS = DaemonThreads(16, name="weight-group")


async def _in_group_thread(call: Callable[[], Any]) -> Any:
    return await asyncio.wrap_future(_GROUP_THREADS.submit(call))


def create_app(
    engine: Engine,
    served_model_name: str = "",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    secret: str = "",
    weights_root: str = "",
    tokenizer: Optional[Any] = None,
    tokenizer_path: Optional[str] = None,
    max_samples_per_request: int = DEFAULT_MAX_SAMPLES_PER_REQUEST,
    weight_sync_timeout: float = 60.0,
) -> FastAPI:
    """`tokenizer` (e.g. `sglang_generate.load_tokenizer(model_path)`): /generate then takes
    `text` and answers with `text`; without one it takes input_ids only."""
    no_tokenizer_reason = f"this server has none (no tokenizer in {engine.model_path or 'its model folder'})"
    groups: Dict[str, List[str]] = {}  # the rid of a prompt asked for n > 1 samples -> the samples' rids
    # /openapi.json documents the request bodies (SGLang's server publishes one too); no docs UI.
    app = FastAPI(title="realhf native generation server", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    # Added last = outermost: an unauthenticated request is refused before its body is read.
    auth_refused = require_secret(app, secret, logger, "generation server")
    update_refused = {"model_path": 0, "weight_version": 0}
    update_log = RateLimitedLog(logger, "refused a weight update")
    model_name = served_model_name or engine.model_path or "model"
    receiver = WeightReceiver(engine, weight_sync_timeout)
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
            plan = plan_generate(body, tokenizer, no_tokenizer_reason, max_samples_per_request)
            events = _stream_events(plan) if body.stream else None  # (queue, post)
            futs = engine.submit_many(plan.requests)
        except (BadRequest, ValueError) as e:
            return _error(400, str(e))
        except EngineClosedError as e:
            return _error(503, str(e))
        groups.update(plan.groups)
        rids = [r.rid for r in plan.requests]
        if events is not None:
            return _stream_answer(plan, futs, events, body.return_logprob)
        try:
            results = await _results_or_disconnect(request, futs, engine, rids)
        finally:
            _forget_groups(plan)
        if results is None:
            return Response(status_code=499)  # nobody is listening any more
        items = [answer_item(r, body.return_logprob, tokenizer, opts) for r, opts in zip(results, plan.text_options)]
        return _json(items if plan.is_list else items[0])

    def _forget_groups(plan: Plan) -> None:
        for rid in plan.groups:
            groups.pop(rid, None)

    def _stream_events(plan: Plan) -> Tuple[asyncio.Queue, Callable[[tuple], None]]:
        """A queue that gets (i, token, logprob) for each token of request i as the engine samples
        it (the engine thread hands them to this loop), then (i, its future) when it ends."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def post(item):
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop is closed (server shutting down): nobody is listening
                pass

        for i, req in enumerate(plan.requests):
            req.on_token = lambda tok, lp, i=i: post((i, tok, lp))
        return events, post  # post: for the futures' done callbacks, added once they exist

    def _stream_answer(plan: Plan, futs, events_post, return_logprob: bool) -> StreamingResponse:
        reqs = plan.requests
        events, post = events_post
        for i, fut in enumerate(futs):
            # Called on the engine thread after the request's last on_token: the queue keeps that order.
            fut.add_done_callback(lambda f, i=i: post((i, f)))

        async def chunks():
            ids: List[List[int]] = [[] for _ in reqs]
            lps: List[List[float]] = [[] for _ in reqs]
            ended: Dict[int, Any] = {}  # i -> its future, once it resolved
            while len(ended) < len(reqs):
                # Everything the engine handed over meanwhile goes out as one event per item: the
                # token that ended an item arrives with its end, so its last event is the final one.
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                touched: Dict[int, None] = {}
                for event in batch:
                    i = event[0]
                    touched[i] = None
                    if len(event) == 3:
                        ids[i].append(event[1])
                        lps[i].append(event[2])
                    else:
                        ended[i] = event[1]
                for i in touched:
                    index = {"index": i} if plan.is_list else {}
                    if i in ended:
                        try:
                            result = ended[i].result()
                        except (EngineStepError, EngineClosedError) as e:
                            yield _sse({"error": {"message": str(e)}, **index})
                            continue
                        item = answer_item(result, return_logprob, tokenizer, plan.text_options[i])
                    else:
                        item = partial_item(
                            reqs[i].rid,
                            len(reqs[i].input_ids),
                            ids[i],
                            lps[i],
                            engine.weight_version,
                            return_logprob,
                            tokenizer,
                            plan.text_options[i],
                        )
                    yield _sse({**item, **index})
            yield b"data: [DONE]\n\n"

        def on_close():
            _forget_groups(plan)
            _abort_quietly(engine, [r.rid for r, f in zip(reqs, futs) if not f.done()])

        return _AbortOnClose(chunks(), on_close)

    @app.post("/pause_generation", openapi_extra=_body_spec(PauseBody, required=False))
    async def pause_generation(request: Request):
        body = await _parse(request, PauseBody)
        if body.mode != "abort":
            raise BadRequest(f"pause_generation: only mode 'abort' is supported, got {body.mode!r}")
        n = await _wait(engine.pause(), "pause_generation")
        return _json({"message": f"Generation paused; {n} running requests aborted.", "status": "ok"})  # SGLang's

    @app.post("/continue_generation")
    async def continue_generation():
        await _wait(engine.resume(), "continue_generation")
        return _json({"message": "Generation continued.", "status": "ok"})  # SGLang's

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
        wanted = parse_weight_version(body.weight_version)
        if body.weight_version is not None and wanted is None:
            raise BadRequest(
                f"weight_version must be an integer or its decimal string (this server orders versions), "
                f"got {str(body.weight_version)[:100]!r}"
            )
        if wanted is not None and wanted < engine.weight_version:
            update_refused["weight_version"] += 1
            update_log.event(f"weight_version {wanted} < served {engine.weight_version}")
            return _json(
                {
                    "success": False,
                    "weight_version": str(engine.weight_version),
                    "error": {
                        "message": f"weight_version {wanted} is lower than the served "
                        f"version {engine.weight_version}; versions never go back",
                        "code": 409,
                    },
                },
                status=409,
            )
        try:
            version = await asyncio.to_thread(engine.update_weights, body.model_path, wanted)
        except EngineClosedError:
            raise
        except Exception as e:  # any unloadable checkpoint (missing, corrupt, other shape) is the caller's
            logger.warning(f"update_weights_from_disk {body.model_path!r} failed: {e}")
            return _json(
                {"success": False, "message": f"failed to load {body.model_path!r}: {e}", "num_paused_requests": 0},
                status=400,
            )
        return _json(
            {
                "success": True,
                "message": f"loaded {body.model_path} as weight version {version}",
                "num_paused_requests": 0,  # SGLang's key; this engine pauses nothing to load
                "weight_version": str(version),  # realhf's own: the version now served
            }
        )

    @app.post("/init_weights_update_group", openapi_extra=_body_spec(InitGroupBody))
    async def init_weights_update_group(request: Request):
        body = await _parse(request, InitGroupBody)
        try:
            message = await _in_group_thread(
                lambda: receiver.init_group(
                    body.master_address,
                    body.master_port,
                    body.rank_offset,
                    body.world_size,
                    body.group_name,
                    body.backend,
                )
            )
        except (WeightSyncRefused, WeightGroupError) as e:
            return _json({"success": False, "message": str(e)}, status=400)
        return _json({"success": True, "message": message})

    @app.post("/update_weights_from_distributed", openapi_extra=_body_spec(DistributedWeightsBody))
    async def update_weights_from_distributed(request: Request):
        body = await _parse(request, DistributedWeightsBody)
        if body.names is None and body.name is not None:
            names, dtypes, shapes = [body.name], [body.dtype or ""], [body.shape or []]
        else:
            names, dtypes, shapes = body.names or [], body.dtypes or [], body.shapes or []
        wanted = parse_weight_version(body.weight_version)
        if body.weight_version is not None and wanted is None:
            raise BadRequest(
                f"weight_version must be an integer or its decimal string, got {str(body.weight_version)[:100]!r}"
            )
        if body.abort_all_requests:
            await _wait(engine.abort_all(), "abort_all_requests")
        try:
            version = await _in_group_thread(lambda: receiver.receive(names, dtypes, shapes, body.group_name, wanted))
        except VersionWentBack as e:
            update_refused["weight_version"] += 1
            update_log.event(str(e))
            return _json(
                {"success": False, "weight_version": str(engine.weight_version), "message": str(e)}, status=409
            )
        except (WeightSyncRefused, WeightGroupError, KeyError, ValueError) as e:
            logger.warning(f"update_weights_from_distributed failed: {e}")
            return _json({"success": False, "message": str(e)}, status=400)
        if version is None:
            return _json({"success": True, "message": f"received {len(names)} tensors (staged)"})
        return _json(
            {
                "success": True,
                "message": f"received {len(names)} tensors; serving weight version {version}",
                "weight_version": str(version),
            }
        )

    @app.post("/destroy_weights_update_group", openapi_extra=_body_spec(GroupNameBody, required=False))
    async def destroy_weights_update_group(request: Request):
        body = await _parse(request, GroupNameBody)
        if not await _in_group_thread(lambda: receiver.destroy(body.group_name)):
            # SGLang's answer to a group it does not hold
            return _json({"success": False, "message": f"weight group {body.group_name!r} was not joined"}, status=400)
        return _json({"success": True, "message": f"weight group {body.group_name!r} destroyed"})

    @app.post("/abort_request", openapi_extra=_body_spec(AbortBody, required=False))
    async def abort_request(request: Request):
        # SGLang answers 200 with an empty body whatever happened; the log says what did.
        body = await _parse(request, AbortBody)
        if body.abort_all:
            n = await _wait(engine.abort_all(), "abort_request")
            logger.info(f"abort_request: abort_all: {n} requests aborted")
            return Response(status_code=200)
        if not body.rid:
            logger.warning("abort_request without rid or abort_all: ignored (as SGLang does)")
            return Response(status_code=200)
        n = 0
        for rid in groups.get(body.rid, [body.rid]):  # a prompt's rid names all its n samples
            n += bool(await _wait(engine.abort(rid), "abort_request"))
        # Info: a client reads its stream behind the engine, so "no such request" is how it learns
        # the answer had already ended here (tests/system/engines/test_vllm_server.py reads it).
        said = f"{n} request(s) aborted" if n else "no such request queued or running (ended already, or never sent)"
        logger.info(f"abort_request {body.rid!r}: {said}")
        return Response(status_code=200)

    @app.get("/flush_cache", operation_id="flush_cache_get")
    @app.post("/flush_cache", operation_id="flush_cache_post")
    async def flush_cache():
        await _wait(engine.flush_cache(), "flush_cache")
        return Response("Cache flushed.\n", status_code=200)  # SGLang answers plain text

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
        # SGLang's keys, each one (realhf/testing/sglang_conformance/fixtures.py: MODEL_INFO)
        model_type, architectures = _hf_identity(engine.model_path)
        return _json(
            {
                "model_path": engine.model_path,
                "served_model_name": model_name,
                "tokenizer_path": (tokenizer_path or engine.model_path) if tokenizer is not None else None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": str(engine.weight_version),  # SGLang's is a string
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": model_type,
                "architectures": architectures,
            }
        )

    @app.get("/get_server_info")
    async def server_info():
        # SGLang answers its server arguments, its scheduler's limits, one internal state per DP
        # rank and its version; these are the keys its clients read (fixtures.py: SERVER_INFO).
        st = engine.stats()
        return _json(
            {
                "model_path": engine.model_path,
                "tokenizer_path": (tokenizer_path or engine.model_path) if tokenizer is not None else None,
                "served_model_name": model_name,
                "skip_tokenizer_init": tokenizer is None,
                "context_length": st.context_len,
                "max_running_requests": st.n_slots,
                "max_total_num_tokens": st.n_slots * st.context_len,
                "max_req_input_len": st.context_len - 1,
                "tp_size": 1,
                "dp_size": 1,
                "weight_version": str(engine.weight_version),
                "internal_states": [{"last_gen_throughput": st.gen_throughput}],  # running counts: /metrics
                "version": f"realhf-{_realhf_version()}",
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
