"""SGLang conformance (realhf.testing.sglang_conformance): the fixtures written from SGLang v0.5.23's
source hold together, every request realhf's clients build is one that SGLang takes (no field it
does not know, a weight version as a string), the clients read SGLang's answers, and the built-in
server answers every example as SGLang does; `python -m realhf.testing.sglang_conformance` runs
the same suite from the shell and fails on a mismatch."""

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import aiohttp
import pytest

from helpers.paths import REPO
from realhf.api.cli_args import GenerationHyperparameters
from realhf.system.streams.http_json import GenerationError
from realhf.testing.sglang_conformance import fixtures
from realhf.testing.sglang_conformance.__main__ import main
from realhf.testing.sglang_conformance.recorder import Recorder
from realhf.testing.sglang_conformance.schema import field_names, mismatches
from realhf.testing.sglang_conformance.suite import check_request, run_suite

TINY = os.path.join(REPO, "assets", "tiny-math", "sft")
EOS = 2


# ---- SGLang-shaped answers, for the clients ----------------------------------------------------


def sglang_item(rid, ids=(7, 8, EOS), version="0"):
    """One finished /generate item as SGLang v0.5.23 answers it (stopped at EOS, with log-probs)."""
    n = len(ids)
    meta = {
        "id": rid,
        "finish_reason": {"type": "stop", "matched": EOS},
        "prompt_tokens": 3,
        "completion_tokens": n,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "num_retractions": 0,
        "weight_version": version,
        "weight_versions": [{"version": version, "start": 0, "end": n}],
        "e2e_latency": 0.01,
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
        "output_token_logprobs_length": n,
        "input_token_logprobs": [],
    }
    return {"output_ids": list(ids), "meta_info": meta}


def sglang_answer(recorder_url):
    """A server (SGLang's answers) that is its own manager (realhf's answers), for the clients."""

    def answer(method, path, body):
        if path == "/schedule_request":
            return 200, {"url": recorder_url(), "version": 0}
        if path in ("/allocate_rollout", "/finish_rollout"):
            return 200, {"success": True, "reason": ""}
        if path == "/routed_servers":
            return 200, {"servers": [recorder_url()]}
        if path == "/generate":
            n = (body.get("sampling_params") or {}).get("n", 1)
            items = [sglang_item(f"{body.get('rid')}-{j}" if n > 1 else str(body.get("rid"))) for j in range(n)]
            return 200, items if n > 1 else items[0]
        if path == "/get_model_info":
            return 200, {**MODEL_INFO, "tokenizer_path": TINY}
        if path == "/update_weights_from_disk":
            return 200, {"success": True, "message": "ok", "num_paused_requests": 0}
        if path in ("/pause_generation", "/continue_generation"):
            return 200, {"message": "done", "status": "ok"}
        if path == "/health":
            return 200, None
        return 404, {"error": f"no {path}"}

    return answer


MODEL_INFO = {
    "model_path": "/models/m",
    "served_model_name": "m",
    "tokenizer_path": None,
    "is_generation": True,
    "preferred_sampling_params": None,
    "weight_version": "4",
    "load_format": "auto",
    "reasoning_parser": None,
    "tool_call_parser": None,
    "disaggregation_mode": "null",
    "has_image_understanding": False,
    "has_audio_understanding": False,
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
}


@pytest.fixture
def sglang_stand_in():
    holder = {}
    with Recorder(answer=sglang_answer(lambda: holder["url"])) as rec:
        holder["url"] = rec.url
        yield rec


def assert_sglang_takes(calls, endpoint):
    bodies = [c.body for c in calls if c.path == endpoint]
    assert bodies, f"no call to {endpoint}"
    for i, body in enumerate(bodies):
        assert check_request(endpoint, body, f"{endpoint} #{i}") == []
    return bodies


# ---- the fixtures and the checker --------------------------------------------------------------


def test_the_fixtures_name_their_sglang_release_and_are_plain_json():
    assert fixtures.SGLANG["release"] == "v0.5.23" and len(fixtures.SGLANG["artifact_sha256"]) == 64
    json.dumps([fixtures.SGLANG, fixtures.ENDPOINTS, fixtures.EXAMPLES, fixtures.BROADCAST_EXAMPLES])
    used = {"/generate", "/pause_generation", "/continue_generation", "/update_weights_from_disk", "/abort_request"}
    used |= {"/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group"}
    used |= {"/flush_cache", "/get_model_info", "/health"}
    served_for_others = {"/get_server_info"}  # SGLang's clients read it; realhf's do not
    assert set(fixtures.ENDPOINTS) == used | served_for_others


def test_every_example_is_a_request_its_endpoint_takes_and_the_canned_answers_are_sglangs():
    values = {"model_path": "/m", "next_version": "3"}
    for ex in fixtures.EXAMPLES:
        if (
            fixtures.ENDPOINTS[ex["endpoint"]]["request"] is not None
            and ex["name"] != "an unknown sampling parameter is refused"
        ):
            body = {k: values.get(str(v).strip("{}"), v) for k, v in (ex["request"] or {}).items()}
            assert check_request(ex["endpoint"], body, ex["name"]) == []
    for ex in fixtures.BROADCAST_EXAMPLES:
        assert check_request(ex["endpoint"], ex["request"], ex["endpoint"]) == []
    # The answers the clients are tested against below are SGLang's shapes.
    assert mismatches(sglang_item("r"), fixtures.GENERATE_ITEM_WITH_LOGPROBS, strict=True) == []
    assert mismatches(MODEL_INFO, fixtures.MODEL_INFO, strict=True) == []


def test_the_checker_names_each_way_a_value_leaves_its_shape():
    disk = fixtures.UPDATE_WEIGHTS_FROM_DISK_REQUEST
    assert mismatches({"model_path": "/m", "weight_version": "3"}, disk) == []
    assert mismatches({"model_path": "/m", "weight_version": 3}, disk) == [
        "body.weight_version: int 3 fits none of str | null"
    ]
    assert mismatches({"weight_version": "3"}, disk) == ["body.model_path: missing (required)"]
    # SGLang refuses unknown sampling params; it ignores unknown top-level keys unless checked strictly.
    body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "max_tokens": 2}, "extra": 1}
    problems = mismatches(body, fixtures.GENERATE_REQUEST)
    assert len(problems) == 1 and problems[0].startswith("body.sampling_params.max_tokens: not a field SGLang knows")
    assert len(mismatches(body, fixtures.GENERATE_REQUEST, strict=True)) == 2
    item = sglang_item("r")
    del item["meta_info"]["weight_versions"]
    item["meta_info"]["output_token_logprobs"][0] = [-0.5, 7]
    assert mismatches(item, fixtures.GENERATE_ITEM_WITH_LOGPROBS) == [
        "body.meta_info.weight_versions: missing (required)",
        "body.meta_info.output_token_logprobs[0]: expected [number | null, int, str | null] (3 items), got list [-0.5, 7]",
    ]
    # A finish reason is read by its type; a realhf-declared answer key passes the strict check.
    item = sglang_item("r")
    item["meta_info"]["finish_reason"] = {"type": "length"}
    assert mismatches(item, fixtures.GENERATE_ITEM) == ["body.meta_info.finish_reason.length: missing (required)"]
    answer = {"success": True, "message": "", "num_paused_requests": 0, "weight_version": "3"}
    assert mismatches(answer, fixtures.WEIGHTS_FROM_DISK_ANSWER, strict=True) == []
    assert mismatches({**answer, "version": 3}, fixtures.WEIGHTS_FROM_DISK_ANSWER, strict=True) != []


def test_the_built_in_server_knows_sglangs_sampling_params_exactly():
    from realhf.system.gen_server.sglang_generate import SGLANG_SAMPLING_PARAMS

    assert SGLANG_SAMPLING_PARAMS == set(field_names(fixtures.SAMPLING_PARAMS))


# ---- realhf's clients send what SGLang takes and read what it answers ---------------------------


def test_the_rollout_client_sends_sglang_requests_and_reads_its_answers(sglang_stand_in):
    from realhf.system.rollout.generation_client import GenerationClient

    gconfig = GenerationHyperparameters(max_new_tokens=8, min_new_tokens=2, stop_token_ids=[5])

    async def main():
        async with GenerationClient(sglang_stand_in.url, eos_token_id=EOS) as client:
            one = await client.generate("q1", [1, 2, 3], gconfig)
            group = await client.generate_group("q2", [1, 2, 3], gconfig, n=3, one_request=True)
            return one, group

    one, group = asyncio.run(main())
    assert one.output_ids == [7, 8, EOS] and one.finish_reason == "stop" and one.versions == [0, 0, 0]
    assert [g.output_ids for g in group] == [[7, 8, EOS]] * 3
    bodies = assert_sglang_takes(sglang_stand_in.calls, "/generate")
    assert [b["sampling_params"].get("n", 1) for b in bodies] == [1, 3]
    assert bodies[0]["sampling_params"]["stop_token_ids"] == [5, EOS] and bodies[0]["return_logprob"] is True


def test_the_rollout_client_reads_sglangs_per_token_weight_versions():
    from realhf.system.rollout.generation_client import parse_generate_response

    def versions(spans, n=5):
        item = sglang_item("r", ids=[7] * n, version=spans[-1]["version"])
        item["meta_info"]["weight_versions"] = spans
        return parse_generate_response("http://s", item)[3]

    assert versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]) == [3, 3, 4, 4, 4]
    assert versions([{"version": "4", "start": 0, "end": 5}]) == 4
    # SGLang's default version is a name: the version the manager routed by stands for it.
    assert versions([{"version": "default", "start": 0, "end": 5}]) is None
    with pytest.raises(GenerationError, match="do not tile the 5 output tokens"):
        versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 3, "end": 5}])


def test_the_standalone_server_model_sends_sglang_requests(sglang_stand_in):
    from realhf.testing.models import ServerModel

    async def main():
        model = ServerModel(sglang_stand_in.url, eos_token_id=EOS)
        try:
            return await model.tokenizer_dir(), await model.generate("q", [1, 2, 3], GenerationHyperparameters())
        finally:
            await model.close()

    tokenizer_dir, out = asyncio.run(main())
    assert tokenizer_dir == TINY and out.output_ids == [7, 8, EOS]
    assert_sglang_takes(sglang_stand_in.calls, "/generate")
    assert [c.method for c in sglang_stand_in.calls if c.path == "/get_model_info"] == ["GET"]


def test_the_managers_disk_update_sends_sglang_requests_with_a_string_version(sglang_stand_in):
    from realhf.system.manager.weight_update import served_version, update_server

    async def main():
        async with aiohttp.ClientSession() as session:
            version = await served_version(session, sglang_stand_in.url, 10)
            await update_server(session, sglang_stand_in.url, "/runs/x/published_weights/actor/5", 5, 10)
            return version

    assert asyncio.run(main()) == 4
    assert [c.path for c in sglang_stand_in.calls] == [
        "/get_model_info",
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    for endpoint in ("/pause_generation", "/continue_generation"):
        assert_sglang_takes(sglang_stand_in.calls, endpoint)
    (body,) = assert_sglang_takes(sglang_stand_in.calls, "/update_weights_from_disk")
    assert body["weight_version"] == "5"  # SGLang refuses an integer with 400


def test_health_checks_and_the_servers_config_check_use_sglangs_get_endpoints(sglang_stand_in):
    from realhf.experiments.external_servers import check_external_servers_answer
    from realhf.system.manager.gserver_manager import check_health

    seen = []
    service = SimpleNamespace(
        config=SimpleNamespace(health_timeout=10.0),
        is_joining=lambda url: True,
        current_version=lambda: 3,
        observe_health=lambda url, ok, version, asked_at: seen.append((ok, version, asked_at)),
        forget_unregistered=lambda urls: None,
    )

    async def main():
        async with aiohttp.ClientSession() as session:
            await check_health(service, session, [sglang_stand_in.url])

    asyncio.run(main())
    check_external_servers_answer([sglang_stand_in.url], start_version=10)
    assert seen == [(True, 4, 3)]
    calls = [(c.method, c.path) for c in sglang_stand_in.calls]
    assert calls == [("GET", "/health"), ("GET", "/get_model_info"), ("GET", "/get_model_info")]
    for method, path in calls:
        assert method in fixtures.ENDPOINTS[path]["methods"]


# ---- the built-in server answers as SGLang does -------------------------------------------------


@pytest.fixture(scope="module")
def built_in_server():
    """The built-in server on the committed tiny model, with its tokenizer, in this process."""
    from realhf.impl.inference.factory import create_engine
    from realhf.system.gen_server.server_app import create_app
    from realhf.system.gen_server.sglang_generate import load_tokenizer
    from realhf.system.streams.http_thread import HttpServerThread

    engine = create_engine(TINY, max_running_requests=8, context_length=128, seed=1).start()
    server = HttpServerThread(create_app(engine, tokenizer=load_tokenizer(TINY)), "127.0.0.1", 0, name="gen")
    try:
        server.start(timeout=30)
        yield server.url
    finally:
        server.stop()
        engine.stop()


def test_the_built_in_server_answers_every_example_and_realhfs_weight_clients_as_sglang(built_in_server):
    outcomes = run_suite(built_in_server, control=True, weights=True, model_path=TINY, strict=True, timeout=60)
    lines = "\n".join(o.line() + "".join(f"\n    {p}" for p in o.problems[1:]) for o in outcomes)
    assert all(o.ok for o in outcomes), lines
    assert [o.endpoint for o in outcomes if not o.checks] == [], lines  # every endpoint was exercised
    # The broadcast went through the trainer's client: its requests were checked against SGLang's.
    assert {o.endpoint: o.checks for o in outcomes}["/update_weights_from_distributed"] >= 1


@pytest.mark.system
def test_the_command_passes_the_built_in_server_and_fails_a_server_that_is_not_sglang(built_in_server, capsys):
    proc = subprocess.run(
        [sys.executable, "-m", "realhf.testing.sglang_conformance", "--url", built_in_server, "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "PASS  POST/PUT /generate" in proc.stdout and lines[-1] == f"all {len(fixtures.ENDPOINTS)} endpoints conform"
    assert "SKIP  POST /pause_generation  (--control)" in proc.stdout
    # A server that answers an integer weight version and no served_model_name is not SGLang.
    wrong = {k: v for k, v in MODEL_INFO.items() if k != "served_model_name"}
    answer = sglang_answer(lambda: "")

    def not_sglang(method, path, body):
        return (200, {**wrong, "weight_version": 3}) if path == "/get_model_info" else answer(method, path, body)

    with Recorder(answer=not_sglang) as rec:
        assert main(["--url", rec.url]) == 1
    out = capsys.readouterr().out
    assert "FAIL  GET /get_model_info  'model info': body.served_model_name: missing (required) (+1 more)" in out
    assert "PASS  GET /health" in out and out.splitlines()[-1].endswith("failed")
