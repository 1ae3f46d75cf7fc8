"""The committed tiny-math assets: data reproducible from the script, a tokenizer that spells
digits one by one, keeps task words whole, and decodes every dataset text exactly, a base model
the script reproduces, and a warm start that leaves room for RL (well above chance, far from solved).

SFT reference (assets/tiny-math/README.md): greedy 0.616, sampled (T=1, seed 1) 0.318 on the 500
test prompts; the NOTES recipe targets 0.57-0.63 greedy and 0.29-0.35 sampled. The bounds
below allow for floating-point differences between machines, not for a different checkpoint.
"""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

from realhf.plugins.tasks.math_synthetic import generate_splits, to_rows, vocabulary
from realhf.impl.dataset.prompt_dataset import load_jsonl_prompts
from realhf.plugins.tasks.tiny_model import CHARS, SPECIALS, build_model, build_tokenizer
from realhf.plugins.environments.math_grader import MathGrader
from realhf.plugins.tasks.math_accuracy import evaluate_math_accuracy

from helpers.paths import TINY_MATH

ASSETS = Path(TINY_MATH)


@pytest.fixture(scope="module")
def data():
    return {split: load_jsonl_prompts(ASSETS / "data" / f"{split}.jsonl") for split in ("train", "test")}


@pytest.fixture(scope="module")
def tokenizers():
    # transformers 5 loads a qwen2 directory through Qwen2Tokenizer; PreTrainedTokenizerFast
    # reads tokenizer.json as written. Both must behave the same.
    path = ASSETS / "base"
    return AutoTokenizer.from_pretrained(path), PreTrainedTokenizerFast.from_pretrained(path)


def test_committed_data_is_what_the_script_produces(data):
    # README: make_math_dataset.py --n-train 10000 --n-test 500 --seed 1 (default knobs).
    train, test = generate_splits(10000, 500, seed=1)
    for split, problems in (("train", train), ("test", test)):
        lines = (ASSETS / "data" / f"{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == to_rows(problems, split)
    assert not {r.prompt for r in data["train"]} & {r.prompt for r in data["test"]}


def test_round_trip_is_exact_on_every_committed_text(data, tokenizers):
    auto, fast = tokenizers
    for rows in data.values():
        for r in rows:
            for text in (r.prompt, r.solutions[0], r.prompt + r.solutions[0]):
                ids = auto.encode(text, add_special_tokens=False)
                assert fast.encode(text, add_special_tokens=False) == ids
                assert auto.unk_token_id not in ids
                assert auto.decode(ids) == text == fast.decode(ids)


def test_task_words_are_single_tokens_and_digits_single_characters(tokenizers):
    auto, _ = tokenizers
    for w in (w for w in vocabulary() if len(w) > 1):  # single letters ("Q", "A") are characters
        for form in (w, " " + w):
            assert len(auto.encode(form, add_special_tokens=False)) == 1, form
    ids = auto.encode(" 15-12=3\n#### 3", add_special_tokens=False)
    assert auto.convert_ids_to_tokens(ids) == ["Ġ", "1", "5", "-", "1", "2", "=", "3", "Ċ", "#", "#", "#", "#", "Ġ", "3"]


def test_special_tokens_and_vocabulary_layout(tokenizers):
    auto, fast = tokenizers
    for tok in (auto, fast):
        assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == SPECIALS
        assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
        assert tok.encode("Q: x", add_special_tokens=True) == tok.encode("Q: x", add_special_tokens=False)
    # 4 specials + 96 characters + each word twice + the BPE intermediates of the words (shared
    # prefixes keep those fewer than the words: 258 tokens for 45 words when this was written).
    n_words = len([w for w in vocabulary() if len(w) > 1])
    assert 4 + len(CHARS) + 2 * n_words < len(auto) < 4 + len(CHARS) + 4 * n_words
    assert json.loads((ASSETS / "base" / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="".join(CHARS), max_size=60))
def test_any_printable_ascii_text_round_trips(tokenizers, text):
    auto, fast = tokenizers
    ids = auto.encode(text, add_special_tokens=False)
    assert ids == fast.encode(text, add_special_tokens=False)
    assert auto.decode(ids) == text


def test_base_model_config_matches_the_recipe_and_is_reproducible(tokenizers):
    auto, _ = tokenizers
    cfg = AutoConfig.from_pretrained(ASSETS / "base")
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 128, 4, 4)
    assert (cfg.intermediate_size, cfg.max_position_embeddings, cfg.tie_word_embeddings) == (512, 256, True)
    assert cfg.vocab_size == len(auto)
    gen = GenerationConfig.from_pretrained(ASSETS / "base")
    for c in (cfg, gen):
        assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 0)
    # README: make_tiny_model.py --seed 1.
    fresh = build_model(build_tokenizer(vocabulary()), seed=1).state_dict()
    committed = load_file(ASSETS / "base" / "model.safetensors")
    assert set(committed) <= set(fresh)
    assert all(torch.equal(committed[k], fresh[k]) for k in committed)


# ---- the SFT warm start ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    rows = load_jsonl_prompts(ASSETS / "data" / "test.jsonl")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with MathGrader(n_workers=1) as grader:
            return {
                name: evaluate_math_accuracy(ASSETS / "sft", rows, temperature=t, grader=grader, seed=1)
                for name, t in (("greedy", 0.0), ("sampled", 1.0))
            }
    finally:
        torch.set_num_threads(threads)


def test_committed_sft_greedy_accuracy_is_in_the_recipe_range(results):
    assert results["greedy"]["n"] == 500
    assert 0.57 <= results["greedy"]["accuracy"] <= 0.66


def test_committed_sft_sampled_accuracy_leaves_headroom_for_rl(results):
    assert 0.27 <= results["sampled"]["accuracy"] <= 0.37


def test_committed_sft_answers_end_with_eos(results):
    # The warm start must have learnt to stop; RL relies on EOS-terminated answers.
    assert results["greedy"]["truncated"] < 0.02

