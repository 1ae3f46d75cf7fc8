"""AdamW and its learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math
from typing import Callable, Tuple

import torch

from realhf.api.choices import LR_SCHEDULES
from realhf.api.cli_args import OptimizerConfig


def lr_factor(
    kind: str, total_steps: int, warmup_proportion: float, min_lr_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the peak LR at optimizer step `step` (0-based).

    Warm-up is linear from 1/warmup to 1 over `warmup_proportion · total_steps` steps; then
    'constant' stays at 1 and 'cosine' decays to `min_lr_ratio` at `total_steps`. Without a
    known horizon (`total_steps` = 0) there is no warm-up and cosine is refused.
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"lr_scheduler_type must be one of {LR_SCHEDULES}, got {kind!r}")
    if kind == "cosine" and total_steps <= 0:
        raise ValueError("lr_scheduler_type='cosine' needs the number of training steps (total_train_steps > 0)")
    warmup = int(warmup_proportion * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_optimizer(
    model: torch.nn.Module, cfg: OptimizerConfig, total_steps: int
) -> Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and a LambdaLR stepped once per optimizer step."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(cfg.lr_scheduler_type, total_steps, cfg.warmup_steps_proportion, cfg.min_lr_ratio)
    )
    return optimizer, schedule
