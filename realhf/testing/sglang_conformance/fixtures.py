"""The SGLang endpoints realhf uses, as SGLang itself defines them: request and answer shapes and
worked examples, written down (in this project's words and format) from SGLang's own source for
the release named in `SGLANG`. Data only: `schema.py` checks values against these shapes,
`suite.py` sends the examples to a server.

What realhf sends and reads (every one of its clients is tested against these shapes:
tests/unit/testing/test_sglang_conformance.py):

    POST /generate                         the rollout client, ServerModel (input_ids, return_logprob)
    POST /pause_generation, /continue_generation      the manager's disk updates, the broadcaster
    POST /update_weights_from_disk         the manager (realhf.system.manager.weight_update)
    POST /init_weights_update_group, /update_weights_from_distributed,
         /destroy_weights_update_group     the trainer's broadcaster (realhf.system.trainer.weight_broadcast)
    POST /abort_request, GET|POST /flush_cache   served by the built-in server (SGLang's protocol)
    GET  /get_model_info                   the manager, the config check of gen_server.urls, ServerModel
    GET  /health                           the manager, the launchers, the stall report

Facts that matter to a client (each one a shape below):
- SGLang refuses a `sampling_params` key it does not know (400); other request bodies ignore
  unknown keys. A weight version is a string on the wire: `weight_version: 3` (an integer) in a
  weight update body is refused with 400 ("Input should be a valid string").
- A finished /generate item always carries `meta_info.weight_versions`, spans
  [{version, start, end}] that say which weight version produced which output tokens (a request
  that ran across a weight update that did not abort it has several).
- /abort_request answers 200 with an empty body; /flush_cache answers plain text; /health an
  empty body; /pause_generation and /continue_generation `{"message", "status": "ok"}`.
"""

from __future__ import annotations

from typing import Any, Dict, List

from realhf.testing.sglang_conformance.schema import (
    ANY,
    BOOL,
    INT,
    NULL,
    NUMBER,
    STR,
    any_of,
    enum,
    field,
    list_of,
    nullable,
    obj,
    pattern,
    tuple_of,
    with_fields,
)

# Where these facts come from. The release's wheel was read (the git snapshot of the repository
# is too large to bring here); the wheel does not record its commit (its sglang/_version.py says
# commit_id = None), so the artifact's hash names the exact source instead.
SGLANG: Dict[str, Any] = {
    "release": "v0.5.23",
    "package": "sglang==0.5.23",
    "artifact": "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    "artifact_sha256": "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    "commit": None,
    "read_from": [
        "sglang/srt/entrypoints/http_server.py (the handlers: status codes and answer bodies)",
        "sglang/srt/managers/io_struct.py (GenerateReqInput and the *ReqInput request structs)",
        "sglang/api/v1/api_types.py (the /generate JSON contract: SamplingParams, GenerateMetaInfo, ...)",
        "sglang/srt/managers/tokenizer_manager.py (how /generate's meta_info is built)",
        "sglang/srt/managers/schedule_batch.py (finish reasons as JSON)",
        "sglang/srt/utils/weight_versions.py (meta_info.weight_versions spans)",
        "sglang/srt/sampling/sampling_params.py (top_k = -1: the whole vocabulary)",
    ],
}

# ---- /generate --------------------------------------------------------------------------------

TOKEN_IDS = list_of(INT)
STR_OR_LIST = any_of(STR, list_of(STR))
BOOL_OR_LIST = any_of(BOOL, list_of(BOOL))
INT_OR_LIST = any_of(INT, list_of(INT))
OPT_STR_OR_LIST = any_of(STR, NULL, list_of(nullable(STR)))
OPT_INT_OR_LIST = any_of(INT, NULL, list_of(nullable(INT)))

SAMPLING_PARAMS = obj(
    {
        "max_new_tokens": field(nullable(INT), default=128),
        "stop": field(nullable(STR_OR_LIST), default=None, doc="stop strings"),
        "stop_token_ids": field(nullable(list_of(INT)), default=None),
        "stop_regex": field(nullable(STR_OR_LIST), default=None),
        "temperature": field(nullable(NUMBER), default=1.0, doc="0: greedy"),
        "top_p": field(nullable(NUMBER), default=1.0),
        "top_k": field(nullable(INT), default=1 << 30, doc="-1 (or 2^30): the whole vocabulary"),
        "min_p": field(nullable(NUMBER), default=0.0),
        "frequency_penalty": field(nullable(NUMBER), default=0.0),
        "presence_penalty": field(nullable(NUMBER), default=0.0),
        "repetition_penalty": field(nullable(NUMBER), default=1.0),
        "min_new_tokens": field(nullable(INT), default=0),
        "n": field(nullable(INT), default=1, doc="samples per prompt; the answer is then a list"),
        "json_schema": field(nullable(STR), default=None),
        "regex": field(nullable(STR), default=None),
        "ebnf": field(nullable(STR), default=None),
        "structural_tag": field(nullable(STR), default=None),
        "ignore_eos": field(nullable(BOOL), default=False),
        "skip_special_tokens": field(nullable(BOOL), default=True),
        "spaces_between_special_tokens": field(nullable(BOOL), default=True),
        "no_stop_trim": field(nullable(BOOL), default=False),
        "stream_interval": field(nullable(INT), default=None),
        "logit_bias": field(nullable(obj({})), default={}, doc="token id (a string) -> bias"),
        "sampling_seed": field(nullable(INT), default=None),
        "custom_params": field(ANY, default=None),
        "beam_width": field(nullable(INT), default=None),
        "watermark": field(
            nullable(obj({"enabled": field(ANY), "key": field(ANY), "context_window": field(ANY)})), default=None
        ),
        "choice": field(nullable(list_of(STR)), default=[]),
    },
    unknown="refuse",  # 400: "unknown field `x`, expected one of ..."
)

GENERATE_REQUEST = obj(
    {
        "rid": field(nullable(STR_OR_LIST), default=None, doc="one per prompt in a batch"),
        "text": field(nullable(STR_OR_LIST), default=None, doc="needs the server's tokenizer"),
        "input_ids": field(nullable(any_of(TOKEN_IDS, list_of(TOKEN_IDS))), default=None),
        "input_embeds": field(ANY, default=None),
        "stream": field(nullable(BOOL), default=False),
        "sampling_params": field(nullable(any_of(SAMPLING_PARAMS, list_of(SAMPLING_PARAMS))), default=None),
        "return_logprob": field(nullable(BOOL_OR_LIST), default=None),
        "logprob_start_len": field(nullable(INT_OR_LIST), default=None, doc="-1: output tokens only"),
        "top_logprobs_num": field(nullable(INT_OR_LIST), default=None),
        "token_ids_logprob": field(nullable(any_of(TOKEN_IDS, list_of(TOKEN_IDS))), default=None),
        "return_text_in_logprobs": field(nullable(BOOL), default=False),
        "return_hidden_states": field(ANY, default=False),
        "return_prompt_token_ids": field(BOOL, default=False),
        "return_sampling_mask": field(nullable(BOOL_OR_LIST), default=None),
        "sampling_logprobs_mode": field(ANY, default=None),
        "return_flat_raw_top_logprobs": field(BOOL, default=False),
        "return_flat_raw_output_top_logprobs": field(BOOL, default=False),
        "return_flat_raw_top_logprobs_b64": field(BOOL, default=False),
        "return_routed_experts": field(BOOL, default=False),
        "routed_experts_start_len": field(INT, default=0),
        "return_indexer_topk": field(BOOL, default=False),
        "log_metrics": field(BOOL, default=True),
        "image_data": field(ANY, default=None),
        "video_data": field(ANY, default=None),
        "audio_data": field(ANY, default=None),
        "mm_hashes": field(ANY, default=None),
        "mm_content_hashes": field(ANY, default=None),
        "use_audio_in_video": field(BOOL, default=False),
        "video_config": field(ANY, default=None),
        "modalities": field(nullable(list_of(nullable(STR))), default=None),
        "images_config": field(ANY, default=None),
        "watermark": field(ANY, default=None),
        "session_id": field(nullable(STR), default=None),
        "session_params": field(ANY, default=None),
        "lora_path": field(OPT_STR_OR_LIST, default=None),
        "lora_id": field(OPT_STR_OR_LIST, default=None),
        "custom_logit_processor": field(OPT_STR_OR_LIST, default=None),
        "positional_embed_overrides": field(ANY, default=None),
        "bootstrap_host": field(OPT_STR_OR_LIST, default=None),
        "bootstrap_port": field(OPT_INT_OR_LIST, default=None),
        "bootstrap_room": field(OPT_INT_OR_LIST, default=None),
        "bootstrap_pair_key": field(OPT_STR_OR_LIST, default=None),
        "decode_tp_size": field(OPT_INT_OR_LIST, default=None),
        "routed_dp_rank": field(nullable(INT), default=None),
        "data_parallel_rank": field(nullable(INT), default=None, doc="an old name of routed_dp_rank"),
        "disagg_prefill_dp_rank": field(nullable(INT), default=None),
        "routing_key": field(nullable(STR), default=None),
        "conversation_id": field(nullable(STR), default=None),
        "http_worker_ipc": field(nullable(STR), default=None),
        "background": field(BOOL, default=False),
        "require_reasoning": field(nullable(BOOL), default=False),
        "max_thinking_tokens": field(nullable(INT), default=None),
        "priority": field(nullable(INT), default=None),
        "extra_key": field(nullable(STR_OR_LIST), default=None),
        "cache_salt": field(nullable(STR_OR_LIST), default=None),
        "kv_hints": field(ANY, default=None),
        "no_logs": field(BOOL, default=False),
        "custom_labels": field(ANY, default=None),
    },
    unknown="ignore",
)

# [logprob, token id, its text or null (null unless return_text_in_logprobs)]
LOGPROB_ENTRY = tuple_of(nullable(NUMBER), INT, nullable(STR))

FINISH_REASON = any_of(
    obj(
        {
            "type": field(enum("stop"), required=True),
            "matched": field(any_of(INT, STR, list_of(INT), NULL), required=True, doc="the stop token or string"),
        }
    ),
    obj({"type": field(enum("length"), required=True), "length": field(INT, required=True)}),
    obj(
        {
            "type": field(enum("abort"), required=True),
            "message": field(nullable(STR), required=True),
            "status_code": field(nullable(INT), required=True),
            "err_type": field(nullable(STR), required=True),
        }
    ),
)

WEIGHT_VERSION_SPAN = obj(
    {
        "version": field(STR, required=True),
        "start": field(INT, required=True, doc="first output token index"),
        "end": field(INT, required=True, doc="one past the last"),
    }
)

META_INFO = obj(
    {
        "id": field(STR, required=True, doc="the rid"),
        "finish_reason": field(FINISH_REASON, required=True, doc="null only in a streamed item before its end"),
        "prompt_tokens": field(INT, required=True),
        "completion_tokens": field(INT, required=True),
        "cached_tokens": field(INT, required=True),
        "reasoning_tokens": field(INT, required=True),
        "num_retractions": field(INT, required=True),
        "weight_version": field(STR, required=True, doc="SGLang's default is the name 'default'"),
        "weight_versions": field(list_of(WEIGHT_VERSION_SPAN), required=True, doc="spans tiling the output tokens"),
        "e2e_latency": field(NUMBER, required=True, doc="seconds"),
        "output_token_logprobs": field(list_of(LOGPROB_ENTRY), doc="with return_logprob"),
        "output_token_logprobs_length": field(INT, doc="with return_logprob"),
        "input_token_logprobs": field(list_of(LOGPROB_ENTRY), doc="with return_logprob (see logprob_start_len)"),
        "output_top_logprobs": field(ANY),
        "input_top_logprobs": field(ANY),
        "output_token_ids_logprobs": field(ANY),
        "input_token_ids_logprobs": field(ANY),
        "hidden_states": field(ANY),
        "cached_tokens_details": field(ANY),
        "dp_rank": field(ANY),
        "image_tokens": field(ANY),
        "audio_tokens": field(ANY),
        "video_tokens": field(ANY),
        "spec_accept_rate": field(ANY),
        "spec_accept_length": field(ANY),
    }
)
META_INFO_WITH_LOGPROBS = with_fields(
    META_INFO,
    output_token_logprobs=field(list_of(LOGPROB_ENTRY), required=True),
    output_token_logprobs_length=field(INT, required=True),
)

GENERATE_ITEM = obj(
    {
        "text": field(STR, doc="present when the server has a tokenizer (not --skip-tokenizer-init)"),
        "output_ids": field(TOKEN_IDS, required=True, doc="the stop token included"),
        "meta_info": field(META_INFO, required=True),
        "prompt_token_ids": field(TOKEN_IDS, doc="with return_prompt_token_ids"),
        "index": field(INT, doc="a streamed item's place in its batch"),
    }
)
GENERATE_ITEM_WITH_LOGPROBS = with_fields(GENERATE_ITEM, meta_info=field(META_INFO_WITH_LOGPROBS, required=True))
GENERATE_ITEM_WITH_TEXT = with_fields(GENERATE_ITEM, text=field(STR, required=True))
# A streamed event before the item's last: the output so far, finish_reason null; the spans and
# the latency come with the last event (which is a whole GENERATE_ITEM).
STREAMED_ITEM_WITH_LOGPROBS = with_fields(
    GENERATE_ITEM,
    meta_info=field(
        with_fields(
            META_INFO_WITH_LOGPROBS,
            finish_reason=field(NULL, required=True),
            weight_versions=field(list_of(WEIGHT_VERSION_SPAN)),
            e2e_latency=field(NUMBER),
        ),
        required=True,
    ),
)

# ---- the other endpoints -----------------------------------------------------------------------

# Every request struct of SGLang's control endpoints also takes these two (internal routing).
BASE_REQ = {
    "rid": field(nullable(STR), default=None),
    "http_worker_ipc": field(nullable(STR), default=None),
}
WEIGHT_VERSION = nullable(STR)  # an integer is refused (400)
TORCH_DTYPE = pattern(r"[a-z][a-z0-9_]*")  # torch's name without "torch." (SGLang: getattr(torch, name))

UPDATE_WEIGHTS_FROM_DISK_REQUEST = obj(
    {
        "model_path": field(STR, required=True),
        "load_format": field(nullable(STR), default=None),
        "abort_all_requests": field(BOOL, default=False),
        "weight_version": field(WEIGHT_VERSION, default=None, doc="a string; the served version becomes it"),
        "is_async": field(BOOL, default=False),
        "torch_empty_cache": field(BOOL, default=False),
        "keep_pause": field(BOOL, default=False),
        "recapture_cuda_graph": field(BOOL, default=False),
        "token_step": field(INT, default=0),
        "flush_cache": field(BOOL, default=True),
        "manifest": field(nullable(obj({})), default=None),
        **BASE_REQ,
    }
)
INIT_GROUP_REQUEST = obj(
    {
        "master_address": field(STR, required=True),
        "master_port": field(INT, required=True),
        "rank_offset": field(INT, required=True, doc="the server's first rank (rank 0 is the sender)"),
        "world_size": field(INT, required=True),
        "group_name": field(STR, default="weight_update_group"),
        "backend": field(STR, default="nccl"),
        **BASE_REQ,
    }
)
UPDATE_FROM_DISTRIBUTED_REQUEST = obj(
    {
        "names": field(list_of(STR), required=True),
        "dtypes": field(list_of(TORCH_DTYPE), required=True),
        "shapes": field(list_of(list_of(INT)), required=True),
        "group_name": field(STR, default="weight_update_group"),
        "flush_cache": field(BOOL, default=True),
        "abort_all_requests": field(BOOL, default=False),
        "weight_version": field(WEIGHT_VERSION, default=None),
        "load_format": field(nullable(STR), default=None),
        "selector": field(enum("target", "draft", "all"), default="all"),
        "torch_empty_cache": field(BOOL, default=False),
        **BASE_REQ,
    }
)
GROUP_NAME_REQUEST = obj({"group_name": field(STR, default="weight_update_group"), **BASE_REQ})
PAUSE_REQUEST = obj({"mode": field(enum("abort", "retract", "in_place"), default="abort"), **BASE_REQ})
CONTINUE_REQUEST = obj({"torch_empty_cache": field(BOOL, default=True), **BASE_REQ})
ABORT_REQUEST = obj(
    {
        "rid": field(nullable(STR), default="", doc="empty and no abort_all: ignored (200, a warning)"),
        "abort_all": field(BOOL, default=False),
        "finished_reason": field(ANY, default=None),
        "abort_message": field(nullable(STR), default=None),
        "weight_versions": field(ANY, default=None),
        "http_worker_ipc": field(nullable(STR), default=None),
    }
)

SUCCESS_MESSAGE = obj({"success": field(BOOL, required=True), "message": field(STR, required=True)})
WEIGHTS_FROM_DISK_ANSWER = obj(
    {
        "success": field(BOOL, required=True),
        "message": field(STR, required=True),
        "num_paused_requests": field(INT, required=True),
        "weight_version": field(STR, doc="the version now served", realhf=True),
    }
)
WEIGHTS_FROM_DISTRIBUTED_ANSWER = with_fields(
    SUCCESS_MESSAGE, weight_version=field(STR, doc="the version now served (a version's last bucket)", realhf=True)
)
STATUS_OK = obj({"message": field(STR, required=True), "status": field(enum("ok"), required=True)})
MODEL_INFO = obj(
    {
        "model_path": field(STR, required=True),
        "served_model_name": field(STR, required=True),
        "tokenizer_path": field(nullable(STR), required=True, doc="null without a tokenizer"),
        "is_generation": field(BOOL, required=True),
        "preferred_sampling_params": field(ANY, required=True),
        "weight_version": field(STR, required=True, doc="'default' until a version is set"),
        "load_format": field(nullable(STR), required=True),
        "reasoning_parser": field(nullable(STR), required=True),
        "tool_call_parser": field(nullable(STR), required=True),
        "disaggregation_mode": field(STR, required=True, doc="'null' when not disaggregated"),
        "has_image_understanding": field(BOOL, required=True),
        "has_audio_understanding": field(BOOL, required=True),
        "model_type": field(nullable(STR), required=True, doc="the HF config's"),
        "architectures": field(nullable(list_of(STR)), required=True, doc="the HF config's"),
        "embedding": field(ANY, doc="embedding models only"),
    }
)
# SGLang's /get_server_info is its ServerArgs, its scheduler's limits, one internal state per DP
# rank and its version (many more keys than these: only the ones clients read are required).
SERVER_INFO = obj(
    {
        "model_path": field(STR, required=True),
        "tokenizer_path": field(nullable(STR), required=True),
        "served_model_name": field(STR),
        "skip_tokenizer_init": field(BOOL, required=True),
        "context_length": field(nullable(INT), required=True),
        "max_running_requests": field(nullable(INT), required=True),
        "max_total_num_tokens": field(INT, required=True, doc="the KV cache's capacity in tokens"),
        "max_req_input_len": field(INT, required=True),
        "tp_size": field(INT, required=True),
        "dp_size": field(INT, required=True),
        "weight_version": field(STR),
        "internal_states": field(
            list_of(obj({"last_gen_throughput": field(NUMBER, required=True)})), required=True, doc="one per DP rank"
        ),
        "version": field(STR, required=True),
    }
)
ERROR_ANSWER = obj({"error": field(ANY, required=True)})  # /generate's 400; other 400s vary in shape

# ---- the endpoints -----------------------------------------------------------------------------

ENDPOINTS: Dict[str, Dict[str, Any]] = {
    "/generate": {
        "methods": ["POST", "PUT"],
        "request": GENERATE_REQUEST,
        "answers": {
            "200": "JSON: one item for one prompt with n = 1, else a list of len(batch) x n items, prompt-major",
            "400": "JSON {error}: a body that breaks the contract (an unknown sampling_params key, a wrong type)",
        },
    },
    "/pause_generation": {
        "methods": ["POST"],
        "request": PAUSE_REQUEST,
        "answers": {"200": "JSON {message, status: 'ok'}; mode 'abort' returns the running requests now"},
    },
    "/continue_generation": {
        "methods": ["POST"],
        "request": CONTINUE_REQUEST,
        "answers": {"200": "JSON {message, status: 'ok'}"},
    },
    "/update_weights_from_disk": {
        "methods": ["POST"],
        "request": UPDATE_WEIGHTS_FROM_DISK_REQUEST,
        "answers": {"200": "JSON {success: true, message, num_paused_requests}", "400": "the same, success false"},
    },
    "/init_weights_update_group": {
        "methods": ["POST"],
        "request": INIT_GROUP_REQUEST,
        "answers": {"200": "JSON {success: true, message} once joined", "400": "the same, success false"},
    },
    "/update_weights_from_distributed": {
        "methods": ["POST"],
        "request": UPDATE_FROM_DISTRIBUTED_REQUEST,
        "answers": {"200": "JSON {success: true, message} once received", "400": "the same, success false"},
    },
    "/destroy_weights_update_group": {
        "methods": ["POST"],
        "request": GROUP_NAME_REQUEST,
        "answers": {"200": "JSON {success: true, message}", "400": "{success: false, message}: no such group"},
    },
    "/abort_request": {
        "methods": ["POST"],
        "request": ABORT_REQUEST,
        "answers": {"200": "an empty body, whether or not the rid was running"},
    },
    "/flush_cache": {
        "methods": ["GET", "POST"],
        "request": None,  # no body; query `timeout` (seconds, >= 0, default 0)
        "answers": {"200": "plain text", "400": "plain text: not flushed (requests were running)"},
    },
    "/get_model_info": {
        "methods": ["GET"],
        "request": None,
        "answers": {"200": "JSON, MODEL_INFO (SGLang logs it as deprecated for /model_info, which answers the same)"},
    },
    "/get_server_info": {
        "methods": ["GET"],
        "request": None,
        "answers": {"200": "JSON, SERVER_INFO"},
    },
    "/health": {
        "methods": ["GET"],
        "request": None,
        "answers": {"200": "an empty body: serving", "503": "an empty body: starting, shutting down or unhealthy"},
    },
}

# ---- worked examples ---------------------------------------------------------------------------
# `group`: "read" (changes nothing a client would notice), "control" (pauses: aborts running
# requests of a server in use), "weights" (loads weights, sets the weight version). Requests may
# name `{model_path}` and `{next_version}`, filled in by the suite. `expect`: dotted paths into the
# answer (each item of a list) and their values; `items`: the length of a list answer.

_GREEDY = {"max_new_tokens": 4, "temperature": 0.0}
# What realhf's rollout client sends (realhf.system.rollout.generation_client.sampling_params).
_CLIENT_SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "stop_token_ids": [2]}

EXAMPLES: List[Dict[str, Any]] = [
    {
        "name": "health",
        "endpoint": "/health",
        "method": "GET",
        "request": None,
        "status": 200,
        "answer": {"content": "empty"},
        "group": "read",
    },
    {
        "name": "model info",
        "endpoint": "/get_model_info",
        "method": "GET",
        "request": None,
        "status": 200,
        "answer": {"content": "json", "shape": MODEL_INFO},
        "expect": {"is_generation": True},
        "group": "read",
    },
    {
        "name": "server info",
        "endpoint": "/get_server_info",
        "method": "GET",
        "request": None,
        "status": 200,
        "answer": {"content": "json", "shape": SERVER_INFO},
        "expect": {"dp_size": 1},
        "group": "read",
    },
    {
        "name": "one prompt as the rollout client asks it",
        "endpoint": "/generate",
        "method": "POST",
        "request": {
            "input_ids": [1, 5, 9, 4],
            "sampling_params": {**_CLIENT_SAMPLING, "min_new_tokens": 1},
            "return_logprob": True,
            "rid": "conformance-one",
        },
        "status": 200,
        "answer": {"content": "json", "shape": GENERATE_ITEM_WITH_LOGPROBS},
        "expect": {"meta_info.id": "conformance-one", "meta_info.prompt_tokens": 4},
        "group": "read",
    },
    {
        "name": "a group in one request (n samples)",
        "endpoint": "/generate",
        "method": "POST",
        "request": {
            "input_ids": [1, 5, 9, 4],
            "sampling_params": {**_CLIENT_SAMPLING, "n": 3},
            "return_logprob": True,
            "rid": "conformance-group",
        },
        "status": 200,
        "answer": {"content": "json", "shape": list_of(GENERATE_ITEM_WITH_LOGPROBS)},
        "items": 3,
        "group": "read",
    },
    {
        "name": "to the token budget",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"input_ids": [1, 5, 9, 4], "sampling_params": {**_GREEDY, "max_new_tokens": 3, "ignore_eos": True}},
        "status": 200,
        "answer": {"content": "json", "shape": GENERATE_ITEM},
        "expect": {
            "meta_info.finish_reason.type": "length",
            "meta_info.finish_reason.length": 3,
            "meta_info.completion_tokens": 3,
        },
        "group": "read",
    },
    {
        "name": "a batch of two prompts",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"input_ids": [[1, 5, 9, 4], [1, 6, 7]], "sampling_params": _GREEDY},
        "status": 200,
        "answer": {"content": "json", "shape": list_of(GENERATE_ITEM)},
        "items": 2,
        "group": "read",
    },
    {
        "name": "text in and out",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"text": "1+1=", "sampling_params": _GREEDY},
        "status": 200,
        "answer": {"content": "json", "shape": GENERATE_ITEM_WITH_TEXT},
        "needs": "tokenizer",
        "group": "read",
    },
    {
        "name": "stop strings, cut from the text",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"text": "1+1=", "sampling_params": {**_GREEDY, "max_new_tokens": 16, "stop": ["\n", " ", "="]}},
        "status": 200,
        "answer": {"content": "json", "shape": GENERATE_ITEM_WITH_TEXT},
        "needs": "tokenizer",
        "group": "read",
    },
    {
        "name": "stop strings kept (no_stop_trim)",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"text": "1+1=", "sampling_params": {**_GREEDY, "stop": "\n", "no_stop_trim": True}},
        "status": 200,
        "answer": {"content": "json", "shape": GENERATE_ITEM_WITH_TEXT},
        "needs": "tokenizer",
        "group": "read",
    },
    {
        "name": "a streamed answer",
        "endpoint": "/generate",
        "method": "POST",
        "request": {
            "input_ids": [1, 5, 9, 4],
            "sampling_params": {**_GREEDY, "ignore_eos": True},
            "return_logprob": True,
            "stream": True,
        },
        "status": 200,
        "answer": {"content": "sse", "shape": GENERATE_ITEM_WITH_LOGPROBS, "partial": STREAMED_ITEM_WITH_LOGPROBS},
        "group": "read",
    },
    {
        "name": "an unknown sampling parameter is refused",
        "endpoint": "/generate",
        "method": "POST",
        "request": {"input_ids": [1, 5, 9, 4], "sampling_params": {**_GREEDY, "no_such_param": 1}},
        "status": 400,
        "answer": {"content": "json", "shape": ERROR_ANSWER},
        "group": "read",
    },
    {
        "name": "abort a request that is not running",
        "endpoint": "/abort_request",
        "method": "POST",
        "request": {"rid": "conformance-no-such-request"},
        "status": 200,
        "answer": {"content": "empty"},
        "group": "read",
    },
    {
        "name": "flush the cache (idle)",
        "endpoint": "/flush_cache",
        "method": "POST",
        "request": None,
        "status": 200,
        "answer": {"content": "text"},
        "group": "read",
    },
    {
        "name": "leave a group never joined",
        "endpoint": "/destroy_weights_update_group",
        "method": "POST",
        "request": {"group_name": "conformance-no-such-group"},
        "status": 400,
        "answer": {"content": "json", "shape": SUCCESS_MESSAGE},
        "expect": {"success": False},
        "group": "read",
    },
    {
        "name": "pause",
        "endpoint": "/pause_generation",
        "method": "POST",
        "request": {"mode": "abort"},
        "status": 200,
        "answer": {"content": "json", "shape": STATUS_OK},
        "group": "control",
    },
    {
        "name": "continue",
        "endpoint": "/continue_generation",
        "method": "POST",
        "request": {},
        "status": 200,
        "answer": {"content": "json", "shape": STATUS_OK},
        "group": "control",
    },
    {
        "name": "load weights from disk as a new version",
        "endpoint": "/update_weights_from_disk",
        "method": "POST",
        "request": {"model_path": "{model_path}", "weight_version": "{next_version}"},
        "status": 200,
        "answer": {"content": "json", "shape": WEIGHTS_FROM_DISK_ANSWER},
        "expect": {"success": True},
        "group": "weights",
    },
]

# Request bodies of the broadcast (sent by the trainer's broadcaster in the suite, which hosts rank
# 0; written here as data for the request shapes and the docs).
BROADCAST_EXAMPLES: List[Dict[str, Any]] = [
    {
        "endpoint": "/init_weights_update_group",
        "request": {
            "master_address": "127.0.0.1",
            "master_port": 29500,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": "realhf-weights-1",
            "backend": "gloo",
        },
        "answer": SUCCESS_MESSAGE,
    },
    {
        "endpoint": "/update_weights_from_distributed",
        "request": {
            "names": ["model.embed_tokens.weight", "model.norm.weight"],
            "dtypes": ["bfloat16", "bfloat16"],
            "shapes": [[151936, 896], [896]],
            "group_name": "realhf-weights-1",
            "flush_cache": True,
            "weight_version": "3",
        },
        "answer": WEIGHTS_FROM_DISTRIBUTED_ANSWER,
    },
    {
        "endpoint": "/destroy_weights_update_group",
        "request": {"group_name": "realhf-weights-1"},
        "answer": SUCCESS_MESSAGE,
    },
]


def request_shape(endpoint: str) -> Dict[str, Any]:
    """The request body shape of `endpoint` (KeyError naming the known ones)."""
    try:
        shape = ENDPOINTS[endpoint]["request"]
    except KeyError:
        raise KeyError(f"{endpoint} is not an SGLang endpoint of the fixtures ({', '.join(ENDPOINTS)})") from None
    if shape is None:
        raise KeyError(f"{endpoint} takes no body")
    return shape
