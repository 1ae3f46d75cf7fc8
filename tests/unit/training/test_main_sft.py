"""Supervised warm start: a short real run, the Hydra CLI, and evaluation (the pieces:
tests/unit/experiments/test_sft.py; data parallelism: test_sft_ranks.py)."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import paths
from realhf.api.cli_args import SFTConfig
from realhf.experiments.sft import train_sft
from realhf.impl.dataset.prompt_dataset import load_jsonl_prompts
from realhf.plugins.tasks.math_accuracy import evaluate_math_accuracy

REPO = Path(paths.REPO)


def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A fresh base model and a small dataset, built by the project's own scripts."""
    root = tmp_path_factory.mktemp("tiny")
    make_data = _load_script("make_math_dataset", REPO / "scripts" / "make_math_dataset.py")
    make_model = _load_script("make_tiny_model", REPO / "scripts" / "make_tiny_model.py")
    assert make_data.main(["--out", str(root / "data"), "--n-train", "256", "--n-test", "16", "--seed", "5"]) == 0
    assert make_model.main(["--out", str(root / "base"), "--seed", "5"]) == 0
    return root


def test_short_sft_run_lowers_the_loss_and_saves_a_loadable_hf_dir(tiny, tmp_path):
    out = tmp_path / "sft"
    cfg = SFTConfig(
        model_path=str(tiny / "base"), output_path=str(out), train_path=str(tiny / "data" / "train.jsonl"),
        steps=12, batch_size=16, warmup_steps=2, eval_n=-1, log_interval=100,
    )  # fmt: skip
    report = train_sft(cfg, log=lambda _: None)
    losses = report["losses"]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    # Random init starts near ln(vocab) ~ 5.5; a dozen steps at lr 3e-3 must cut that well down.
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3

    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}  # fmt: skip
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    before, after = load_file(tiny / "base" / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "sft"]  # the temporary save directory was renamed away


@pytest.mark.system
def test_hydra_cli_trains_reports_and_leaves_no_outputs_dir(tiny, tmp_path):
    out = tmp_path / "cli-out"
    args = [
        f"model_path={tiny / 'base'}", f"output_path={out}", f"train_path={tiny / 'data' / 'train.jsonl'}",
        f"test_path={tiny / 'data' / 'test.jsonl'}", "steps=3", "batch_size=4", "max_train_rows=32",
        "eval_n=4", "max_new_tokens=8",
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(REPO / "training" / "main_sft.py"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "SFT result:" in run.stdout and '"greedy"' in run.stdout and '"sampled"' in run.stdout
    assert (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli-out"]  # no outputs/ or .hydra/

    bad = subprocess.run(
        [sys.executable, str(REPO / "training" / "main_sft.py"), *args, "stepz=3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "stepz" in bad.stderr


def _answer_stub(tokenizer, rows, completion_for):
    by_prompt = {tuple(tokenizer.encode(r.prompt, add_special_tokens=False)): r for r in rows}
    calls = []

    def generate(prompts, temperature, max_new_tokens):
        calls.append((len(prompts), temperature, max_new_tokens))
        # EOS then junk: whatever follows EOS must be ignored.
        return [
            tokenizer.encode(completion_for(by_prompt[tuple(p)]), add_special_tokens=False)
            + [tokenizer.eos_token_id, *tokenizer.encode("#### 999", add_special_tokens=False)]
            for p in prompts
        ]

    return generate, calls


def test_evaluation_grades_what_generate_fn_returns(tiny):
    rows = load_jsonl_prompts(tiny / "data" / "test.jsonl")
    tok = AutoTokenizer.from_pretrained(tiny / "base")
    right, calls = _answer_stub(tok, rows, lambda r: r.solutions[0])
    res = evaluate_math_accuracy(
        tiny / "base", rows, temperature=1.0, n=3, max_new_tokens=9, batch_size=4, generate_fn=right
    )
    assert res["accuracy"] == 1.0 and res["n"] == 3 * len(rows) and res["n_prompts"] == len(rows)
    assert calls == [(3 * len(rows), 1.0, 9)]
    wrong, _ = _answer_stub(tok, rows, lambda r: r.solutions[0].rsplit("#### ", 1)[0] + "#### 1000")
    assert evaluate_math_accuracy(tiny / "base", rows, generate_fn=wrong)["accuracy"] == 0.0


def test_evaluation_with_hf_generate_runs_batched_and_is_seeded(tiny):
    rows = load_jsonl_prompts(tiny / "data" / "test.jsonl")[:6]
    kw = dict(temperature=1.0, n=2, max_new_tokens=6, batch_size=4)
    a = evaluate_math_accuracy(tiny / "base", rows, **kw, seed=3)
    b = evaluate_math_accuracy(tiny / "base", rows, **kw, seed=3)
    assert a == b and a["n"] == 12 and a["n_prompts"] == 6
    assert 0 < a["mean_new_tokens"] <= 6 and 0 <= a["truncated"] <= 1
