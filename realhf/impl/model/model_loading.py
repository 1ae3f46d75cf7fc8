"""How the trainer loads an HF causal LM: safetensors only, in the configured dtype, with
gradient checkpointing when asked; the frozen reference policy; and the critic, a value head on
the same architecture.

The weights come from `ModelTrainEvalConfig.path` unless the caller names another directory
(the recovery checkpoint when a run resumes, `actor.path` for a reference without its own path).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from realhf.api.cli_args import ModelTrainEvalConfig
from realhf.base.dtypes import torch_dtype


def _check_safetensors(path: str) -> None:
    # safetensors only: a pytorch_model.bin is a pickle, and loading one can run code.
    if os.path.isdir(path) and not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise ValueError(
            f"model path {path!r} has no *.safetensors file; realhf loads only safetensors "
            "checkpoints (re-save it with save_pretrained(..., safe_serialization=True))"
        )


def _finish(model: torch.nn.Module, m: ModelTrainEvalConfig) -> torch.nn.Module:
    if m.gradient_checkpointing:
        # use_reentrant=False: the variant torch recommends, and the one that works under FSDP2.
        # transformers renamed the switch (5.24 warns, the old name goes in v6); requirements allow
        # versions from before the rename.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def load_causal_lm(m: ModelTrainEvalConfig, path: Optional[str] = None) -> torch.nn.Module:
    """The model at `path` (default `m.path`) in `m.dtype`, in train mode."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    path = path or m.path
    _check_safetensors(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(m.dtype), use_safetensors=True)
    return _finish(model.train(), m)  # transformers 5 returns it in eval mode


def load_value_model(m: ModelTrainEvalConfig, seed: int, path: Optional[str] = None) -> torch.nn.Module:
    """The critic: the transformer at `path` (default `m.path`) with a one-output linear head on
    every position (`AutoModelForTokenClassification`, num_labels=1; `.logits` is `[n, t, 1]`).
    A causal-LM checkpoint has no such head, so it starts random — from `seed`, so that every
    DP rank and every rerun builds the same one (the global RNG is left as it was)."""
    import transformers
    from transformers import AutoConfig, AutoModelForTokenClassification

    transformers.utils.logging.disable_progress_bar()
    path = path or m.path
    _check_safetensors(path)
    verbosity = transformers.utils.logging.get_verbosity()
    # "Some weights were newly initialized" is the point here, not a warning.
    transformers.utils.logging.set_verbosity_error()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # No dropout before the head (HF's default is 0.1): a value is a regression target,
            # and the critic's train and inference forwards must agree.
            # Set on the config: as a from_pretrained kwarg it reaches the model's __init__ (TypeError).
            config = AutoConfig.from_pretrained(path, num_labels=1)
            config.classifier_dropout = 0.0
            model = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=torch_dtype(m.dtype), use_safetensors=True
            )
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
    return _finish(model, m)
