"""SGLang's `/generate` request as native engine requests, and the engine's results as SGLang's answer.

The body is SGLang's `GenerateReqInput` (the fields this engine serves):

    text | input_ids     one prompt (a string / a list of ids) or a batch (a list of them)
    sampling_params      one dict for every prompt, or a list of one dict per prompt; `n` samples
                         per prompt (the same n for the whole batch, as SGLang requires)
    return_logprob, stream, rid (a string, or a list of one per prompt)

Stop strings (`sampling_params.stop`, needs the server's tokenizer) are matched on the decoded
tail of the output after every token (`StopStrings`); the answer ends at the token that completes
one, with finish_reason {"type": "stop", "matched": the string}, and its `text` is cut before the
string, as SGLang's detokenizer cuts it (a stop token is cut from the text too), unless
`no_stop_trim`. `output_ids` keep every generated token, as SGLang's do.

A request becomes len(batch) × n engine requests in SGLang's order, prompt-major: the n samples of
prompt 0, then those of prompt 1, ... The answer is one object for a single prompt with n == 1,
else a list in that order (SGLang's shapes). Each item: `text` (when the server has a tokenizer),
`output_ids`, `meta_info` {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens,
reasoning_tokens, num_retractions, weight_version (a string, as SGLang's), weight_versions (spans),
e2e_latency, output_token_logprobs and output_token_logprobs_length when asked}. A `sampling_params`
key SGLang does not know is refused (400), as SGLang refuses it.

Sample j of a prompt whose rid is R runs as rid `R` when n == 1, else `R-j`; the rid without a
suffix still names all n of them to /abort_request (`Plan.groups`).

Streaming (`stream: true`) follows SGLang's default (not `--incremental-streaming-output`): every
`data: {json}` event carries the output so far — cumulative `text`, `output_ids` and
`output_token_logprobs` — with `finish_reason` null until the item's last event; `index` names the
item in a batch; `data: [DONE]` ends the stream.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from realhf.base import logging
from realhf.impl.dataset import tokenizer_loading
from realhf.impl.inference.request import DEFAULT_MAX_NEW_TOKENS, GenerateRequest, GenerateResult, SamplingParams

logger = logging.getLogger("gen_server")

# Files any of which makes a model folder carry a tokenizer (HF's names).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Samples one /generate may ask for (len(batch) × n): a bound on the work one body can queue.
DEFAULT_MAX_SAMPLES_PER_REQUEST = 1024


class BadRequest(Exception):
    """The body cannot be served: HTTP 400 with this message (naming the field)."""


# Every field of SGLang's /generate (v0.5.23: GenerateReqInput and its sampling_params) is one of
# three kinds here, so that nothing a client asks for is silently ignored:
#   served   this engine does what SGLang does with it;
#   hint     it steers a multi-server deployment or its logs (routing, priorities, metrics): on
#            one server SGLang's answer is the same without it, so it is accepted;
#   refused  any value but the listed ones (SGLang's default, or one that means what this server
#            does anyway) is a 400 naming the field.
# A sampling_params key SGLang does not know is refused (400), as SGLang refuses it; an unknown
# top-level key is ignored, as SGLang ignores it (a top-level `n` included). Checked against the
# conformance fixtures (realhf/testing/sglang_conformance/fixtures.py) by
# tests/unit/testing/test_sglang_conformance.py.
SERVED_FIELDS = frozenset("text input_ids sampling_params return_logprob rid stream".split())
HINT_FIELDS = frozenset(
    (
        "log_metrics no_logs priority routing_key routed_dp_rank data_parallel_rank disagg_prefill_dp_rank "
        "decode_tp_size bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key conversation_id "
        "extra_key cache_salt kv_hints custom_labels http_worker_ipc"
    ).split()
)
_FALSE, _NONE = (False, None), (None,)
REFUSED_FIELDS = {  # field -> the values accepted (meaning what this server does anyway)
    "logprob_start_len": (None, -1),  # -1: log-probs of the output tokens only, as served
    "top_logprobs_num": (None, 0),
    "token_ids_logprob": _NONE,
    "return_text_in_logprobs": _FALSE,
    "return_hidden_states": _FALSE,
    "return_prompt_token_ids": _FALSE,
    "return_sampling_mask": _FALSE,
    "sampling_logprobs_mode": _NONE,
    "return_flat_raw_top_logprobs": _FALSE,
    "return_flat_raw_output_top_logprobs": _FALSE,
    "return_flat_raw_top_logprobs_b64": _FALSE,
    "return_routed_experts": _FALSE,
    "routed_experts_start_len": (0, None),
    "return_indexer_topk": _FALSE,
    "input_embeds": _NONE,
    "image_data": _NONE,
    "video_data": _NONE,
    "audio_data": _NONE,
    "mm_hashes": _NONE,
    "mm_content_hashes": _NONE,
    "use_audio_in_video": _FALSE,
    "video_config": _NONE,
    "modalities": _NONE,
    "images_config": _NONE,
    "watermark": _NONE,
    "session_id": _NONE,
    "session_params": _NONE,
    "lora_path": _NONE,
    "lora_id": _NONE,
    "custom_logit_processor": _NONE,
    "positional_embed_overrides": _NONE,
    "background": _FALSE,
    "require_reasoning": _FALSE,
    "max_thinking_tokens": _NONE,
}
SERVED_SAMPLING = frozenset(
    (
        "max_new_tokens min_new_tokens temperature top_p top_k stop_token_ids stop no_stop_trim ignore_eos "
        "skip_special_tokens n"
    ).split()
)
HINT_SAMPLING = frozenset(("stream_interval",))  # how often a stream sends: here, every token
REFUSED_SAMPLING = {
    "stop_regex": _NONE,
    "min_p": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "json_schema": _NONE,
    "regex": _NONE,
    "ebnf": _NONE,
    "structural_tag": _NONE,
    "spaces_between_special_tokens": (True, None),
    "logit_bias": ({}, None),
    "sampling_seed": _NONE,
    "custom_params": _NONE,
    "beam_width": _NONE,
    "watermark": _NONE,
    "choice": ([], None),
}
SGLANG_SAMPLING_PARAMS = SERVED_SAMPLING | HINT_SAMPLING | frozenset(REFUSED_SAMPLING)
INSTEAD = {"stop_regex": ", end on strings with stop"}
# Stop strings per request and their length: each is looked for in the decoded tail of the output
# after every token, so the work per token grows with both.
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 256


def _refused(data: Dict[str, Any], table: Dict[str, tuple], served: frozenset, prefix: str) -> None:
    for name, value in data.items():
        accepted = table.get(name)
        if accepted is not None and not any(value == a and type(value) is type(a) or value is a for a in accepted):
            raise ValueError(
                f"{prefix}{name}={value!r} is not supported by this server (it serves {', '.join(sorted(served))}); "
                f"leave it out (or send {accepted[0]!r}){INSTEAD.get(name, '')}, or use SGLang itself"
            )


class SamplingParamsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: Optional[List[int]] = None
    stop: Optional[Union[str, List[str]]] = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1

    @model_validator(mode="before")
    @classmethod
    def _known_to_sglang(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(k for k in data if k not in SGLANG_SAMPLING_PARAMS)
            if unknown:
                raise ValueError(
                    f"unknown sampling parameter(s) {unknown[:5]} (SGLang refuses them too); "
                    f"known: {', '.join(sorted(SGLANG_SAMPLING_PARAMS))}"
                )
            _refused(data, REFUSED_SAMPLING, SERVED_SAMPLING, "sampling_params.")
        return data


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _served_or_refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _refused(data, REFUSED_FIELDS, SERVED_FIELDS, "")
        return data

    input_ids: Optional[Union[List[int], List[List[int]]]] = None
    text: Optional[Union[str, List[str]]] = None
    sampling_params: Union[SamplingParamsBody, List[SamplingParamsBody]] = Field(default_factory=SamplingParamsBody)
    return_logprob: bool = False
    rid: Optional[Union[str, List[str]]] = None
    stream: bool = False


def load_tokenizer(path: str) -> Optional[Any]:
    """The HF tokenizer of a model folder, or None when the folder has none (then /generate takes
    input_ids only, like SGLang's --skip-tokenizer-init). One that is there but does not load is
    logged and left out: the server still serves input_ids."""
    if not path or not os.path.isdir(path) or not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None
    try:
        return tokenizer_loading.load_tokenizer(path)
    except Exception as e:
        logger.warning(f"the tokenizer in {path} does not load ({e!r}); /generate will take input_ids only")
        return None


@dataclass(frozen=True)
class TextOptions:
    """How a request's `text` is made from its output ids (SGLang's sampling_params of the same names)."""

    skip_special_tokens: bool = True
    no_stop_trim: bool = False  # keep the matched stop string (or stop token) at the end of the text


class StopStrings:
    """SGLang's stop strings of one request, as a GenerateRequest.stop_check: the first of
    `strings` found in the decoded tail of the output ends it, from min_new_tokens on (SGLang's
    order). The tail is long enough for any of them: a character takes at most 4 tokens (one per
    UTF-8 byte, byte-level BPE), and a token that decodes to nothing (a skipped special token)
    is rare enough that two more cover it."""

    def __init__(self, strings: List[str], tokenizer: Any, min_new_tokens: int, skip_special_tokens: bool):
        self.strings = strings
        self.tokenizer = tokenizer
        self.min_new_tokens = min_new_tokens
        self.skip_special_tokens = skip_special_tokens
        self.window = 4 * max(len(x) for x in strings) + 2

    def __call__(self, ids: List[int]) -> Optional[str]:
        if len(ids) < self.min_new_tokens:
            return None
        tail = self.tokenizer.decode(ids[-self.window :], skip_special_tokens=self.skip_special_tokens)
        for x in self.strings:
            if x in tail:
                return x
        return None


def _stop_strings(sp: SamplingParamsBody, tokenizer: Optional[Any], no_tokenizer_reason: str) -> Optional[StopStrings]:
    """The stop check of `sp.stop` (None without stop strings); BadRequest naming what is wrong."""
    if sp.stop in (None, "", []):  # SGLang's "no stop strings"
        return None
    strings = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop)
    if any(x == "" for x in strings):
        raise BadRequest("sampling_params.stop contains an empty string, which would end every answer at once")
    if len(strings) > MAX_STOP_STRINGS:
        raise BadRequest(f"sampling_params.stop has {len(strings)} strings; at most {MAX_STOP_STRINGS}")
    longest = max(len(x) for x in strings)
    if longest > MAX_STOP_STRING_CHARS:
        raise BadRequest(f"sampling_params.stop has a string of {longest} characters; at most {MAX_STOP_STRING_CHARS}")
    if tokenizer is None:
        raise BadRequest(
            f"sampling_params.stop (stop strings) needs a tokenizer and {no_tokenizer_reason}: "
            "end on token ids with stop_token_ids"
        )
    return StopStrings(strings, tokenizer, sp.min_new_tokens, sp.skip_special_tokens)


@dataclass
class Plan:
    """What one /generate body asks the engine for."""

    requests: List[GenerateRequest]  # prompt-major: the n samples of prompt 0, then of prompt 1, ...
    text_options: List["TextOptions"]  # per request, for its `text`
    is_list: bool  # the answer is a list (a batch, or n > 1), as SGLang answers
    groups: Dict[str, List[str]] = field(default_factory=dict)  # a prompt's rid -> its n samples' rids


def _prompts(body: GenerateBody, tokenizer: Optional[Any], no_tokenizer_reason: str) -> tuple:
    """(prompts as id lists, whether the body was a batch)."""
    if body.text is not None and body.input_ids is not None:
        raise BadRequest("give either text or input_ids, not both")
    if body.text is not None:
        if tokenizer is None:
            raise BadRequest(f"text needs a tokenizer and {no_tokenizer_reason}: send input_ids")
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        if not texts:
            raise BadRequest("text is an empty batch: give at least one prompt")
        return [list(tokenizer.encode(t)) for t in texts], not isinstance(body.text, str)
    if body.input_ids is None:
        raise BadRequest("input_ids (or text) is required")
    ids = body.input_ids
    if ids and isinstance(ids[0], list):
        return [list(p) for p in ids], True
    return [list(ids)], False


def plan_generate(
    body: GenerateBody,
    tokenizer: Optional[Any] = None,
    no_tokenizer_reason: str = "this server has none",
    max_samples: int = DEFAULT_MAX_SAMPLES_PER_REQUEST,
) -> Plan:
    """The engine requests of `body` (BadRequest naming the field when it cannot be served)."""
    prompts, batch = _prompts(body, tokenizer, no_tokenizer_reason)
    sps = body.sampling_params
    if isinstance(sps, list):
        if len(sps) != len(prompts):
            raise BadRequest(
                f"sampling_params is a list of {len(sps)}, but there are {len(prompts)} prompts: give one per prompt"
            )
    else:
        sps = [sps] * len(prompts)
    n = sps[0].n
    if any(sp.n != n for sp in sps):
        raise BadRequest(f"sampling_params.n must be the same for every prompt of a batch, got {[sp.n for sp in sps]}")
    if n < 1:
        raise BadRequest(f"sampling_params.n must be >= 1, got {n}")
    if len(prompts) * n > max_samples:
        raise BadRequest(
            f"{len(prompts)} prompts x sampling_params.n={n} = {len(prompts) * n} samples; at most {max_samples} "
            "per request: split the batch"
        )
    rids = body.rid
    if isinstance(rids, list):
        if len(rids) != len(prompts):
            raise BadRequest(f"rid is a list of {len(rids)}, but there are {len(prompts)} prompts: give one per prompt")
    elif rids and len(prompts) > 1:
        raise BadRequest("rid must be a list of one rid per prompt for a batch")
    else:
        rids = [rids or ""] * len(prompts)
    plan = Plan([], [], is_list=batch or n > 1)
    checks = {id(sp): _stop_strings(sp, tokenizer, no_tokenizer_reason) for sp in sps}
    for prompt, sp, rid in zip(prompts, sps, rids):
        sampling = SamplingParams(
            max_new_tokens=sp.max_new_tokens,
            min_new_tokens=sp.min_new_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop_token_ids=list(sp.stop_token_ids or []),
            ignore_eos=sp.ignore_eos,
        )
        sample_rids = [rid] if n == 1 else [f"{rid}-{j}" if rid else "" for j in range(n)]
        if rid and n > 1:
            plan.groups[rid] = sample_rids
        for sample_rid in sample_rids:
            plan.requests.append(
                GenerateRequest(input_ids=list(prompt), sampling=sampling, rid=sample_rid, stop_check=checks[id(sp)])
            )
            plan.text_options.append(TextOptions(sp.skip_special_tokens, sp.no_stop_trim))
    return plan


def answer_text(tokenizer: Any, ids: List[int], finish_reason: Dict[str, Any], opts: TextOptions) -> str:
    """An answer's `text` as SGLang's detokenizer makes it: without the stop token or the stop
    string (and what follows it in the last token) that ended it, unless no_stop_trim."""
    matched = finish_reason.get("matched") if finish_reason.get("type") == "stop" else None
    if opts.no_stop_trim or matched is None:
        return tokenizer.decode(ids, skip_special_tokens=opts.skip_special_tokens)
    if isinstance(matched, str):
        text = tokenizer.decode(ids, skip_special_tokens=opts.skip_special_tokens)
        pos = text.find(matched)
        return text[:pos] if pos >= 0 else text
    return tokenizer.decode(ids[:-1], skip_special_tokens=opts.skip_special_tokens)


def answer_item(
    result: GenerateResult, return_logprob: bool, tokenizer: Optional[Any], opts: TextOptions
) -> Dict[str, Any]:
    """One item of the answer: the result in SGLang's shape, with `text` when there is a tokenizer."""
    out = result.to_sglang(return_logprob)
    if tokenizer is not None:
        out = {"text": answer_text(tokenizer, result.output_ids, result.finish_reason, opts), **out}
    return out


def partial_item(
    rid: str,
    prompt_tokens: int,
    ids: List[int],
    logprobs: List[float],
    weight_version: int,
    return_logprob: bool,
    tokenizer: Optional[Any],
    opts: TextOptions,
) -> Dict[str, Any]:
    """A streamed item before its end: the output so far, finish_reason null."""
    meta: Dict[str, Any] = {
        "id": rid,
        "finish_reason": None,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "num_retractions": 0,
        "weight_version": str(weight_version),
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids)]
        meta["output_token_logprobs_length"] = len(ids)
    out: Dict[str, Any] = {"output_ids": list(ids), "meta_info": meta}
    if tokenizer is not None:
        out = {"text": tokenizer.decode(ids, skip_special_tokens=opts.skip_special_tokens), **out}
    return out
