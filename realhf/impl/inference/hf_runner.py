"""The fallback runner for architectures the static-KV transformer does not implement.

`HFRunner` is a ModelRunner (see `realhf.impl.inference.runners`) that runs the HF model's own
forward, so the engine around it — queue, continuous batching, sampling, pause/abort, weight
swap, the HTTP protocol — is exactly the native one. Simple on purpose: it keeps each slot's
token sequence and recomputes the full forward of the running slots at every decode step (no
KV cache), which is O(length²) per token but correct for any causal LM. Use it for tests and
small models; Qwen2/Llama go through the fast static-KV runner.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from realhf.base.device import pick_device
from realhf.base.dtypes import torch_dtype
from realhf.impl.inference.transformer import eos_ids_from_config, read_hf_config


def _max_positions(cfg: dict) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if cfg.get(key):
            return int(cfg[key])
    raise ValueError(
        "config.json names no maximum length (max_position_embeddings / n_positions); set the engine's context_length"
    )


class HFRunner:
    """Any HF causal LM as a ModelRunner: each slot's tokens, the full forward at every step."""

    kind = "hf"

    def __init__(
        self,
        model_path: str,
        n_slots: int,
        context_len: int = 0,
        dtype: str = "float32",
        device: Optional[torch.device] = None,
    ):
        cfg = read_hf_config(model_path)
        self.dtype = torch_dtype(dtype)
        self.device = device or pick_device("cpu")
        self.model = self.load_weights(model_path)
        max_pos = _max_positions(cfg)
        if context_len > max_pos:
            raise ValueError(f"context length {context_len} exceeds the model's maximum {max_pos}")
        self.context_len = context_len or max_pos
        self.vocab_size = int(self.model.config.vocab_size)
        self.n_slots = n_slots
        self.eos_token_ids = eos_ids_from_config(cfg)
        self.seqs = torch.zeros(n_slots, self.context_len, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def _last_logits(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Right padding needs no attention mask: causal attention keeps real tokens from ever
        # seeing the padding after them, and position ids 0..len-1 are the defaults.
        logits = self.model(input_ids=tokens, use_cache=False).logits
        return logits[torch.arange(tokens.shape[0], device=self.device), lengths - 1].float()

    def prefill(self, slots, tokens, lengths):
        self.seqs[slots, : tokens.shape[1]] = tokens
        return self._last_logits(tokens, lengths)

    def decode(self, tokens, positions):
        n = tokens.shape[0]
        self.seqs[torch.arange(n, device=self.device), positions] = tokens
        width = int(positions.max()) + 1
        return self._last_logits(self.seqs[:n, :width], positions + 1)

    def move_slots(self, src, dst, length):
        if len(src):
            self.seqs[dst, :length] = self.seqs[src, :length]

    def load_weights(self, model_path: str):
        """A whole new model instance; the swap is a pointer change. safetensors only."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, use_safetensors=True)
        model.to(self.device).eval()  # loaded on the host, then moved: a no-op on the CPU
        old = getattr(self, "model", None)
        if old is not None and model.config.vocab_size != old.config.vocab_size:
            raise ValueError(
                f"checkpoint {model_path!r} has vocab {model.config.vocab_size}, the running model "
                f"{old.config.vocab_size}; a weight update cannot change the architecture"
            )
        return model

    def weights_from_state(self, state: Dict[str, torch.Tensor]):
        """A new model instance around `state` (tied heads tied again); every parameter but a
        tied head must be there, in the running model's shapes."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.model.config)
        own = dict(self.model.named_parameters())
        for name, t in state.items():
            if name in own and tuple(t.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"tensor {name!r} has shape {tuple(t.shape)}, the running model {tuple(own[name].shape)}"
                )
        state = {n: t.to(device=self.device, dtype=self.dtype) for n, t in state.items()}
        missing, _ = model.load_state_dict(state, strict=False, assign=True)
        model.tie_weights()
        still_meta = [n for n, p in model.named_parameters() if p.is_meta]
        if still_meta:
            raise KeyError(f"the new weights lack {len(still_meta)} tensors, e.g. {still_meta[:3]}")
        return model.eval()

    def set_weights(self, weights) -> None:
        self.model = weights
