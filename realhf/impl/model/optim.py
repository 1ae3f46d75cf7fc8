"""AdamW and its learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math
from typing import Callable, Tuple

import torch

from realhf.api.cli_args import OptimizerConfig

LR_SCHEDULES = ("constant", "cosine")


def check_optimizer_config(cfg: OptimizerConfig, where: str = "actor.optimizer") -> None:
    """Raise ValueError naming the field for a value the trainer cannot use."""
    if cfg.type != "adam":
        raise ValueError(f"{where}.type must be 'adam', got {cfg.type!r}")
    if cfg.lr_scheduler_type not in LR_SCHEDULES:
        raise ValueError(f"{where}.lr_scheduler_type must be one of {LR_SCHEDULES}, got {cfg.lr_scheduler_type!r}")
    if not cfg.lr > 0:
        raise ValueError(f"{where}.lr must be > 0, got {cfg.lr}")
    if not 0 <= cfg.warmup_steps_proportion < 1:
        raise ValueError(f"{where}.warmup_steps_proportion must be in [0, 1), got {cfg.warmup_steps_proportion}")
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise ValueError(f"{where}.min_lr_ratio must be in [0, 1], got {cfg.min_lr_ratio}")
    if cfg.gradient_clipping < 0:
        raise ValueError(f"{where}.gradient_clipping must be >= 0 (0 disables it), got {cfg.gradient_clipping}")


def lr_factor(kind: str, total_steps: int, warmup_proportion: float, min_lr_ratio: float = 0.0) -> Callable[[int], float]:
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
    model: torch.nn.Module, cfg: OptimizerConfig, total_steps: int, where: str = "actor.optimizer"
) -> Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and a LambdaLR stepped once per optimizer step."""
    check_optimizer_config(cfg, where)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(cfg.lr_scheduler_type, total_steps, cfg.warmup_steps_proportion, cfg.min_lr_ratio)
    )
    return optimizer, schedule
