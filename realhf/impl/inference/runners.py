"""The models behind the native engine ("runners"): the contract, and the static-KV runner.

A runner owns the weights and a slotted cache of the running requests; the engine
(`realhf.impl.inference.engine`) owns everything else — queue, slots' sampling state, pause,
abort, weight versions. `ModelRunner` is the whole contract between them:

    prefill(slots, tokens, lengths)   new prompts into free slots   -> logits [b, vocab]
    decode(tokens, positions)         one token for slots 0..n-1    -> logits [n, vocab]
    move_slots(src, dst, length)      compaction after requests leave
    load_weights(path) / set_weights  a weight swap, loaded off the engine thread

A runner lives on one `device` (`realhf.base.device.pick_device`, chosen where the server is
built): its weights and cache are there, the engine puts the slots' state and every tensor it
passes in there too, and the logits come back there.

`StaticKVRunner` (here) runs the Qwen2/Llama-family `StaticKVTransformer`; `HFRunner`
(`realhf.impl.inference.hf_runner`) runs any other HF causal LM through its own forward;
`realhf.impl.inference.factory` picks one for a model directory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Protocol

import torch

from realhf.base.device import pick_device
from realhf.base.dtypes import torch_dtype
from realhf.impl.inference.decode_attention import resolve_attention
from realhf.impl.inference.transformer import StaticKVTransformer, build_weights, load_model


class ModelRunner(Protocol):
    """What the engine needs from a model: a slotted cache with prefill, decode and moves."""

    vocab_size: int
    context_len: int
    n_slots: int
    eos_token_ids: List[int]
    device: torch.device

    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None: ...

    def load_weights(self, model_path: str) -> Any:
        """New weights from a checkpoint, in new tensors; callable from any thread."""

    def weights_from_state(self, state: Dict[str, torch.Tensor]) -> Any:
        """New weights from a whole set of tensors under the checkpoint's (HF) names, as a
        broadcast delivers them; raises naming a missing or mis-shaped tensor."""

    def set_weights(self, weights: Any) -> None: ...


class StaticKVRunner:
    """The Qwen2/Llama-family `StaticKVTransformer` as a ModelRunner."""

    kind = "static_kv"

    def __init__(
        self,
        model_path: str,
        n_slots: int,
        context_len: int = 0,
        dtype: str = "float32",
        attention: str = "auto",
        device: Optional[torch.device] = None,
    ):
        self.dtype = torch_dtype(dtype)
        self.device = device or pick_device("cpu")
        # Before the weights load: a kernel asked for on a GPU is refused without allocating there.
        kernel = resolve_attention(attention, self.dtype, self.device)
        args, weights = load_model(model_path, self.dtype, self.device)
        context_len = context_len or args.max_position_embeddings
        self.model = StaticKVTransformer(
            args, weights, n_slots, context_len, self.dtype, "kernel" if kernel is not None else "torch"
        )
        self.attention = "C kernel" if self.model.attention_kernel is not None else "torch matmuls"
        self.args = args
        self.vocab_size = args.vocab_size
        self.context_len = context_len
        self.n_slots = n_slots
        self.eos_token_ids = list(args.eos_token_ids)

    def prefill(self, slots, tokens, lengths):
        return self.model.prefill(slots, tokens, lengths)

    def decode(self, tokens, positions):
        return self.model.decode(tokens, positions)

    def move_slots(self, src, dst, length):
        self.model.move_slots(src, dst, length)

    def load_weights(self, model_path: str):
        args, weights = load_model(model_path, self.dtype, self.device)
        if args.shape_signature() != self.args.shape_signature():
            raise ValueError(
                f"checkpoint {model_path!r} has shape {args.shape_signature()} but the running model has "
                f"{self.args.shape_signature()}; a weight update cannot change the architecture"
            )
        return weights

    def weights_from_state(self, state: Dict[str, torch.Tensor]):
        new = build_weights(self.args, state, self.dtype, self.device)
        old = self.model.weights
        pairs = [("embed", new.embed, old.embed), ("lm_head", new.lm_head, old.lm_head)]
        for i, (a, b) in enumerate(zip(new.layers, old.layers)):
            pairs += [(f"layer {i} {f.name}", getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)]
        for what, a, b in pairs:
            if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
                shape = lambda t: None if t is None else tuple(t.shape)  # noqa: E731
                raise ValueError(
                    f"{what}: the new weights have shape {shape(a)}, the running model {shape(b)}; a weight "
                    "update cannot change the architecture"
                )
        return new

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)
