"""The algorithm menu: what `ppo.adv_estimator`, `ppo.loss_agg_mode` and `ppo.kl_target` name.

    grpo_advantages, ...  the built-in per-sample advantage estimators (their specs, with
                          where the KL goes, are declared in realhf.api.algorithms)
    LOSS_AGGREGATIONS     name → how per-token losses become a micro-batch's loss sum, and the
                          weight the engine divides the minibatch's sum by
    KLController          the KL coefficient: fixed (`kl_ctl`) or adapted toward `kl_target`

The policy losses (`ppo.policy_loss`) are the surrogates of
realhf.impl.model.utils.ppo_functional, beside the loss they plug into. Policy losses and
advantage estimators are open menus (realhf.api.algorithms: a built-in, a registered name or a
user's `module:function`); the aggregations are a closed one, keyed by the tuple of
realhf.api.choices that validation checks the config against (`lookup` refuses an unknown name
naming the field and the choices).

Aggregations keep the engine's contract (docs/architecture.md §7): the loss of a minibatch is
Σ_ranks Σ_micro-batches loss_sum / Σ_ranks Σ_micro-batches weight. Every mode's sum and weight
add up over rows, and micro-batches and DP ranks split a minibatch by rows, so DP=N and any
micro-batching give the update DP=1 gives on the whole minibatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, TypeVar

import torch

from realhf.api.algorithms import AdvantageEstimator, adv_estimator
from realhf.api.choices import LOSS_AGG_MODES
from realhf.impl.model.utils import ppo_functional as F

T = TypeVar("T")


def lookup(registry: Mapping[str, T], name: str, field: str) -> T:
    if name not in registry:
        raise ValueError(f"{field}={name!r}: choose one of {list(registry)}")
    return registry[name]


# ---------------------------------------------------------------------------------------------
# Advantage estimators
# ---------------------------------------------------------------------------------------------


def batch_norm_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """`(r − mean) / sqrt(var + 1e-5)` over every sample of the step on all DP ranks (a collective)."""
    return F.masked_normalization(scores, all_reduce=True)


def grpo_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    return F.grpo_advantages(scores, group_ids, norm_std=True)


def dr_grpo_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    return F.grpo_advantages(scores, group_ids, norm_std=False)


def estimator(name: str) -> AdvantageEstimator:
    """A built-in, registered or `module:function` estimator (realhf.api.algorithms)."""
    return adv_estimator(name)


# ---------------------------------------------------------------------------------------------
# Loss aggregation
# ---------------------------------------------------------------------------------------------


def _row_counts(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dim=-1)  # [n] trained tokens per row


@dataclass(frozen=True)
class LossAggregation:
    # (per-token loss [n, w], 0 outside the mask; mask [n, w]) → the micro-batch's loss sum
    loss_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # mask [n, w] → what the sum is divided by, summed over micro-batches and DP ranks
    weight: Callable[[torch.Tensor], float]


def _seq_count(mask: torch.Tensor) -> float:
    # A row without trained tokens has no loss to average: it does not count as a sequence.
    return float((_row_counts(mask) > 0).sum())


LOSS_AGGREGATIONS: Dict[str, LossAggregation] = {
    "token-mean": LossAggregation(lambda loss, mask: loss.sum(), lambda mask: float(mask.sum())),
    "seq-mean-token-mean": LossAggregation(
        lambda loss, mask: (loss.sum(dim=-1) / _row_counts(mask).clamp(min=1)).sum(), _seq_count
    ),
    "seq-mean-token-sum": LossAggregation(lambda loss, mask: loss.sum(), _seq_count),
}
assert tuple(LOSS_AGGREGATIONS) == LOSS_AGG_MODES, "every ppo.loss_agg_mode choice needs an entry"


def aggregation(name: str) -> LossAggregation:
    return lookup(LOSS_AGGREGATIONS, name, "ppo.loss_agg_mode")


# ---------------------------------------------------------------------------------------------
# The KL coefficient
# ---------------------------------------------------------------------------------------------


class KLController:
    """The coefficient of the KL to the reference: `kl_ctl` throughout when `kl_target` is 0,
    else the proportional controller of Ziegler et al. (2019), starting at `kl_ctl`:

        coef ← coef · (1 + clip(kl / kl_target − 1, −0.2, 0.2) · n_samples / kl_horizon)

    once per train step, with `kl` the step's measured KL (the token mean over all DP ranks) and
    `n_samples` the step's samples over all ranks. Every rank sees the same global numbers, so
    every rank holds the same coefficient without a collective of its own.
    """

    def __init__(self, kl_ctl: float, kl_target: float = 0.0, kl_horizon: float = 10000.0):
        self.value, self.target, self.horizon = float(kl_ctl), float(kl_target), float(kl_horizon)

    @property
    def adaptive(self) -> bool:
        return self.target > 0

    def update(self, kl: float, n_samples: float) -> float:
        if self.adaptive:
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_samples / self.horizon
        return self.value

    def state_dict(self) -> Dict[str, Any]:
        return {"kl_coef": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Only an adaptive coefficient is restored: a fixed one is whatever the config says now."""
        if self.adaptive and "kl_coef" in state:
            self.value = float(state["kl_coef"])
