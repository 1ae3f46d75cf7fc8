"""Conformance of a generation server to the SGLang protocol of docs/architecture.md §5, over real HTTP.

Only HTTP and the served model's HF reference are used, so a real SGLang server passes these too
(see tests/conftest.py: REALHF_CONFORMANCE_URL / REALHF_CONFORMANCE_MODEL).
"""

import asyncio
import os
import threading
import time

import aiohttp
import pytest
import torch

from helpers.http import http
from helpers.native_server import CONTEXT, SLOTS, decode_fails_once
from helpers.sglang_client import generate, wait_running


@pytest.fixture(scope="module")
def native_server_model(qwen_path):
    return qwen_path, CONTEXT, SLOTS


@pytest.fixture(scope="module")
def server_url(request):
    """This module's native server, or the external one REALHF_CONFORMANCE_URL names."""
    external = os.environ.get("REALHF_CONFORMANCE_URL")
    if external:
        return external.rstrip("/")
    return request.getfixturevalue("native_server")[0]


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19], [200]]


def _check_response_shape(out, n_prompt):
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] in ("stop", "length", "abort")
    assert meta["prompt_tokens"] == n_prompt
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert isinstance(meta["weight_version"], (int, str))
    triples = meta["output_token_logprobs"]
    assert len(triples) == len(out["output_ids"])
    for (lp, tok, text), out_tok in zip(triples, out["output_ids"]):
        assert tok == out_tok and text is None and lp <= 0.0


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_logprobs_equal_log_softmax_of_full_forward_over_temperature(server_url, hf_ref, temperature):
    for prompt in PROMPTS:
        out = generate(server_url, prompt, max_new_tokens=24, temperature=temperature, ignore_eos=True)
        _check_response_shape(out, len(prompt))
        assert len(out["output_ids"]) == 24 and out["meta_info"]["finish_reason"]["type"] == "length"
        got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
        want = hf_ref.logprobs(prompt, out["output_ids"], temperature)
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_top_k_and_top_p_do_not_change_the_reported_logprob_definition(server_url, hf_ref):
    # Filters shape the sampling distribution only; the log-prob stays log_softmax(logits / T).
    prompt = PROMPTS[0]
    out = generate(server_url, prompt, max_new_tokens=24, temperature=0.8, top_k=5, top_p=0.9, ignore_eos=True)
    got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
    want = hf_ref.logprobs(prompt, out["output_ids"], 0.8)
    assert torch.allclose(got, want, atol=1e-4)


def test_top_k_1_samples_the_argmax(server_url, hf_ref):
    prompt = PROMPTS[2]
    out = generate(server_url, prompt, max_new_tokens=16, temperature=1.0, top_k=1, ignore_eos=True)
    assert out["output_ids"] == hf_ref.greedy(prompt, 16)


def test_greedy_is_deterministic_and_equals_hf_greedy(server_url, hf_ref):
    for prompt in PROMPTS:
        a = generate(server_url, prompt, max_new_tokens=32, temperature=0.0, ignore_eos=True)["output_ids"]
        b = generate(server_url, prompt, max_new_tokens=32, temperature=0.0, ignore_eos=True)["output_ids"]
        assert a == b == hf_ref.greedy(prompt, 32)


def test_greedy_does_not_depend_on_what_else_is_running(server_url, hf_ref):
    # Requests of different lengths join and leave the batch around this one.
    async def run():
        async with aiohttp.ClientSession() as session:

            async def one(prompt, n, temperature):
                body = {
                    "input_ids": prompt,
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": n, "temperature": temperature, "ignore_eos": True},
                }
                async with session.post(f"{server_url}/generate", json=body) as resp:
                    assert resp.status == 200
                    return (await resp.json())["output_ids"]

            others = [one([i + 3] * (i % 7 + 1), 5 + 3 * i, 1.0) for i in range(20)]
            return (await asyncio.gather(one(PROMPTS[0], 40, 0.0), *others))[0]

    assert asyncio.run(run()) == hf_ref.greedy(PROMPTS[0], 40)


def test_64_concurrent_clients_all_complete(server_url, hf_ref):
    async def run():
        async with aiohttp.ClientSession() as session:

            async def one(i):
                prompt = [(7 * i + k) % 250 + 3 for k in range(4 + i % 9)]
                body = {
                    "input_ids": prompt,
                    "return_logprob": True,
                    "rid": f"c64-{i}",
                    "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True},
                }
                async with session.post(f"{server_url}/generate", json=body) as resp:
                    assert resp.status == 200
                    return prompt, await resp.json()

            return await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(64)]), timeout=120)

    results = asyncio.run(run())
    assert len(results) == 64
    for _prompt, out in results:
        assert len(out["output_ids"]) == 24 and out["meta_info"]["finish_reason"]["type"] == "length"
    prompt, out = results[17]  # spot-check one against the reference
    got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, hf_ref.logprobs(prompt, out["output_ids"], 1.0), atol=1e-4)


def test_pause_returns_partial_tokens_with_abort_and_resubmitting_continues(server_url, hf_ref):
    prompt, budget = PROMPTS[1], 1000
    results = {}

    def client(i):
        p = prompt if i == 0 else [i + 20, i + 21]
        results[i] = generate(server_url, p, max_new_tokens=budget, temperature=0.0, ignore_eos=True, timeout=120)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    try:
        wait_running(server_url, 32)
        time.sleep(0.1)  # mid-answer: 32 × 1000 tokens take far longer
        status, body = http("POST", f"{server_url}/pause_generation", {})
        assert status == 200, body
        for t in threads:
            t.join(timeout=10)  # "at once": well before the answers could have finished
        assert not any(t.is_alive() for t in threads), "paused requests did not return"
        # While paused, a new request waits.
        waiting = threading.Thread(target=client, args=(99,))
        waiting.start()
        time.sleep(0.3)
        assert waiting.is_alive(), "a request submitted while paused was served"
    finally:
        http("POST", f"{server_url}/continue_generation", {})
    waiting.join(timeout=60)
    assert len(results[99]["output_ids"]) == budget

    partial = results[0]
    assert partial["meta_info"]["finish_reason"]["type"] == "abort"
    done = partial["output_ids"]
    assert 0 < len(done) < budget
    assert all(results[i]["meta_info"]["finish_reason"]["type"] == "abort" for i in range(32))
    # Partial rollout: prompt + tokens so far, the rest of the budget.
    rest = generate(
        server_url, prompt + done, max_new_tokens=budget - len(done), temperature=0.0, ignore_eos=True, timeout=120
    )
    full = done + rest["output_ids"]
    assert len(full) == budget
    assert full[:200] == hf_ref.greedy(prompt, 200)  # the reference, on a length it generates quickly
    uninterrupted = generate(server_url, prompt, max_new_tokens=budget, temperature=0.0, ignore_eos=True, timeout=120)
    assert full == uninterrupted["output_ids"]


def test_abort_request_ends_one_request_with_its_partial_tokens(server_url):
    out = {}
    t = threading.Thread(
        target=lambda: out.update(
            generate(
                server_url,
                PROMPTS[0],
                rid="to-abort",
                max_new_tokens=1500,
                temperature=1.0,
                ignore_eos=True,
                timeout=60,
            )
        )
    )
    t.start()
    wait_running(server_url, 1)
    status, body = http("POST", f"{server_url}/abort_request", {"rid": "to-abort"})
    t.join(timeout=10)
    assert status == 200 and not t.is_alive()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < 1500
    # Unknown rids are not an error (SGLang answers 200 too).
    assert http("POST", f"{server_url}/abort_request", {"rid": "no-such-rid"})[0] == 200


def test_stop_token_ids_end_the_answer_at_the_first_occurrence(server_url):
    prompt = PROMPTS[2]
    free = generate(server_url, prompt, max_new_tokens=30, temperature=0.0, ignore_eos=True)["output_ids"]
    stop = free[6]
    first = free.index(stop)
    out = generate(server_url, prompt, max_new_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    assert out["output_ids"] == free[: first + 1]  # the stop token is part of the output, as in SGLang
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    # Several stop ids: whichever comes first.
    out = generate(
        server_url, prompt, max_new_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[free[9], free[4]]
    )
    assert out["output_ids"] == free[: min(free.index(free[9]), free.index(free[4])) + 1]


def test_max_new_tokens_zero_returns_no_tokens(server_url):
    out = generate(server_url, PROMPTS[0], max_new_tokens=0)
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"


BAD_BODIES = [
    ({"input_ids": [], "sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    ({"input_ids": [1, 2, 10**6], "sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    ({"input_ids": [1, -3], "sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10**6}}, "context"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "many"}}, "max_new_tokens"),
    ({"input_ids": "1 2 3"}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"sampling_params": {"max_new_tokens": 4}}, "input_ids"),
]


@pytest.mark.parametrize("body,field", BAD_BODIES, ids=[f for _, f in BAD_BODIES])
def test_bad_generate_bodies_get_4xx_with_a_message(server_url, body, field):
    status, out = http("POST", f"{server_url}/generate", body)
    assert 400 <= status < 500, (status, out)
    assert field in str(out).lower() or "invalid" in str(out).lower(), out


def test_malformed_json_and_bad_control_bodies_get_4xx_and_the_server_keeps_serving(server_url):
    assert 400 <= http("POST", f"{server_url}/generate", b"{not json")[0] < 500
    assert 400 <= http("POST", f"{server_url}/generate", b"[1, 2]")[0] < 500
    status, out = http("POST", f"{server_url}/update_weights_from_disk", {"model_path": "/no/such/dir"})
    assert 400 <= status < 500 and out["success"] is False and "/no/such/dir" in out["message"]
    assert 400 <= http("POST", f"{server_url}/update_weights_from_disk", {})[0] < 500
    out = generate(server_url, PROMPTS[0], max_new_tokens=3, ignore_eos=True)
    assert len(out["output_ids"]) == 3


def test_health_models_flush_and_metrics_endpoints(server_url):
    from prometheus_client.parser import text_string_to_metric_families

    status, _ = http("GET", f"{server_url}/health")
    assert status == 200
    status, models = http("GET", f"{server_url}/v1/models")
    assert status == 200 and models["data"] and "id" in models["data"][0]
    assert http("POST", f"{server_url}/flush_cache")[0] == 200
    generate(server_url, PROMPTS[0], max_new_tokens=5)
    status, text = http("GET", f"{server_url}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "sglang:num_running_reqs" in families
    # Counters: the parser strips the _total suffix.
    gen = families["sglang:generation_tokens"].samples
    assert sum(s.value for s in gen if s.name.endswith("_total")) >= 5


def _generation_tokens_total(url):
    from prometheus_client.parser import text_string_to_metric_families

    status, text = http("GET", f"{url}/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(s.value for s in fams["sglang:generation_tokens"].samples if s.name.endswith("_total"))


def test_a_client_that_disconnects_has_its_request_aborted(server_url):
    budget = 2000
    before = _generation_tokens_total(server_url)

    async def run():
        async with aiohttp.ClientSession() as session:
            body = {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": budget, "ignore_eos": True}}
            task = asyncio.ensure_future(session.post(f"{server_url}/generate", json=body))
            await asyncio.to_thread(wait_running, server_url, 1)
            task.cancel()  # closes the connection mid-request
            try:
                await task
            except asyncio.CancelledError:
                pass

    asyncio.run(run())
    deadline = time.monotonic() + 60
    while True:
        try:
            wait_running(server_url, 1, timeout=0.05)
        except TimeoutError:
            break
        assert time.monotonic() < deadline, "the abandoned request kept running"
    # It stopped early instead of decoding its whole budget for nobody.
    assert _generation_tokens_total(server_url) - before < budget


EXTREME_SAMPLING = [
    ({"temperature": 1e-30}, "temperature"),  # logits / T overflows float32: inf, then NaN probabilities
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": 1e300}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": 2**70}, "top_k"),  # beyond int64: the slot tensor cannot hold it
    ({"min_new_tokens": 2**70, "max_new_tokens": 4}, "min_new_tokens"),
    ({"stop_token_ids": [5] * 5000}, "stop_token_ids"),  # a [slots x 5000] stop table per request
]


@pytest.mark.parametrize(
    "sampling,field", EXTREME_SAMPLING, ids=[f"{f}-{i}" for i, (_, f) in enumerate(EXTREME_SAMPLING)]
)
def test_extreme_sampling_values_get_4xx_and_the_engine_keeps_serving(server_url, sampling, field):
    status, out = http(
        "POST",
        f"{server_url}/generate",
        {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 4, **sampling}},
    )
    assert 400 <= status < 500, (status, out)
    assert field in str(out), out
    out = generate(server_url, PROMPTS[0], max_new_tokens=3, ignore_eos=True)  # the engine still serves
    assert len(out["output_ids"]) == 3


def _post_raw(server_url: str, headers: dict, chunks=()) -> int:
    """Status of a POST /generate sent by hand: `headers` as given, then `chunks` as a chunked body
    (a server that answers early may close the connection while we are still sending)."""
    from http.client import HTTPConnection
    from urllib.parse import urlparse

    url = urlparse(server_url)
    conn = HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.putrequest("POST", "/generate")
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            for chunk in chunks:
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if chunks:
                conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_body_over_the_size_bound_gets_413_declared_or_chunked_and_the_engine_keeps_serving(server_url):
    from realhf.base.body_limit import DEFAULT_MAX_REQUEST_BYTES

    # Declared: refused from the headers alone, the body is never read.
    assert (
        _post_raw(
            server_url, {"Content-Type": "application/json", "Content-Length": str(DEFAULT_MAX_REQUEST_BYTES + 1)}
        )
        == 413
    )
    # Chunked: no length to refuse up front, so the bound is counted as the body arrives.
    chunks = [b"x" * (1024 * 1024)] * (DEFAULT_MAX_REQUEST_BYTES // (1024 * 1024) + 1)
    assert _post_raw(server_url, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, chunks) == 413
    status, _ = http(
        "POST",
        f"{server_url}/generate",
        {"input_ids": PROMPTS[0], "pad": "x" * 1000, "sampling_params": {"max_new_tokens": 2}},
    )
    assert status == 200  # a body under the bound is served
    out = generate(server_url, PROMPTS[0], max_new_tokens=3, ignore_eos=True)
    assert len(out["output_ids"]) == 3


@pytest.mark.system
def test_a_request_whose_engine_step_fails_gets_500_and_the_next_one_is_served(native_server):
    url, engine = native_server
    with decode_fails_once(engine):
        status, out = http(
            "POST",
            f"{url}/generate",
            {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
        )
        assert status == 500 and "injected fault" in str(out), (status, out)
        assert http("GET", f"{url}/health")[0] == 200
        out = generate(url, PROMPTS[0], max_new_tokens=3, ignore_eos=True)
        assert len(out["output_ids"]) == 3
