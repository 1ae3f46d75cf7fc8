"""The fallback engine (HF forward) on an architecture the static-KV runner does not implement."""

import pytest
import torch

from helpers.hf_reference import HFReference
from helpers.http import http
from helpers.sglang_client import generate
from realhf.impl.inference.factory import engine_kind_for
from realhf.impl.inference.hf_runner import HFRunner
from realhf.impl.inference.request import GenerateRequest, SamplingParams

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def gpt2_ref(gpt2_path):
    return HFReference(gpt2_path)


@pytest.fixture(scope="module")
def native_server_model(gpt2_path):
    return gpt2_path, 0, 4  # context 0: the model's own; engine kind "auto"


@pytest.fixture(scope="module")
def gpt2_server(native_server):
    url, engine = native_server
    return engine, url


def test_auto_kind_picks_the_hf_runner_for_gpt2_and_static_kv_for_qwen2(gpt2_path, qwen_path):
    assert engine_kind_for(gpt2_path) == "hf"
    assert engine_kind_for(qwen_path) == "static_kv"


def test_gpt2_greedy_over_http_equals_hf_greedy_with_exact_logprobs(gpt2_server, gpt2_ref):
    engine, url = gpt2_server
    assert isinstance(engine.runner, HFRunner)
    for prompt in ([5, 6, 7], [9], [10, 11, 12, 13, 14, 15]):
        out = generate(url, prompt, max_new_tokens=16, temperature=0.0, ignore_eos=True)
        assert out["output_ids"] == gpt2_ref.greedy(prompt, 16)
        got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(got, gpt2_ref.logprobs(prompt, out["output_ids"], 0.0), atol=1e-4)


def test_gpt2_sampled_answers_in_a_continuous_batch_have_exact_logprobs(gpt2_server, gpt2_ref):
    engine, _ = gpt2_server
    prompts = [[3 + i] * (1 + i % 4) for i in range(10)]  # 10 requests through 4 slots
    futures = [
        engine.submit(GenerateRequest(p, SamplingParams(max_new_tokens=6 + i, temperature=0.9, ignore_eos=True)))
        for i, p in enumerate(prompts)
    ]
    for i, (p, f) in enumerate(zip(prompts, futures)):
        res = f.result(60)
        assert len(res.output_ids) == 6 + i
        want = gpt2_ref.logprobs(p, res.output_ids, 0.9)
        assert torch.allclose(torch.tensor(res.output_logprobs), want, atol=1e-4)


def test_gpt2_weight_swap_and_pause_work_through_the_same_protocol(gpt2_server, tmp_path):
    from helpers.tiny_models import make_random_causal_lm

    _, url = gpt2_server
    other = make_random_causal_lm(str(tmp_path / "gpt2_b"), "gpt2", seed=5)
    before = generate(url, [5, 6], max_new_tokens=12, temperature=0.0, ignore_eos=True)
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": other, "weight_version": 2})
    assert status == 200 and body["success"], body
    after = generate(url, [5, 6], max_new_tokens=12, temperature=0.0, ignore_eos=True)
    assert after["meta_info"]["weight_version"] == "2" and after["output_ids"] != before["output_ids"]
    assert after["output_ids"] == HFReference(other).greedy([5, 6], 12)
    assert http("POST", f"{url}/pause_generation", {})[0] == 200
    assert http("POST", f"{url}/continue_generation", {})[0] == 200
