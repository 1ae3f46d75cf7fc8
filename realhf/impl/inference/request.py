"""What a caller asks the native engine for and what it gets back, and the check of a request.

`GenerateRequest` (prompt token ids + `SamplingParams`) goes in, `GenerateResult` (token ids,
per-token log-probs, SGLang's `finish_reason`, the weight version that produced it) comes out;
`check_request` says, naming the field, why a request cannot be served. The HTTP layer
(`realhf.system.gen_server.server_app`) maps SGLang's JSON onto these types; nothing here knows
about threads, tensors or the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = -1  # -1: off
    min_new_tokens: int = 0  # stop tokens are masked out until this many tokens exist
    stop_token_ids: List[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenerateRequest:
    input_ids: List[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str = ""
    # Streaming: called on the engine thread with (token id, log-prob) of every generated token
    # as it is generated, except the one that ends the request, which comes with its result (so a
    # stream's last event carries the last token and the finish reason together, as SGLang's
    # does); it must only hand them over (e.g. loop.call_soon_threadsafe).
    on_token: Optional[Callable[[int, float], None]] = None
    # Stop strings (or any rule on the text so far): called on the engine thread with the output
    # ids after each generated token; a string it returns ends the request at that token with
    # finish_reason {"type": "stop", "matched": the string}, as SGLang's stop strings do. A token
    # that also reaches max_new_tokens ends with `length` (SGLang checks the length first).
    stop_check: Optional[Callable[[List[int]], Optional[str]]] = None

    @property
    def watched(self) -> bool:
        """Whether the engine must look at each of its tokens on the host as they come."""
        return self.on_token is not None or self.stop_check is not None


@dataclass
class GenerateResult:
    rid: str
    output_ids: List[int]
    output_logprobs: List[float]
    finish_reason: Dict[str, Any]  # {"type": "stop"|"length"|"abort", ...} as SGLang
    prompt_tokens: int
    weight_version: int
    e2e_latency: float
    # [(first output token index, version), ...] when the weights changed during the request
    # (an engine that keeps running requests across a swap); None: all from `weight_version`
    weight_version_changes: Optional[List[Tuple[int, int]]] = None

    def to_sglang(self, return_logprob: bool = True) -> Dict[str, Any]:
        """The `/generate` response body of docs/architecture.md §5: SGLang's keys, each one
        (realhf/testing/sglang_conformance/fixtures.py: META_INFO)."""
        n = len(self.output_ids)
        meta: Dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": 0,
            "reasoning_tokens": 0,
            "num_retractions": 0,  # SGLang's count of preemptions; this engine never retracts
            "weight_version": str(self.weight_version),  # SGLang's is a string
            "weight_versions": weight_version_spans(self.weight_version_changes or [(0, self.weight_version)], n),
            "e2e_latency": self.e2e_latency,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(self.output_logprobs, self.output_ids)]
            meta["output_token_logprobs_length"] = n
        return {"output_ids": self.output_ids, "meta_info": meta}


def weight_version_spans(marks: List[Tuple[int, int]], n_tokens: int) -> List[Dict[str, Any]]:
    """SGLang's `meta_info.weight_versions`: [{version, start, end}] spans tiling the `n_tokens`
    output tokens, from (first token index, version) marks (the first at 0)."""
    starts = [i for i, _ in marks]
    ends = starts[1:] + [n_tokens]
    return [{"version": str(v), "start": i, "end": end} for (i, v), end in zip(marks, ends)]


def parse_weight_version(value: Any) -> Optional[int]:
    """A weight version as this project counts them (an integer) from what a server reports:
    SGLang's string ("3"), an integer (older realhf servers), or None when it is neither (SGLang's
    default version is the name "default")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        return int(value)
    return None


def abort_reason(message: str) -> Dict[str, Any]:
    """SGLang's finish_reason of a request that was ended early (its keys, every one)."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def check_new_rids(rids: List[str], live) -> None:
    """ValueError naming the first of `rids` that is already in `live` or given twice."""
    seen: set = set()
    for rid in rids:  # one pass: a large submit_many (an evaluation's 100k requests) stays linear
        if rid in live or rid in seen:
            raise ValueError(f"rid {rid!r} is already queued or running")
        seen.add(rid)


class EngineClosedError(RuntimeError):
    """The engine was stopped or its thread died: nothing more will be served (HTTP 503)."""


class EngineStepError(RuntimeError):
    """A step of the engine raised: the requests in it failed, the engine serves on (HTTP 500)."""


# The documented ranges of the sampling parameters (docs/architecture.md §5.1). Values outside
# them are refused before the engine thread sees them: a temperature below 1e-4 makes logits / T
# overflow float32, a top_k beyond int64 cannot be stored in the slot tensors (either used to kill
# the engine thread), and the stop table of every running request is as wide as the widest list.
TEMPERATURE_RANGE = (1e-4, 100.0)
MAX_TOP_K = 2**31 - 1  # larger than any vocabulary: the same as -1
MAX_STOP_TOKEN_IDS = 256


def check_request(req: GenerateRequest, vocab_size: int, context_len: int) -> Optional[str]:
    """Why a request cannot be served (a message naming the field), or None."""
    s = req.sampling
    if not req.input_ids:
        return "input_ids is empty: at least one prompt token is needed"
    bad = [t for t in req.input_ids if not 0 <= t < vocab_size]
    if bad:
        return f"input_ids contains token ids outside [0, {vocab_size}): {bad[:5]}"
    if s.max_new_tokens < 0:
        return f"sampling_params.max_new_tokens must be >= 0, got {s.max_new_tokens}"
    if len(req.input_ids) + s.max_new_tokens > context_len:
        return (
            f"prompt ({len(req.input_ids)} tokens) + sampling_params.max_new_tokens ({s.max_new_tokens}) "
            f"exceeds the context length {context_len}"
        )
    if s.min_new_tokens < 0 or s.min_new_tokens > max(s.max_new_tokens, 0):
        return f"sampling_params.min_new_tokens must be in [0, max_new_tokens], got {s.min_new_tokens}"
    lo, hi = TEMPERATURE_RANGE  # also refuses NaN and infinities: every comparison with NaN is False
    if not (s.temperature == 0 or lo <= s.temperature <= hi):
        return f"sampling_params.temperature must be 0 (greedy) or in [{lo}, {hi}], got {s.temperature}"
    if not 0 < s.top_p <= 1:
        return f"sampling_params.top_p must be in (0, 1], got {s.top_p}"
    if not (s.top_k == -1 or 1 <= s.top_k <= MAX_TOP_K):
        return f"sampling_params.top_k must be -1 (off) or in [1, {MAX_TOP_K}], got {s.top_k}"
    if len(s.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        return (
            f"sampling_params.stop_token_ids has {len(s.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS} "
            "(every running request's stop table is as wide as the widest one)"
        )
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        return f"sampling_params.stop_token_ids contains ids outside [0, {vocab_size}): {bad[:5]}"
    return None
