"""LoRA on the actor (`actor.lora`): PEFT adapters on a frozen base, the base as the reference,
and the merged weights the generation servers load.

    apply_lora(model, cfg)        the HF model wrapped by peft (`get_peft_model`): every base weight
                                  frozen, a trainable A [r, in] and B [out, r] (B starts at 0) on each
                                  target linear module; applied before FSDP2 shards the model
    merged_state_dict(state, s)   plain HF names and weights W + s·B@A (s = alpha / r) from the
                                  PEFT model's (full, gathered) state dict: what `save_hf` publishes
    BaseModelView(actor_engine)   the reference role: the actor's own model with its adapters
                                  disabled (peft's `disable_adapter()`), so there is no second copy

peft is imported only when `actor.lora.r > 0` (the `lora` extra).
"""

from __future__ import annotations

import warnings
from typing import Dict, List

import torch

from realhf.api.cli_args import LoRAConfig

_PEFT_PREFIX = "base_model.model."
_BASE = ".base_layer."


def _peft():
    try:
        import peft
    except ImportError as e:
        raise ImportError("actor.lora.r > 0 needs peft: pip install 'realhf[lora]'") from e
    return peft


def linear_module_names(model: torch.nn.Module) -> List[str]:
    """The last name part of every linear module except the LM head (what target_modules may name)."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] != "lm_head"
        }
    )


def check_target_modules(model: torch.nn.Module, cfg: LoRAConfig, field: str = "actor.lora.target_modules") -> None:
    """Every target names a linear module of `model` (the LM head is refused: tied to the input
    embeddings in the models here, a merged head could not be published as one tensor)."""
    known = linear_module_names(model)
    missing = sorted(set(cfg.target_modules) - set(known))
    if not cfg.target_modules or missing:
        raise ValueError(
            f"{field}={list(cfg.target_modules)}: {type(model).__name__} has no linear module named "
            f"{missing or '(empty list)'}; its linear modules are {known}"
        )


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig, seed: int) -> torch.nn.Module:
    """`model` wrapped in a peft LoRA model: base weights frozen, adapters trainable. A starts
    random from `seed` (the same on every DP rank and every rerun; the global RNG is left as it
    was), B at zero, so the wrapped model computes what the base does."""
    peft = _peft()
    check_target_modules(model, cfg)
    config = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers a deprecated question (is_gradient_checkpointing); nothing to act on.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def merged_state_dict(state: Dict[str, torch.Tensor], scaling: float) -> Dict[str, torch.Tensor]:
    """The plain HF state dict of a LoRA model's `state` (full tensors, PEFT names): each adapted
    weight becomes W + scaling·B@A (computed in float32, stored in W's dtype); the others are
    passed through under their HF names (no copy)."""
    out: Dict[str, torch.Tensor] = {}
    adapters: Dict[str, Dict[str, torch.Tensor]] = {}  # module name -> {"A": [r, in], "B": [out, r]}
    for key, tensor in state.items():
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        if ".lora_A." in name or ".lora_B." in name:
            module, kind = name.split(".lora_")[0], name.split(".lora_")[1][0]
            adapters.setdefault(module, {})[kind] = tensor
        else:
            out[name.replace(_BASE, ".")] = tensor
    for module, ab in adapters.items():
        weight = out[f"{module}.weight"]  # [out, in]
        delta = scaling * (ab["B"].float() @ ab["A"].float())  # [out, r] @ [r, in]
        out[f"{module}.weight"] = (weight.float() + delta).to(weight.dtype)
    return out


class BaseModelView:
    """The reference policy of a LoRA actor: `forward` of the actor's engine with the adapters
    disabled, i.e. the frozen base weights, which the actor shares. Only `forward` (the
    reference is never trained, saved or recovered)."""

    def __init__(self, actor_engine):
        self.actor = actor_engine
        self.sharded = actor_engine.sharded

    @property
    def n_params(self) -> int:
        return self.actor.n_params - self.actor.n_trainable

    def forward(self, batch, output_fn) -> torch.Tensor:
        with self.actor.model.disable_adapter():
            return self.actor.forward(batch, output_fn)

    def destroy(self) -> None:
        """Nothing of its own: the actor's engine releases the model."""
