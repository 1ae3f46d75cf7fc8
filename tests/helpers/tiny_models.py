"""Tiny random-init Hugging Face causal LMs for tests.

`make_random_causal_lm(path, arch)` writes a complete HF model directory (config.json +
model.safetensors) that both transformers and realhf's own loaders read. Weights are drawn with a
larger std than HF's default (0.02) so that next-token distributions are peaked: with near-uniform
logits, greedy continuations would hinge on float rounding and comparisons between two correct
implementations would be flaky.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import torch

_BASE: Dict[str, Dict[str, Any]] = {
    "qwen2": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: two query heads per KV head
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,
    ),
    "llama": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,
    ),
    "gpt2": dict(
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,
    ),
}


def _config(arch: str, overrides: Dict[str, Any]):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "gpt2": GPT2Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny-model arch {arch!r}; choose one of {sorted(classes)}")
    kwargs = dict(_BASE[arch])
    kwargs.update(overrides)
    return classes[arch](**kwargs)


def make_random_causal_lm(path: str, arch: str = "qwen2", seed: int = 0, **config_overrides: Any) -> str:
    """Write a random-init model directory at `path` and return `path`.

    `config_overrides` go straight into the transformers config class, e.g.
    `num_hidden_layers=4`, `vocab_size=1024`, `eos_token_id=[1, 2]`.
    """
    from transformers import AutoModelForCausalLM

    config = _config(arch, config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Biases are zero-initialised by HF; random ones exercise the q/k/v bias path for real.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, config.initializer_range)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path
