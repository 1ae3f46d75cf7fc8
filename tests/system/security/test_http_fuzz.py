"""HTTP bodies that do not validate get a 4xx, never a 5xx (issue 6, bullet 5).

Schemathesis generates requests from each server's own `/openapi.json` — valid bodies and
invalid ones (wrong types, missing fields, out-of-range numbers) — and sends them over real HTTP
on 127.0.0.1. Hypothesis then sends raw bytes that are not JSON at all, and a fixed list of
nasty bodies (huge numbers, NaN, deep nesting, non-UTF-8) that generators rarely hit.
The examples are derandomized so CI sees the same requests every run.
"""

import json

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

MAX_EXAMPLES = 30  # per operation and generation mode
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

NASTY_BODIES = [
    b"",
    b"null",
    b"[]",
    b"0",
    b'"text"',
    b"{",
    b"\xff\xfe\x00garbage",
    b"{}" * 1000,
    b"[" * 100000 + b"]" * 100000,  # json.loads: RecursionError, not JSONDecodeError
    b'{"a":' * 50000 + b"1" + b"}" * 50000,
    json.dumps({"input_ids": [10**40], "qid": "q", "prompt_len": 10**40, "new_token_budget": -(10**40)}).encode(),
    b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN, "top_p": Infinity, "max_new_tokens": 1e308}}',
    b'{"input_ids": [-1], "sampling_params": {"max_new_tokens": -5, "top_k": 0}}',
    b'{"qid": "", "accepted": "yes", "n_tokens": -1}',
    b'{"qid": "q", "rank": 1e400}',
    b'{"qid": "q", "rank": 100000000000000000000000000000000000000000}',
    b'{"qid": "q", "rank": true}',
    b'{"qid": "q", "rank": [0]}',
    b'{"qid": "q", "rank": 1}',
    b'{"qid": null, "prompt_len": "12", "group_size": 0}',
    b'{"model_path": 123, "weight_version": "new"}',
    b'{"model_path": "\\u0000/etc/passwd", "weight_version": 1e400}',
    b'{"rid": ["a"], "abort_all": "maybe"}',
    b'{"mode": {"nested": true}}',
]
CONTENT_TYPES = ["application/json", "text/plain", "application/x-www-form-urlencoded", "application/octet-stream"]


def _operations(base_url):
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    ops = [result.ok() for result in schema.get_all_operations()]
    assert ops, f"{base_url}/openapi.json lists no operations"
    return ops


def _post_paths(base_url):
    spec = requests.get(f"{base_url}/openapi.json", timeout=10).json()
    return sorted(path for path, methods in spec["paths"].items() if "post" in methods)


def _fuzz_spec(base_url, after_each=lambda: None):
    """Every operation of the spec, positive and negative examples; the status of any 5xx with its request."""
    failures = []
    for op in _operations(base_url):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @SETTINGS
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                try:
                    response = case.call(base_url=base_url, timeout=30)
                finally:
                    after_each()
                if response.status_code >= 500:
                    failures.append(
                        f"{op.method.upper()} {op.path} body={case.body!r:.300} -> "  # noqa: B023 - used within the iteration
                        f"{response.status_code} {response.text[:300]}"
                    )

            try:
                run()
            except Exception as e:  # schemathesis cannot build negative data for a body-less operation
                if "Unsatisfiable" not in type(e).__name__ and "unsatisf" not in str(e).lower():
                    raise
    return failures


def _fuzz_raw(base_url, after_each=lambda: None):
    failures = []
    paths = _post_paths(base_url)

    def send(path, body, content_type):
        try:
            r = requests.post(f"{base_url}{path}", data=body, headers={"Content-Type": content_type}, timeout=30)
        finally:
            after_each()
        if r.status_code >= 500:
            failures.append(f"POST {path} ({content_type}) body={body[:120]!r} -> {r.status_code} {r.text[:300]}")

    for path in paths:
        for body in NASTY_BODIES:
            send(path, body, "application/json")

    @SETTINGS
    @given(path=st.sampled_from(paths), body=st.binary(max_size=512), content_type=st.sampled_from(CONTENT_TYPES))
    def run(path, body, content_type):
        send(path, body, content_type)

    run()
    return failures


def _unpause(base_url):
    # A fuzzed /pause_generation would make every later /generate wait; undo it after each request.
    def after_each():
        requests.post(f"{base_url}/continue_generation", timeout=30)

    return after_each


def test_manager_spec_lists_its_endpoints(manager_server):
    url, _ = manager_server
    assert {"/allocate_rollout", "/schedule_request", "/finish_rollout"} <= set(_post_paths(url))


def test_native_server_spec_declares_request_bodies(native_server):
    url, _ = native_server
    spec = requests.get(f"{url}/openapi.json", timeout=10).json()
    body = spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "input_ids" in body["properties"] and "max_new_tokens" in json.dumps(body)
    assert "/update_weights_from_disk" in spec["paths"]


def test_manager_never_answers_5xx_to_generated_bodies(manager_server):
    url, service = manager_server
    failures = _fuzz_spec(url)
    assert not failures, "\n".join(failures[:10])
    assert requests.get(f"{url}/status", timeout=10).status_code == 200  # still serving


def test_manager_never_answers_5xx_to_non_json_or_nasty_bodies(manager_server):
    url, _ = manager_server
    failures = _fuzz_raw(url)
    assert not failures, "\n".join(failures[:10])
    assert (
        requests.post(f"{url}/allocate_rollout", json={"qid": "after-fuzz", "rank": 0}, timeout=10).status_code == 200
    )


def test_native_server_never_answers_5xx_to_generated_bodies(native_server):
    url, engine = native_server
    failures = _fuzz_spec(url, after_each=_unpause(url))
    assert not failures, "\n".join(failures[:10])
    _assert_still_generates(url)


def test_native_server_never_answers_5xx_to_non_json_or_nasty_bodies(native_server):
    url, engine = native_server
    failures = _fuzz_raw(url, after_each=_unpause(url))
    assert not failures, "\n".join(failures[:10])
    _assert_still_generates(url)


def _assert_still_generates(url):
    r = requests.post(
        f"{url}/generate",
        json={
            "input_ids": [5, 6, 7],
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) >= 1
