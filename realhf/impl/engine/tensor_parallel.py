"""Tensor parallelism of the trainer's models on torch's DTensor APIs (`parallelize_module`).

Each decoder layer of a Qwen2 / Llama / Mistral-layout model is split Megatron-style over the
`tp` dimension of the trainer's device mesh:

    self_attn.q_proj, k_proj, v_proj   ColwiseParallel   (each rank computes its heads)
    self_attn.o_proj                   RowwiseParallel   (partial sums, all-reduced)
    mlp.gate_proj, up_proj             ColwiseParallel
    mlp.down_proj                      RowwiseParallel

so a layer's input and output are replicated over `tp` and each rank holds 1/tp of its
attention and MLP weights. HF's attention reshapes with `view(..., -1, head_dim)`, so it runs
on the local heads as they are (the head counts must divide by tp). Embeddings, norms and the
LM head (or a critic's value head) stay replicated over `tp` (LoRA adapters: `layer_plan`): every rank computes full-vocabulary
logits, so log-probs, entropy and the losses need no gather (the price is the LM head's memory
and compute on every tp rank, small next to the layers at the sizes this runs today). FSDP2 then
shards every parameter over the `dp` dimension (realhf.impl.engine.fsdp_engine).

Gradients then live on two meshes (2-D for the split weights, 1-D `dp` for the replicated
ones), which `torch.nn.utils.clip_grad_norm_` cannot stack; `clip_grad_norm` below takes each
mesh's norm on its own and combines them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def layer_plan(layer: torch.nn.Module) -> Dict[str, object]:
    """The `parallelize_module` plan of one decoder layer (module path → style).

    A projection that carries LoRA adapters (peft wraps it: `base_layer`, `lora_A.<adapter>` [r, in],
    `lora_B.<adapter>` [out, r]) is split so that the adapter's output lands where the base's does:
    column-wise, the base and B are split by output and A stays whole (its input is whole);
    row-wise, the base and A are split by input (A's partial sums all-reduced, as the base's are)
    and B stays whole. The adapters' sum then needs no extra communication."""
    plan: Dict[str, object] = {}
    for names, style in ((COLWISE, ColwiseParallel), (ROWWISE, RowwiseParallel)):
        for name in names:
            module = layer.get_submodule(name)
            if not hasattr(module, "base_layer"):
                plan[name] = style()
                continue
            plan[f"{name}.base_layer"] = style()
            split = "lora_B" if style is ColwiseParallel else "lora_A"
            for adapter in getattr(module, split):
                plan[f"{name}.{split}.{adapter}"] = style()
    return plan


def check_tp_fits(model: torch.nn.Module, layers: List[torch.nn.Module], tp: int, where: str) -> None:
    """A ValueError naming the model and what does not divide, before any collective runs."""
    cfg = model.config
    sizes = {
        "num_attention_heads": getattr(cfg, "num_attention_heads", None),
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None),
        "intermediate_size": getattr(cfg, "intermediate_size", None),
    }
    wrong = [f"{k}={v}" for k, v in sizes.items() if v is None or v % tp]
    if wrong:
        raise ValueError(
            f"{where}: tensor parallelism m{tp} needs the attention heads, key/value heads and MLP width "
            f"to divide by {tp}; {type(model).__name__} has {', '.join(wrong)} (lower m in allocation_mode)"
        )
    names = {n for n, _ in layers[0].named_modules()}
    missing = [n for n in (*COLWISE, *ROWWISE) if n not in names]
    if missing:
        raise ValueError(
            f"{where}: tensor parallelism splits decoder layers laid out as Qwen2/Llama/Mistral "
            f"({', '.join(COLWISE + ROWWISE)}); {type(layers[0]).__name__} of {type(model).__name__} lacks "
            f"{', '.join(missing)}"
        )


def apply_tp(layers: Iterable[torch.nn.Module], tp_mesh: DeviceMesh) -> None:
    """Split every decoder layer's attention and MLP (and their LoRA adapters) over `tp_mesh`, in place."""
    for layer in layers:
        parallelize_module(layer, tp_mesh, layer_plan(layer))


def clip_grad_norm(params: List[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for gradients on several device meshes: the global
    2-norm (each mesh's part gathered with `full_tensor`, then combined), and every gradient
    scaled by min(1, max_norm / (norm + 1e-6)) as torch does. The same value on every rank."""
    by_mesh: Dict[object, List[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            by_mesh[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p.grad)
    squares = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.float().square())
    total = torch.stack(squares).sum().sqrt() if squares else torch.tensor(0.0)
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    if coef < 1.0:
        for grads in by_mesh.values():
            torch._foreach_mul_(grads, coef)
    return total
