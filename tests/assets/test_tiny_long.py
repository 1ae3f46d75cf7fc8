"""The committed tiny-long assets: a base model the script reproduces, a tokenizer that spells the
task exactly, and a warm start whose answers vary widely in length and that leaves room for RL,
measured through the task (the math-single-step agent with the math environment, check_work).

Warm start (assets/tiny-long/README.md, scripts/bench/long_task.py on 500 x 8): greedy 0.796,
sampled (T=1) 0.562; the bounds allow for sampling differences, not for another checkpoint.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from helpers.paths import REPO
from realhf.api.cli_args import EnvConfig
from realhf.api.worker_configs import EvaluatorConfig
from realhf.plugins.tasks.long_math import generate_splits, vocabulary
from realhf.plugins.tasks.tiny_model import build_model, build_tokenizer
from realhf.system.evaluator.task_eval import evaluate_weights
from scripts.make_long_math_task import MAX_POSITIONS

ASSETS = Path(REPO) / "assets" / "tiny-long"


def test_base_model_is_what_the_script_produces():
    tok = AutoTokenizer.from_pretrained(ASSETS / "base")
    assert len(tok) == len(build_tokenizer(vocabulary()))
    cfg = AutoConfig.from_pretrained(ASSETS / "sft")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.max_position_embeddings) == (2, 128, MAX_POSITIONS)
    fresh = build_model(build_tokenizer(vocabulary()), seed=1, max_positions=MAX_POSITIONS).state_dict()
    committed = load_file(ASSETS / "base" / "model.safetensors")
    assert committed and all(torch.equal(committed[k], fresh[k]) for k in committed)


def test_the_committed_tokenizer_round_trips_the_task_text():
    tok = AutoTokenizer.from_pretrained(ASSETS / "sft")
    for split in generate_splits(100, 100, 50, seed=1).values():
        for p in split:
            for text in (p.prompt, p.completion):
                ids = tok.encode(text, add_special_tokens=False)
                assert tok.decode(ids) == text and tok.unk_token_id not in ids


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from scripts.make_long_math_task import main as make_task

    out = tmp_path_factory.mktemp("long")
    assert make_task(["--out", str(out), "--data-only", "--n-train", "1"]) == 0  # the held-out rows
    cfg = EvaluatorConfig(
        test_path=str(out / "data" / "test.jsonl"), env=EnvConfig(check_work=True), max_new_tokens=768, batch_size=256
    )
    greedy, sampled = evaluate_weights(cfg, str(ASSETS / "sft"), [(0.0, 1), (1.0, 2)], 500)
    return {"greedy": greedy, "sampled": sampled}


def test_committed_sft_solves_short_problems_and_leaves_room_on_long_ones(results):
    greedy, sampled = results["greedy"], results["sampled"]
    assert greedy["n_prompts"] == 500 and greedy["failed"] == 0
    assert 0.77 <= greedy["accuracy"] <= 0.82, greedy["accuracy"]
    assert 0.52 <= sampled["accuracy"] <= 0.60, sampled["accuracy"]
    assert greedy["accuracy"] - sampled["accuracy"] > 0.15  # what RL sharpens
    # Answers of very different lengths: a mean far above the shortest (8 tokens), none cut off greedily.
    assert 100 <= greedy["mean_new_tokens"] <= 150 and greedy["truncated"] == 0.0
