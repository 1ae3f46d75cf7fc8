"""Pipeline parallelism of the trainer's models on torch's own `torch.distributed.pipelining`.

The world is pp x dp x tp (pp outermost). Every rank loads the whole HF model, then keeps only
its stage, the torchtitan way:

    stage s          decoder layers [first_s, last_s) (contiguous, split as evenly as possible)
    stage 0          + the token embeddings
    the last stage   + the final norm and the LM head (a critic: its `score` value head)

Every other module is removed (`embed_tokens`, `norm`, the head set to None; `layers` becomes a
ModuleDict keyed by the original layer index), so each remaining parameter keeps its original
name (FQN): the union of the stages' state dicts is the unsplit model's, and HF saves, streamed
weights and recovery checkpoints use the same names at every layout. The model's `forward` is
replaced by `StageForward`, which does what the installed transformers' Qwen2Model /
Qwen2ForCausalLM forward does with its part: embeddings (stage 0), rotary position embeddings
from the model's `rotary_emb`, the causal mask, its layers, then (last stage) norm and head.
Batches are right-padded and the mask is the plain causal one (no padding mask): the logits at
real positions are those of the padded-mask forward.

The activations between stages travel through `PipelineStage` + `ScheduleGPipe` /
`Schedule1F1B`, which need one static shape per call: the engine pads every micro-batch of a
call to one [rows, width] and builds the stage and schedule per call (`build_schedule`).

A tied LM head (`tie_word_embeddings`: the head is the embedding matrix) lives on two stages:
stage 0's embedding and the last stage's `lm_head.weight`, each its own copy. `sync_tied_grads`
sums their gradients (what the tied parameter of the unsplit model receives), so both copies
take the same step; the norm counts it once (`clip_grad_norm`).

Limits: measured at p2 only (the tiny test model has two layers; a middle stage of a tied model
takes no part in the head's gradient, by construction, untested); `forward` keeps each
micro-batch's stage output until the call ends (the schedule's forward cache; `[R, T, H]` per
micro-batch, the logits are reduced by `output_fn` on the last stage as they come); the stage and
schedule are rebuilt per call (their shapes change with the batch).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

TIED_HEAD = "lm_head.weight"  # the last stage's copy of a tied embedding


def stage_layers(n_layers: int, n_stages: int) -> List[range]:
    """The decoder layers of each stage: contiguous, sizes differing by at most one (the first
    stages take the extra ones)."""
    base, extra = divmod(n_layers, n_stages)
    bounds = [0]
    for s in range(n_stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return [range(bounds[s], bounds[s + 1]) for s in range(n_stages)]


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, model.base_model_prefix)


def is_tied(model: torch.nn.Module, value_head: bool) -> bool:
    return not value_head and bool(getattr(model.config, "tie_word_embeddings", False))


def split_model(model: torch.nn.Module, stage: int, n_stages: int, value_head: bool, where: str) -> None:
    """Keep stage `stage`'s modules of `model` (in place, original FQNs) and install its forward."""
    base = base_model(model)
    head = "score" if value_head else "lm_head"
    missing = [n for n in ("embed_tokens", "layers", "norm", "rotary_emb") if not hasattr(base, n)]
    if missing or not hasattr(model, head):
        raise ValueError(
            f"{where}: pipeline parallelism splits models laid out as Qwen2/Llama/Mistral (model.embed_tokens, "
            f"model.layers, model.norm, model.rotary_emb, {head}); {type(model).__name__} lacks "
            f"{', '.join(missing or [head])}"
        )
    n_layers = len(base.layers)
    if n_layers < n_stages:
        raise ValueError(
            f"{where}: pipeline parallelism p{n_stages} needs at least one decoder layer per stage; "
            f"{type(model).__name__} has {n_layers} (lower p in allocation_mode)"
        )
    mine = stage_layers(n_layers, n_stages)[stage]
    base.layers = torch.nn.ModuleDict({str(i): base.layers[i] for i in mine})
    first, last = stage == 0, stage == n_stages - 1
    if not first:
        base.embed_tokens = None
    if not last:
        base.norm = None
        setattr(model, head, None)
    model.forward = StageForward(model, first, last, value_head)


class StageForward:
    """One stage's forward (installed as the model's `forward`, so FSDP's root hooks run):
    `[R, T]` token ids (stage 0) or `[R, T, H]` hidden states in, `[R, T, H]` out, the last
    stage `[R, T, V]` logits (`[R, T, 1]` values), or `head(logits)` while `head` is set."""

    def __init__(self, model: torch.nn.Module, first: bool, last: bool, value_head: bool):
        self.model, self.first, self.last, self.value_head = model, first, last, value_head
        self.head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        base = base_model(self.model)
        h = base.embed_tokens(x) if self.first else x  # [R, T, H]
        position_ids = torch.arange(h.shape[1], device=h.device)[None]  # [1, T]
        mask_kwargs = dict(
            config=base.config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=position_ids
        )
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if getattr(base, "has_sliding_layers", False):
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        position_embeddings = base.rotary_emb(h, position_ids)  # (cos, sin) [1, T, head_dim]
        for i, layer in base.layers.items():
            h = layer(
                h,
                attention_mask=masks[base.config.layer_types[int(i)]],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
            )  # [R, T, H]
        if not self.last:
            return h
        h = base.norm(h)
        out = self.model.score(self.model.dropout(h)) if self.value_head else self.model.lm_head(h)  # [R, T, V|1]
        return out if self.head is None else self.head(out)


def build_schedule(
    model: torch.nn.Module,
    stage: int,
    n_stages: int,
    group: dist.ProcessGroup,
    device: torch.device,
    n_micro: int,
    input_meta: torch.Tensor,
    output_meta: torch.Tensor,
    loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
):
    """A PipelineStage of `model` and its schedule for `n_micro` micro-batches of one static
    shape (`input_meta` / `output_meta`: meta tensors of this stage's input and output, so the
    stage skips shape inference). With `loss_fn` (training) 1F1B, which keeps at most
    `n_stages` micro-batches' activations (GPipe where there are fewer micro-batches than
    stages); without it GPipe's forward. Gradients are summed, not averaged, over micro-batches
    (`scale_grads=False`): the engine's loss is already divided by the global weight."""
    pipe_stage = PipelineStage(
        model, stage, n_stages, device, input_args=input_meta, output_args=output_meta, group=group
    )
    if loss_fn is not None and n_micro >= n_stages:
        return Schedule1F1B(pipe_stage, n_micro, loss_fn=loss_fn, scale_grads=False)
    return ScheduleGPipe(pipe_stage, n_micro, loss_fn=loss_fn, scale_grads=False)


def tied_groups(pp: int, dp: int, tp: int) -> Dict[int, dist.ProcessGroup]:
    """rank → the group of the first and the last stage's ranks at its (dp, tp) position, for a
    tied head's gradient (every rank creates every group, as new_group requires)."""
    groups = {}
    for i in range(dp * tp):
        ranks = [i, (pp - 1) * dp * tp + i]
        group = dist.new_group(ranks)
        for r in ranks:
            groups[r] = group
    return groups


def sync_tied_grads(model: torch.nn.Module, first: bool, last: bool, group: dist.ProcessGroup) -> None:
    """The first stage's embedding gradient + the last stage's head gradient, on both: the
    gradient of the unsplit model's one tied matrix (both are sharded alike over dp)."""
    if first:
        param = base_model(model).embed_tokens.weight
    elif last:
        param = model.lm_head.weight
    else:
        return
    grad = param.grad
    if grad is None:
        grad = param.grad = torch.zeros_like(param)
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    dist.all_reduce(local, group=group)


def clip_grad_norm(
    params: List[torch.nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup, skip: List[torch.nn.Parameter]
) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` over all stages: each stage's squared 2-norm (per device
    mesh, gathered with `full_tensor`, as realhf.impl.engine.tensor_parallel.clip_grad_norm),
    summed over the pp group, and every gradient of the stage scaled by
    min(1, max_norm / (norm + 1e-6)). `skip` is in no norm (a tied head's second copy) but is
    scaled. The same value on every rank."""
    by_mesh: Dict[object, List[torch.Tensor]] = defaultdict(list)
    counted: Dict[object, List[torch.Tensor]] = defaultdict(list)
    skipped = {id(p) for p in skip}
    for p in params:
        if p.grad is not None:
            mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh[mesh].append(p.grad)
            if id(p) not in skipped:
                counted[mesh].append(p.grad)
    square = torch.zeros((), dtype=torch.float32)
    for grads in counted.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        square = square + norm.float().square().cpu()
    device = next((g.device for grads in by_mesh.values() for g in grads), torch.device("cpu"))
    square = square.to(device)
    dist.all_reduce(square, group=pp_group)
    total = square.sqrt()
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    if coef < 1.0:
        for grads in by_mesh.values():
            torch._foreach_mul_(grads, coef)
    return total
