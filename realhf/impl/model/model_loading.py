"""How the trainer loads an HF causal LM: safetensors only, in the configured dtype, with
gradient checkpointing when asked; and the frozen reference policy.

The weights come from `ModelTrainEvalConfig.path` unless the caller names another directory
(the recovery checkpoint when a run resumes, `actor.path` for a reference without its own path).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from realhf.api.cli_args import ModelTrainEvalConfig
from realhf.base.dtypes import torch_dtype


def load_causal_lm(m: ModelTrainEvalConfig, path: Optional[str] = None) -> torch.nn.Module:
    """The model at `path` (default `m.path`) in `m.dtype`, in train mode."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    path = path or m.path
    # safetensors only: a pytorch_model.bin is a pickle, and loading one can run code.
    if os.path.isdir(path) and not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise ValueError(f"model path {path!r} has no *.safetensors file; realhf loads only safetensors "
                         "checkpoints (re-save it with save_pretrained(..., safe_serialization=True))")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(m.dtype), use_safetensors=True)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def load_frozen(m: ModelTrainEvalConfig, path: Optional[str] = None) -> torch.nn.Module:
    """`load_causal_lm` in eval mode with every parameter frozen (the reference policy)."""
    model = load_causal_lm(m, path).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
