"""What an episode run by `realhf.testing` generates through: any object with the method the
rollout worker's `GenerationClient` has, which `Gen` (realhf.system.rollout.episode) calls,

    result = await model.generate(qid, input_ids, gconfig, group_size)   # -> GenerationResult

    InProcessModel   the native engine on a model directory, in this process (no HTTP)
    ServerModel      a running server's POST /generate: the built-in one or SGLang
    ScriptedModel    answers written in advance, for tests whose reward must not hang on sampling

Every wait has a timeout whose error names the model and the request. `name` says which model
an error is about, `waiting` counts the calls in flight (a timed-out episode reports them).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

import aiohttp

from realhf.system.rollout.generation_client import (
    GenerationResult,
    parse_generate_response,
    sampling_params,
    token_versions,
)
from realhf.system.streams.http_json import GenerationError, post_json, request_json

# The embedded models of a realhf checkout (assets/*/README.md), by the short names tests use.
EMBEDDED = {"tiny": "assets/tiny-math/sft", "tiny-tools": "assets/tiny-tools/sft"}
_REPO = Path(__file__).resolve().parents[2]


def model_dir(model: str) -> str:
    """The directory of `model`: an embedded name ('tiny', 'tiny-tools'), a local directory or a
    hub id (realhf.base.model_source)."""
    from realhf.base.model_source import resolve_model_path

    if model in EMBEDDED:
        path = _REPO / EMBEDDED[model]
        if not path.is_dir():
            raise FileNotFoundError(
                f"model={model!r} is {EMBEDDED[model]} of a realhf checkout, not found at {path} "
                "(an installed realhf has no assets); pass a model directory instead"
            )
        return str(path)
    return resolve_model_path("model", model)


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as is; a name `model_dir` knows, loaded."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from transformers import AutoTokenizer  # heavy: only when a tokenizer is loaded

    return AutoTokenizer.from_pretrained(model_dir(str(tokenizer)))


class InProcessModel:
    """The native engine (realhf.impl.inference) on `path`, started now, in this process: the
    sampler seeded with `seed`, `slots` requests decoded together (more wait their turn)."""

    def __init__(self, path: str, *, seed: int = 1, slots: int = 8, timeout: float = 60.0):
        import torch

        from realhf.impl.inference.factory import create_engine

        self.path, self.timeout, self.waiting = path, timeout, 0
        self.name = f"the in-process model {path}"
        threads = torch.get_num_threads()
        self.engine = create_engine(path, max_running_requests=slots, seed=seed, name="realhf.testing").start()
        # create_engine sets torch's thread count for a server process; this is the user's (the
        # engine thread sets its own).
        torch.set_num_threads(threads)

    async def generate(self, qid: str, input_ids: Sequence[int], gconfig: Any, group_size: int = 1):
        from realhf.impl.inference.request import GenerateRequest, SamplingParams

        sampling = SamplingParams(**sampling_params(gconfig, gconfig.max_new_tokens))
        try:
            future = self.engine.submit(GenerateRequest(list(input_ids), sampling))
        except ValueError as e:  # names the field: a prompt too long for the context, a bad temperature
            raise ValueError(f"{self.name}, qid {qid!r}: {e}") from None
        self.waiting += 1
        try:
            r = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"{self.name} gave no answer to qid {qid!r} ({len(input_ids)} input tokens) within "
                f"timeout={self.timeout:g}s"
            ) from None
        finally:
            self.waiting -= 1
        reason = r.finish_reason.get("type")
        if reason not in ("stop", "length"):
            raise GenerationError(f"{self.name}: qid {qid!r} ended with {r.finish_reason}")
        n = len(r.output_ids)
        return GenerationResult(list(r.output_ids), list(r.output_logprobs), [r.weight_version] * n, reason, 1)

    async def close(self) -> None:
        self.engine.stop()


class ServerModel:
    """POST `url`/generate (the SGLang protocol, docs/architecture.md §5), straight to one server:
    no manager. An answer aborted by a paused server (a weight update of a live run) is resubmitted
    with its tokens so far, as the rollout worker's client does. `eos_token_id` is a stop token
    of every request besides the server's own (run_episode sets it from the tokenizer)."""

    def __init__(self, url: str, *, timeout: float = 60.0, eos_token_id: Optional[int] = None):
        self.url, self.timeout, self.eos_token_id, self.waiting = url.rstrip("/"), timeout, eos_token_id, 0
        self.name = f"the server at {self.url}"
        self._session: Optional[aiohttp.ClientSession] = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def tokenizer_dir(self) -> str:
        """The tokenizer (else model) directory the server's /get_model_info names, if it is one on
        this machine (the built-in server names its model directory)."""
        info = await request_json(self._client(), "GET", f"{self.url}/get_model_info", self.timeout)
        paths = [info.get("tokenizer_path"), info.get("model_path")]
        for path in paths:
            if isinstance(path, str) and os.path.isdir(path):
                return path
        raise ValueError(
            f"{self.url}/get_model_info names no tokenizer directory on this machine (tokenizer_path, "
            f"model_path: {paths}); pass tokenizer= (a tokenizer or its directory)"
        )

    async def generate(self, qid: str, input_ids: Sequence[int], gconfig: Any, group_size: int = 1):
        out = GenerationResult()
        self.waiting += 1
        try:
            while True:
                n_done = len(out.output_ids)
                if n_done >= gconfig.max_new_tokens:  # aborted after its last token
                    out.finish_reason = "length"
                    return out
                body = {
                    "input_ids": [int(t) for t in input_ids] + out.output_ids,
                    "sampling_params": sampling_params(
                        gconfig, gconfig.max_new_tokens - n_done, self.eos_token_id, n_done
                    ),
                    "return_logprob": True,
                }
                answer = await post_json(self._client(), f"{self.url}/generate", body, self.timeout)
                ids, logprobs, reason, version = parse_generate_response(self.url, answer)
                out.n_requests += 1
                out.output_ids += ids
                out.logprobs += logprobs
                out.versions += token_versions(version, 0, len(ids))
                if reason != "abort":
                    out.finish_reason = reason
                    return out
                if not ids:
                    await asyncio.sleep(0.1)  # paused: the run's trainer is updating its weights
        finally:
            self.waiting -= 1

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class ScriptedModel:
    """Answers each generation call with the next of `answers` — a text (encoded with `tokenizer`,
    one of `load_tokenizer`'s) or token ids — as written, ending as at EOS (`max_new_tokens` does not
    cut it: a script says what the test means); log-prob 0 (a script is certain), weight version 0. `inputs` holds the text each call was given, for
    assertions on what the agent showed the model."""

    def __init__(self, answers: Sequence[Union[str, Sequence[int]]], tokenizer: Any = "tiny"):
        self.answers = list(answers)
        self.tokenizer = load_tokenizer(tokenizer)
        self.inputs: List[str] = []
        self.name = f"the scripted model ({len(self.answers)} answers)"

    async def generate(self, qid: str, input_ids: Sequence[int], gconfig: Any, group_size: int = 1):
        self.inputs.append(self.tokenizer.decode(list(input_ids)))
        if not self.answers:
            raise ValueError(f"{self.name}: generation call {len(self.inputs)} (qid {qid!r}) has no answer left")
        answer = self.answers.pop(0)
        if isinstance(answer, str):
            ids = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
        else:
            ids = [int(t) for t in answer]
        return GenerationResult(ids, [0.0] * len(ids), [0] * len(ids), "stop", 1)
