"""realhf's server around the real vLLM (its CPU build, from .venv-vllm) as a child process on
loopback: SGLang's /generate, log-probs against the HF forward the trainer runs, weight updates
from disk, aborts. Skipped where `bash scripts/setup_env.sh vllm` has not made .venv-vllm."""

import json
import os
import time
import urllib.request
from typing import List

import pytest
import torch

from helpers.http import http
from helpers.sglang_client import generate
from helpers.wait import wait_for
from realhf.api.cli_args import VLLMConfig
from realhf.base.network import find_free_port
from realhf.impl.inference.server_process import ServerProcess
from realhf.impl.inference.vllm_launcher import DEFAULT_PYTHON, build_vllm_command, server_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.access(DEFAULT_PYTHON, os.X_OK), reason="no .venv-vllm: `bash scripts/setup_env.sh vllm` makes it"
    ),
]

PROMPTS = [[3 + i, 10 + 2 * i, 40 + i, 7] for i in range(8)]
# fp32 both sides; vLLM's CPU attention and matmuls sum in another order than HF's eager forward.
LOGPROB_ATOL = 1e-4


# vLLM's CPU attention takes head sizes of 32 and up; the suite's random Qwen2 has 16.
HEADS_32 = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from helpers.hf_reference import HFReference
    from helpers.tiny_models import make_random_causal_lm

    a = make_random_causal_lm(str(tmp_path_factory.mktemp("qwen32_a")), "qwen2", seed=0, **HEADS_32)
    b = make_random_causal_lm(str(tmp_path_factory.mktemp("qwen32_b")), "qwen2", seed=1, **HEADS_32)
    return a, b, HFReference(a), HFReference(b)


@pytest.fixture(scope="module")
def hf_ref(models):
    return models[2]


@pytest.fixture(scope="module")
def hf_ref_b(models):
    return models[3]


@pytest.fixture(scope="module")
def vllm_server(models, tmp_path_factory):
    qwen_path = models[0]
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    port = find_free_port("127.0.0.1")
    cfg = VLLMConfig(context_length=512, max_num_seqs=16, kv_cache_gib=0.25, cpu_threads_bind="nobind")
    cmd = build_vllm_command(DEFAULT_PYTHON, qwen_path, "127.0.0.1", port, cfg, seed=1, weight_version=3)
    server = ServerProcess(cmd, f"http://127.0.0.1:{port}", str(log), startup_timeout=300, env=server_env({}))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _logprobs(answer):
    return torch.tensor([t[0] for t in answer["meta_info"]["output_token_logprobs"]])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_tokens_carry_the_log_probs_of_the_trainers_forward(vllm_server, hf_ref, temperature):
    body = {
        "input_ids": PROMPTS,
        "sampling_params": {"max_new_tokens": 24, "temperature": temperature, "ignore_eos": True},
        "return_logprob": True,
    }
    status, answers = http("POST", f"{vllm_server.url}/generate", body, timeout=120)
    assert status == 200, answers
    assert len(answers) == len(PROMPTS)
    worst = 0.0
    for prompt, a in zip(PROMPTS, answers):
        assert len(a["output_ids"]) == 24 and a["meta_info"]["finish_reason"]["type"] == "length"
        assert a["meta_info"]["weight_version"] == "3"
        ref = hf_ref.logprobs(prompt, a["output_ids"], temperature)
        worst = max(worst, float((_logprobs(a) - ref).abs().max()))
    print(f"vLLM vs HF fp32 log-probs at T={temperature}: max abs diff {worst:.2e} over {24 * len(PROMPTS)} tokens")
    assert worst <= LOGPROB_ATOL


def test_n_samples_and_greedy_answers_equal_hfs(vllm_server, hf_ref):
    status, answers = http(
        "POST",
        f"{vllm_server.url}/generate",
        {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 8, "n": 4}},
        timeout=120,
    )
    assert status == 200 and len(answers) == 4, answers
    greedy = generate(vllm_server.url, PROMPTS[1], max_new_tokens=16, temperature=0.0, ignore_eos=True)
    assert greedy["output_ids"] == hf_ref.greedy(PROMPTS[1], 16)


def test_new_weights_from_disk_change_the_answers_and_the_version(vllm_server, models, hf_ref_b):
    url, qwen_path_b = vllm_server.url, models[1]
    t0 = time.monotonic()
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": qwen_path_b, "weight_version": 4})
    assert status == 200 and body["success"] is True, body
    print(f"vLLM weight update from disk: {time.monotonic() - t0:.2f}s")
    after = generate(url, PROMPTS[2], max_new_tokens=16, temperature=0.7, ignore_eos=True)
    assert after["meta_info"]["weight_version"] == "4"
    ref = hf_ref_b.logprobs(PROMPTS[2], after["output_ids"], 0.7)
    assert torch.allclose(_logprobs(after), ref, atol=LOGPROB_ATOL)
    greedy = generate(url, PROMPTS[2], max_new_tokens=16, temperature=0.0, ignore_eos=True)["output_ids"]
    assert greedy == hf_ref_b.greedy(PROMPTS[2], 16)
    # Another architecture is refused before vLLM reads it (a failed in-place load would leave
    # vLLM's model half loaded); version 4 keeps serving.
    from helpers.tiny_models import make_random_causal_lm

    wider = make_random_causal_lm(str(models[1]) + "-wider", "qwen2", seed=2, **{**HEADS_32, "hidden_size": 128})
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": wider, "weight_version": 5})
    assert status == 400 and body["success"] is False and "hidden_size 128 (served: 64)" in body["message"], body
    assert generate(url, PROMPTS[2], max_new_tokens=2)["meta_info"]["weight_version"] == "4"
    # Versions never go back: refused, and version 4 keeps serving.
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": qwen_path_b, "weight_version": 2})
    assert status == 409 and body["success"] is False
    assert http("GET", f"{url}/get_model_info")[1]["weight_version"] == "4"


def _abort_said(log_path, rid: str, timeout: float = 30.0) -> str:
    """The server's log line for the abort of `rid` (written before it answers the abort)."""
    marker = f"abort_request {rid!r}: "

    def said():
        with open(log_path, errors="replace") as f:
            return next((line.split(marker, 1)[1].strip() for line in f if marker in line), None)

    return wait_for(said, timeout, f"a line {marker!r} in the server log {log_path}", interval=0.1)


def _abort_one_of(server, n: int, prefix: str, target: int, running: bool = False) -> List[str]:
    """Stream `n` answers of 480 tokens (16 decode at a time, max_num_seqs) as one request, abort
    the `target`-th, and return every answer's finish type (the aborted one's partial answer
    checked). `running=False`: the abort goes out once the first token of any answer arrives
    (the target may still be queued). `running=True`: once the target's own first tokens arrive,
    so it is mid-answer.

    This client reads the stream behind the engine: 16 answers of 480 tokens take 2-3 s on an
    idle 2-core host, and a client starved that long holds one token of an answer the server
    has finished (the suite at `670c376` and `caf9041`: the target "ran to its full length"; a
    client held back 2 s reproduces it). The server's log says whether the abort found the
    target queued or running; a try where it had ended already is run again, five tries at most.
    The abort is sent on the stream rather than on the server's running-requests gauge: one
    wave of 16 short answers of the test's tiny model can end between two polls of the gauge on a
    loaded host (CI, stop 58)."""
    for attempt in range(5):
        rid = f"{prefix}{attempt}"
        body = {
            "input_ids": [PROMPTS[i % len(PROMPTS)] for i in range(n)],
            "sampling_params": {"max_new_tokens": 480, "ignore_eos": True},
            "rid": [f"{rid}-{i}" for i in range(n)],
            "stream": True,
        }
        req = urllib.request.Request(
            f"{server.url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        last, abort_status, held_at_abort = {}, None, None
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert resp.status == 200
            for line in resp:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                item = json.loads(line[len(b"data:") :])
                assert "error" not in item, item
                last[item["index"]] = item
                if abort_status is None and (not running or item["index"] == target):
                    held_at_abort = len(last[target]["output_ids"]) if target in last else 0
                    abort_status, _ = http("POST", f"{server.url}/abort_request", {"rid": f"{rid}-{target}"})
        assert abort_status == 200 and sorted(last) == list(range(n)), (abort_status, sorted(last))
        said = _abort_said(server.log_path, f"{rid}-{target}")
        if said.startswith("no such request"):
            continue  # ended on the server before the abort came: not what this test asks
        assert said == "1 request(s) aborted", said
        finishes = [last[i]["meta_info"]["finish_reason"]["type"] for i in range(n)]
        partial = len(last[target]["output_ids"])
        assert finishes[target] == "abort" and held_at_abort <= partial < 480, (finishes, held_at_abort, partial)
        return finishes
    pytest.fail(f"in 5 tries answer {target} had always ended on the server before this client's abort reached it")


def test_an_aborted_request_returns_its_partial_answer(vllm_server):
    # 16 answers of 480 tokens decode for seconds: one of them is aborted mid-answer.
    assert _abort_one_of(vllm_server, 16, "long", 3, running=True).count("length") == 15


def test_an_abort_that_reaches_a_request_still_queued_ends_it(vllm_server):
    # 48 answers, 16 at a time: the 41st waits two waves. An abort that reached vLLM before the
    # request itself did was a no-op there (the server's count of requests in flight includes
    # those not yet handed to vLLM), and the request then ran to its full length; it now ends.
    assert _abort_one_of(vllm_server, 48, "queued", 40).count("length") == 47


@pytest.mark.slow  # a benchmark's smoke test, as the others (tests/unit/scripts/test_bench.py)
def test_the_engine_benchmark_measures_both_servers(no_leftover_processes):
    import json
    import subprocess
    import sys

    from helpers.paths import REPO

    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench.vllm_engine", "--short"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    tiny = result["models"]["tiny"]
    assert result["bench"] == "vllm_engine" and tiny["native"]["8"] > 0 and tiny["vllm"]["8"] > 0
    assert "vLLM / built-in" in proc.stdout
