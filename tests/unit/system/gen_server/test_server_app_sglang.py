"""SGLang's /generate in full on the native server, over real HTTP: text in and out, batches,
`n` samples per prompt, server-sent-event streaming, string weight versions, and the refusals."""

import asyncio
import json
import os
import threading
import time

import aiohttp
import pytest

from helpers.http import http
from helpers.wait import wait_for

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "assets", "tiny-math", "sft")


@pytest.fixture(scope="module")
def served():
    """(url, engine, tokenizer) of a native server on the committed tiny model, with its tokenizer."""
    from realhf.impl.inference.factory import create_engine
    from realhf.system.gen_server.server_app import create_app
    from realhf.system.gen_server.sglang_generate import load_tokenizer
    from realhf.system.streams.http_thread import HttpServerThread

    tokenizer = load_tokenizer(TINY)
    assert tokenizer is not None
    engine = create_engine(TINY, max_running_requests=16, context_length=256, seed=1).start()
    server = HttpServerThread(
        create_app(engine, tokenizer=tokenizer, max_samples_per_request=8), "127.0.0.1", 0, name="gen"
    )
    try:
        server.start(timeout=30)
        yield server.url, engine, tokenizer
    finally:
        server.stop()
        engine.stop()


def post(url, body, status=200):
    got, out = http("POST", f"{url}/generate", body)
    assert got == status, (got, out)
    return out


def greedy(max_new_tokens, **extra):
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True, **extra}


def test_text_in_and_out_with_the_model_folders_tokenizer(served):
    url, _, tokenizer = served
    out = post(url, {"text": "12+7=", "sampling_params": greedy(12)})
    prompt = tokenizer.encode("12+7=")
    assert out["meta_info"]["prompt_tokens"] == len(prompt)
    assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True) and out["text"]
    # The same prompt as ids: the same answer, with its text too.
    by_ids = post(url, {"input_ids": prompt, "sampling_params": greedy(12)})
    assert by_ids["output_ids"] == out["output_ids"] and by_ids["text"] == out["text"]


def test_a_batch_of_input_ids_with_one_sampling_params_per_prompt(served):
    url, _, _ = served
    prompts = [[21, 15, 21, 33], [22, 16, 23]]
    singles = [post(url, {"input_ids": p, "sampling_params": greedy(n)}) for p, n in zip(prompts, (6, 3))]
    out = post(url, {"input_ids": prompts, "sampling_params": [greedy(6), greedy(3)], "return_logprob": True})
    assert isinstance(out, list) and len(out) == 2
    for got, want in zip(out, singles):
        assert got["output_ids"] == want["output_ids"]
        assert len(got["meta_info"]["output_token_logprobs"]) == len(got["output_ids"])
    assert [len(o["output_ids"]) for o in out] == [6, 3]
    # A batch of texts.
    out = post(url, {"text": ["1+1=", "2+2="], "sampling_params": greedy(4)})
    assert [o["text"] for o in out] == [
        post(url, {"text": t, "sampling_params": greedy(4)})["text"] for t in ("1+1=", "2+2=")
    ]


def test_n_samples_share_one_prefill_greedy_ones_equal_sampled_ones_differ(served):
    url, engine, _ = served
    prompt = [21, 15, 21, 33]
    single = post(url, {"input_ids": prompt, "sampling_params": greedy(10)})
    shared = engine.prefill_shared_total
    out = post(url, {"input_ids": prompt, "sampling_params": greedy(10, n=3)})
    assert isinstance(out, list) and len(out) == 3
    assert all(o["output_ids"] == single["output_ids"] for o in out)
    assert engine.prefill_shared_total - shared == 2  # one prefill, copied to the two other samples
    out = post(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 1.5, "n": 3}})
    assert len({tuple(o["output_ids"]) for o in out}) > 1, out


def test_batch_times_n_comes_back_prompt_major_with_derived_rids(served):
    url, _, _ = served
    prompts = [[21, 15, 21, 33], [22, 16, 23]]
    a, b = (post(url, {"input_ids": p, "sampling_params": greedy(5)})["output_ids"] for p in prompts)
    out = post(url, {"input_ids": prompts, "sampling_params": greedy(5, n=2), "rid": ["p", "q"]})
    assert [o["output_ids"] for o in out] == [a, a, b, b]
    assert [o["meta_info"]["id"] for o in out] == ["p-0", "p-1", "q-0", "q-1"]


def _sse_events(raw: bytes):
    """The JSON objects of a server-sent-event stream, and whether it ended with [DONE]."""
    events, done = [], False
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        if data == "[DONE]":
            done = True
        else:
            assert not done, "an event after [DONE]"
            events.append(json.loads(data))
    return events, done


def _stream(url, body):
    async def run():
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                return await resp.read()

    return _sse_events(asyncio.run(run()))


def test_stream_sends_cumulative_chunks_and_the_last_equals_the_unstreamed_answer(served):
    url, _, _ = served
    body = {"text": "12+7=", "sampling_params": greedy(20), "return_logprob": True}
    whole = post(url, body)
    events, done = _stream(url, body)
    assert done and len(events) >= 2, events
    for prev, nxt in zip(events, events[1:]):  # each event: the output so far
        assert nxt["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    last = events[-1]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert last["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    # As SGLang streams: the last event brings the last token with the finish reason, never a
    # repeat of the event before it (each event's output is longer than the one before).
    assert all(len(b["output_ids"]) > len(a["output_ids"]) for a, b in zip(events, events[1:])), events
    # A batch streams its items interleaved, each event naming its item.
    events, done = _stream(url, {"input_ids": [[21, 15], [22, 16]], "sampling_params": greedy(6, n=2)})
    finals = {e["index"]: e for e in events if e["meta_info"]["finish_reason"] is not None}
    assert done and sorted(finals) == [0, 1, 2, 3]
    assert finals[0]["output_ids"] == finals[1]["output_ids"] and len(finals[3]["output_ids"]) == 6


def test_stop_strings_end_the_answer_and_are_cut_from_its_text_as_sglangs_are(served):
    url, _, _ = served
    body = {"text": "12+7=", "sampling_params": greedy(10)}
    full = post(url, body)
    text, ids = full["text"], full["output_ids"]
    assert len(ids) == len(text) == 10  # one character per token (the tiny model's answer: 10, then EOS)
    stop = text[3:5]
    pos = text.find(stop)
    n = pos + len(stop)  # the answer ends at the token that completes the stop string
    out = post(url, {**body, "sampling_params": greedy(10, stop=["never in this answer", stop])})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}, out
    assert out["output_ids"] == ids[:n] and out["text"] == text[:pos]
    kept = post(url, {**body, "sampling_params": greedy(10, stop=stop, no_stop_trim=True)})
    assert kept["output_ids"] == ids[:n] and kept["text"] == text[:n]
    # Streamed: no event goes past the stop, and the last one is the unstreamed answer.
    events, done = _stream(url, {**body, "sampling_params": greedy(10, stop=stop)})
    assert done and events[-1]["text"] == out["text"] and events[-1]["output_ids"] == out["output_ids"]
    assert all(len(e["output_ids"]) < n for e in events[:-1])
    # Not matched before min_new_tokens (SGLang's order).
    late = post(url, {**body, "sampling_params": greedy(10, stop=stop, min_new_tokens=n + 1)})
    assert len(late["output_ids"]) > n and late["output_ids"] == ids[: len(late["output_ids"])]
    # A stop token is cut from the text too (SGLang's detokenizer), and kept with no_stop_trim.
    tok = post(url, {**body, "sampling_params": greedy(10, stop_token_ids=[ids[2]])})
    k = ids.index(ids[2]) + 1
    assert tok["output_ids"] == ids[:k] and tok["text"] == text[: k - 1]
    assert (
        post(url, {**body, "sampling_params": greedy(10, stop_token_ids=[ids[2]], no_stop_trim=True)})["text"]
        == text[:k]
    )


def test_a_client_that_disconnects_from_a_stream_has_its_requests_aborted(served):
    url, engine, _ = served
    aborted = engine.aborted_total

    async def run():
        async with aiohttp.ClientSession() as session:
            body = {"input_ids": [21, 15], "stream": True, "sampling_params": greedy(250, n=2)}
            async with session.post(f"{url}/generate", json=body) as resp:
                await resp.content.readuntil(b"\n\n")  # the first event: it is running
                assert engine.n_active == 2
            # Leaving the block closes the connection mid-stream.

    asyncio.run(run())
    wait_for(lambda: engine.n_active == 0, 30, "the abandoned stream's requests to end")
    assert engine.aborted_total - aborted == 2


def test_the_prompts_rid_aborts_all_its_samples(served):
    url, engine, _ = served
    out = {}
    t = threading.Thread(
        target=lambda: out.update(
            r=post(url, {"input_ids": [21, 15], "rid": "grp", "sampling_params": greedy(250, n=3)})
        )
    )
    t.start()
    wait_for(lambda: engine.n_active == 3, 30, "3 running samples")
    status, body = http("POST", f"{url}/abort_request", {"rid": "grp"})
    t.join(timeout=30)
    assert status == 200 and body is None and not t.is_alive()  # SGLang's answer: an empty body
    assert [o["meta_info"]["finish_reason"]["type"] for o in out["r"]] == ["abort"] * 3


def test_weight_versions_are_strings_as_sglangs_and_updates_take_either_form(served):
    url, engine, _ = served
    assert http("GET", f"{url}/get_model_info")[1]["weight_version"] == str(engine.weight_version)
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": TINY, "weight_version": "7"})
    assert status == 200 and body["success"] and body["weight_version"] == "7" and engine.weight_version == 7
    assert post(url, {"input_ids": [5, 6], "sampling_params": greedy(2)})["meta_info"]["weight_version"] == "7"
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": TINY, "weight_version": 8})
    assert status == 200 and body["weight_version"] == "8"
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": TINY, "weight_version": "latest"})
    assert status == 400 and "weight_version" in body["error"]["message"] and engine.weight_version == 8


REFUSED = [
    ({"text": "1+1=", "input_ids": [5]}, "either text or input_ids"),
    ({"text": []}, "text is an empty batch"),
    ({"input_ids": [[5], [6]], "sampling_params": [{}]}, "sampling_params is a list of 1"),
    ({"input_ids": [5], "sampling_params": {"n": 0}}, "sampling_params.n must be >= 1"),
    ({"input_ids": [[5], [6]], "sampling_params": [{"n": 1}, {"n": 2}]}, "sampling_params.n must be the same"),
    ({"input_ids": [[5], [6]], "sampling_params": {"n": 5}}, "at most 8"),
    ({"input_ids": [[5], [6]], "rid": "one"}, "rid must be a list"),
    ({"input_ids": [[5], [6]], "rid": ["one"]}, "rid is a list of 1"),
    ({"input_ids": [5], "sampling_params": {"stop": ["x", ""]}}, "sampling_params.stop contains an empty string"),
    ({"input_ids": [5], "sampling_params": {"stop": ["x"] * 65}}, "sampling_params.stop has 65 strings"),
    ({"input_ids": [[5], []]}, "input_ids is empty"),
    ({"input_ids": [5], "rid": ["a", "b"]}, "rid is a list of 2"),
]


@pytest.mark.parametrize("body,message", REFUSED, ids=[m for _, m in REFUSED])
def test_bad_bodies_get_400_naming_what_is_wrong(served, body, message):
    out = post(served[0], body, status=400)
    assert message in out["error"]["message"], out


@pytest.mark.system
def test_text_without_a_tokenizer_is_refused_naming_why(native_server):
    url, engine = native_server
    out = post(url, {"text": "hello", "sampling_params": {"max_new_tokens": 2}}, status=400)
    assert "tokenizer" in out["error"]["message"] and engine.model_path in out["error"]["message"], out
    out = post(url, {"input_ids": [5, 6], "sampling_params": {"stop": "\n"}}, status=400)
    assert "sampling_params.stop" in out["error"]["message"] and "stop_token_ids" in out["error"]["message"], out
    assert http("GET", f"{url}/get_model_info")[1]["tokenizer_path"] is None
    t0 = time.monotonic()
    out = post(url, {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert len(out["output_ids"]) == 2 and "text" not in out and time.monotonic() - t0 < 30


# A value of each refused field that SGLang would act on (anything but its default).
_NOT_DEFAULT = {type(None): "x", bool: True, int: 3, float: 0.5, str: "x", list: ["x"], dict: {"1": 2.0}}


def _acted_on(accepted: tuple):
    value = _NOT_DEFAULT[type(accepted[0])]
    return 5 if value in accepted else value


def test_every_field_of_sglangs_generate_is_served_accepted_as_a_hint_or_refused_by_name(served):
    """Over every field of SGLang's GenerateReqInput and its sampling_params (the conformance
    fixtures, v0.5.23): nothing a client asks for is ignored without a word."""
    from realhf.system.gen_server import sglang_generate as g
    from realhf.testing.sglang_conformance import fixtures

    url, _, _ = served
    request_fields = fixtures.GENERATE_REQUEST["fields"]
    sampling_fields = fixtures.SAMPLING_PARAMS["fields"]
    # Each field is in exactly one kind, and the kinds name no field SGLang lacks.
    kinds = (g.SERVED_FIELDS, g.HINT_FIELDS, set(g.REFUSED_FIELDS))
    assert sorted(f for k in kinds for f in k) == sorted(request_fields)
    kinds = (g.SERVED_SAMPLING, g.HINT_SAMPLING, set(g.REFUSED_SAMPLING))
    assert sorted(f for k in kinds for f in k) == sorted(sampling_fields)
    base = {"input_ids": [21, 15], "sampling_params": greedy(2)}
    for name, accepted in g.REFUSED_FIELDS.items():
        assert request_fields[name]["default"] in accepted, name  # SGLang's own default passes
        status, out = http("POST", f"{url}/generate", {**base, name: _acted_on(accepted)})
        assert status == 400 and f"{name}=" in out["error"]["message"], (name, status, out)
    for name, accepted in g.REFUSED_SAMPLING.items():
        assert sampling_fields[name]["default"] in accepted, name
        status, out = http(
            "POST", f"{url}/generate", {**base, "sampling_params": {**greedy(2), name: _acted_on(accepted)}}
        )
        assert status == 400 and f"sampling_params.{name}=" in out["error"]["message"], (name, status, out)
    # Hints, SGLang's defaults of refused fields, and an unknown top-level key (SGLang ignores it) pass.
    defaults = {name: request_fields[name]["default"] for name in g.REFUSED_FIELDS}
    hints = {"log_metrics": False, "priority": 3, "routing_key": "k", "n": 4}
    out = post(url, {**base, **defaults, **hints, "sampling_params": {**greedy(2), "stream_interval": 4}})
    assert len(out["output_ids"]) == 2  # one answer: the top-level n is not SGLang's either
