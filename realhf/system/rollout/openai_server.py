"""An OpenAI-compatible endpoint per episode, so agent code written for the `openai` client runs
as a realhf episode.

    server = await OpenAIServer.for_this_loop()             # one per rollout worker, on loopback
    with server.episode(gen, tokenizer) as (base_url, api_key):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        await client.chat.completions.create(model="realhf", messages=[...])

Each episode gets its own path and key (a random token: the key must match the path's token).
`POST {base_url}/chat/completions` generates through the episode's `Gen` — admission, routing,
weight versions and partial rollouts as for any episode; every token, log-prob and version is
recorded in the episode's sample (`chat_episode.py` keeps the conversation at the token level).
`POST {base_url}/completions` takes a prompt text (the first request's starts the episode, a
later one must begin with everything so far). `GET {base_url}/models` lists one model. Not
supported (400): n > 1, streaming, stop strings, logprobs requests. Tool calls in the Hermes
format come back as OpenAI `tool_calls`.

The server is aiohttp in the rollout worker's event loop, bound to 127.0.0.1 on a free port: only
code in the same worker calls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
import uuid
import weakref
from typing import Any, Dict, Iterator, Optional, Tuple

from aiohttp import web

from realhf.system.rollout.chat_episode import ChatEpisode, ConversationError
from realhf.system.rollout.episode import AgentError, Gen

MODEL_NAME = "realhf"
# event loop -> the task starting (then holding) its server; concurrent first episodes share it
_SERVERS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task]" = weakref.WeakKeyDictionary()


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _sampling(body: Dict[str, Any]) -> Dict[str, Any]:
    """The request's sampling fields as `Gen` options; ValueError for what is not supported."""
    if body.get("stream"):
        raise ValueError("stream=true is not supported")
    if int(body.get("n", 1) or 1) != 1:
        raise ValueError("n must be 1 (a group is made of separate episodes)")
    if body.get("stop"):
        raise ValueError("stop strings are not supported; the model stops at its EOS token")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise ValueError("logprobs are recorded by realhf for training, not returned")
    out: Dict[str, Any] = {}
    for field in ("temperature", "top_p"):
        if body.get(field) is not None:
            out[field] = float(body[field])
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_new_tokens"] = int(limit)
    return out


class OpenAIServer:
    def __init__(self):
        self._episodes: Dict[str, ChatEpisode] = {}
        self._runner: Optional[web.AppRunner] = None
        self.port = 0

    @classmethod
    async def for_this_loop(cls) -> "OpenAIServer":
        loop = asyncio.get_running_loop()
        if loop not in _SERVERS:
            _SERVERS[loop] = loop.create_task(cls()._started())
        return await asyncio.shield(_SERVERS[loop])

    @staticmethod
    async def close_for_this_loop() -> None:
        """At the worker's exit: stop this loop's server, if an episode started one."""
        task = _SERVERS.get(asyncio.get_running_loop())
        if task is not None and task.done() and not task.cancelled() and task.exception() is None:
            await task.result().close()

    async def _started(self) -> "OpenAIServer":
        await self.start()
        return self

    async def start(self, host: str = "127.0.0.1") -> None:
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_post("/episodes/{token}/v1/chat/completions", self._chat)
        app.router.add_post("/episodes/{token}/v1/completions", self._completions)
        app.router.add_get("/episodes/{token}/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.create_server((host, 0))  # our own socket: its port is known without asking aiohttp
        await web.SockSite(self._runner, sock).start()
        self.host, self.port = host, sock.getsockname()[1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for loop, task in list(_SERVERS.items()):
            if task.done() and not task.cancelled() and task.exception() is None and task.result() is self:
                del _SERVERS[loop]

    @contextlib.contextmanager
    def episode(self, gen: Gen, tokenizer: Any) -> Iterator[Tuple[str, str]]:
        """Serve `gen` while the block runs; yields (base_url, api_key)."""
        token = secrets.token_hex(16)
        self._episodes[token] = ChatEpisode(gen, tokenizer)
        try:
            yield f"http://{self.host}:{self.port}/episodes/{token}/v1", token
        finally:
            self._episodes.pop(token, None)

    # ---- handlers ---------------------------------------------------------------------------
    def _find(self, request: web.Request) -> Tuple[Optional[ChatEpisode], Optional[web.Response]]:
        token = request.match_info["token"]
        episode = self._episodes.get(token)
        if episode is None:
            return None, _error(404, "no such episode (it ended, or the URL is wrong)", "not_found_error")
        if request.headers.get("Authorization", "") != f"Bearer {token}":
            return None, _error(401, "the API key must be the episode's key", "authentication_error")
        return episode, None

    async def _body(self, request: web.Request) -> Dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise ValueError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    async def _chat(self, request: web.Request) -> web.Response:
        episode, refused = self._find(request)
        if refused is not None:
            return refused
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise ValueError("messages must be a list of message objects")
            completion, reply, finish = await episode.complete(messages, body.get("tools"), **_sampling(body))
        except (ValueError, ConversationError, AgentError) as e:
            return _error(400, str(e))
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL_NAME,
                "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
                "usage": self._usage(completion),
            }
        )

    async def _completions(self, request: web.Request) -> web.Response:
        episode, refused = self._find(request)
        if refused is not None:
            return refused
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError("prompt must be one string")
            gen, tok = episode.gen, episode.tokenizer
            if episode.n_requests == 0:
                gen.set_prompt(tok(prompt, add_special_tokens=False)["input_ids"])
            else:
                so_far = tok.decode(gen.ids)
                if not prompt.startswith(so_far):
                    raise ConversationError(
                        "the prompt must begin with this episode's text so far (the earlier prompt and completion)"
                    )
                if prompt[len(so_far) :]:
                    gen.append(prompt[len(so_far) :])
            completion = await gen(**_sampling(body))
            episode.n_requests += 1
        except (ValueError, ConversationError, AgentError) as e:
            return _error(400, str(e))
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex[:24]}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL_NAME,
                "choices": [
                    {
                        "index": 0,
                        "text": completion.text,
                        "finish_reason": "length" if completion.no_eos else "stop",
                        "logprobs": None,
                    }
                ],
                "usage": self._usage(completion),
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        _, refused = self._find(request)
        if refused is not None:
            return refused
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "realhf"}]}
        )

    @staticmethod
    def _usage(completion) -> Dict[str, int]:
        n_in, n_out = len(completion.input_ids), len(completion.output_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


@contextlib.asynccontextmanager
async def episode_endpoint(gen: Gen, tokenizer: Any):
    """What the rollout worker hands each episode as `gen.openai_endpoint`: this event loop's
    server, serving `gen` while the block runs; yields (base_url, api_key)."""
    server = await OpenAIServer.for_this_loop()
    with server.episode(gen, tokenizer) as pair:
        yield pair
