"""The `GenerationClient` interface over an engine running in this process: what an agent's `gen`
generates through when the evaluator runs episodes (realhf.system.evaluator.task_eval) — no HTTP, no
manager, one engine request per `generate` call.

    client = EngineGenerationClient(engine, answer_timeout=600)
    result = await client.generate(qid, input_ids, gconfig)      # a GenerationResult

The rollout workers' client resubmits a request the server aborted (a weight update paused it);
here nothing updates the weights during a call (the evaluator swaps them between evaluations),
so an abort means the engine is stopping, and ends the call with `GenerationInterrupted`. That
and an answer slower than `answer_timeout` are the engine's failure, not the episode's: the
client keeps the first one in `.broken`, so the evaluation fails with it rather than counting
the episodes it ended as the agent's failures.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Optional, Sequence

from realhf.impl.inference.request import EngineClosedError, GenerateRequest, SamplingParams
from realhf.system.rollout.generation_client import GenerationResult, sampling_params

if TYPE_CHECKING:  # the engine module imports torch; this one is imported where torch is not needed
    from realhf.impl.inference.engine import Engine


class GenerationInterrupted(RuntimeError):
    """The engine stopped (or was paused with abort) before the answer was complete."""


class EngineGenerationClient:
    def __init__(self, engine: "Engine", answer_timeout: Optional[float] = None):
        self.engine = engine
        self.answer_timeout = answer_timeout
        self.broken: Optional[BaseException] = None  # the engine's first failure (see the module docstring)
        self.n_generate_calls = 0

    def forget(self, qid: str) -> None:
        """Nothing is kept per group here (the rollout worker's client keeps a route)."""

    async def generate(
        self,
        qid: str,
        input_ids: Sequence[int],
        gconfig: Any,
        group_size: int = 1,
        max_new_tokens: Optional[int] = None,
    ) -> GenerationResult:
        """One answer to `input_ids`: `max_new_tokens` (default `gconfig.max_new_tokens`) at most."""
        budget = int(gconfig.max_new_tokens if max_new_tokens is None else max_new_tokens)
        sampling = SamplingParams(**sampling_params(gconfig, budget))  # as over HTTP; the engine adds EOS
        request = GenerateRequest([int(t) for t in input_ids], sampling)
        self.n_generate_calls += 1
        try:
            future = self.engine.submit(request)
        except EngineClosedError as e:
            raise self._broke(GenerationInterrupted(f"qid {qid!r}: {e}")) from None
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), self.answer_timeout)
        except asyncio.TimeoutError:
            self._abort(request.rid)
            raise self._broke(
                TimeoutError(
                    f"qid {qid!r}: an answer from the in-process engine took longer than {self.answer_timeout:g}s"
                )
            ) from None
        except asyncio.CancelledError:  # the episode was cancelled (its timeout): free the slot
            self._abort(request.rid)
            raise
        except EngineClosedError as e:
            raise self._broke(GenerationInterrupted(f"qid {qid!r}: {e}")) from None
        finish = result.finish_reason.get("type")
        if finish == "abort":
            raise self._broke(
                GenerationInterrupted(f"qid {qid!r}: answer aborted: {result.finish_reason.get('message', '')}")
            )
        n = len(result.output_ids)
        return GenerationResult(
            output_ids=list(result.output_ids),
            logprobs=list(result.output_logprobs),
            versions=[result.weight_version] * n,
            finish_reason="stop" if finish == "stop" else "length",
            n_requests=1,
        )

    def _broke(self, error: BaseException) -> BaseException:
        if self.broken is None:
            self.broken = error
        return error

    def _abort(self, rid: str) -> None:
        try:
            self.engine.abort(rid)
        except EngineClosedError:
            pass
