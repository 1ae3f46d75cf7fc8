"""PPO / GRPO math on tensors: the decoupled actor loss, the clipped value loss, advantages,
normalisation, KL terms.

Pure torch, no state, no processes (docs/architecture.md §7). Every function reads in the order the formula is
written. Token tensors are *padded*: `[batch, time]` with a boolean mask marking the tokens that
count (the trainer's batch layout, realhf.impl.model.batching); each function gives its shapes.

Gradients flow only through the current policy's `logprobs`; every other input (behaviour and
proximal log-probs, advantages, rewards, values) is treated as a constant.
"""

from __future__ import annotations

import math
from typing import Dict, Literal, Optional, Tuple

import torch

from realhf.api.algorithms import policy_loss as get_policy_loss
from realhf.api.choices import KL_ESTIMATORS
from realhf.base.device import all_reduce_sum

Stats = Dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------
# Small masked reductions
# ---------------------------------------------------------------------------------------------


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x)).sum()


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over `mask`; 0 (not NaN) when the mask is empty."""
    return _masked_sum(x, mask) / mask.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------
# Policy losses (the surrogates ppo.policy_loss names) and the decoupled actor loss
# ---------------------------------------------------------------------------------------------


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level log-ratio on every token (time is the last dim).

    Its value is the mean of `log_ratio` over the sequence's masked tokens; its gradient on token
    t is that of token t's own log-prob. Exponentiated and summed over a sequence's tokens with
    weight 1/|y| (seq-mean-token-mean) it gives exactly ∇s = s·mean_t ∇logp_t, the gradient of
    the sequence ratio s; clipping it per token clips the whole sequence at once, because every
    token carries the same value.
    """
    mask = mask.bool()
    seq_mean = _masked_sum_last(log_ratio.detach(), mask) / mask.sum(-1, keepdim=True).clamp(min=1)  # [..., 1]
    return seq_mean + log_ratio - log_ratio.detach()


def _masked_sum_last(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x)).sum(-1, keepdim=True)


# The built-in surrogates of ppo.policy_loss; realhf.api.algorithms declares their specs.
def clipped_ratio(log_ratio, adv, eps_low, eps_high):
    ratio = torch.exp(log_ratio)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def clipped_log_ratio(log_ratio, adv, eps_low, eps_high):
    low = math.log(1.0 - eps_low) if eps_low < 1 else -math.inf
    unclipped, clipped = -adv * log_ratio, -adv * log_ratio.clamp(low, math.log(1.0 + eps_high))
    return torch.maximum(unclipped, clipped), clipped > unclipped


# Each surrogate: (per-token log-ratio to the denominator, A, eps_clip, eps_clip_high) →
# (per-token loss, where the clip was the active term). `gpg`'s −A·logp is written on the
# log-ratio like the others: the denominator is a constant, so the gradient is the same and the
# logged loss starts near 0 instead of at an arbitrary −A·logp.
def no_clip(log_ratio, adv, eps_low, eps_high):
    return -adv * log_ratio, torch.zeros_like(log_ratio, dtype=torch.bool)


def actor_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    c_clip: Optional[float] = None,
    proximal_logprobs: Optional[torch.Tensor] = None,
    behav_imp_weight_cap: Optional[float] = None,
    eps_clip_high: Optional[float] = None,
    reduce: Literal["mean", "sum", "none"] = "mean",
    policy_loss: str = "ppo",
) -> Tuple[torch.Tensor, Stats]:
    """The (decoupled) policy loss, per token then reduced over `loss_mask`.

    All tensors have the same shape (any rank; `gspo` reads the last dim as a sequence's tokens).
    With `den` the proximal log-probs when given, else the behaviour (`old`) log-probs, and
    `ρ = logp − den` (for `gspo`: `sequence_log_ratio(ρ)`, the sequence's mean on each token):

        ppo, gspo:  r = exp(ρ),  L = max(−A·r, −A·clip(r, 1 − eps_clip, 1 + eps_clip_high))
        cpgd:       L = max(−A·ρ, −A·clip(ρ, log(1 − eps_clip), log(1 + eps_clip_high)))
        gpg:        L = −A·ρ (no clip): the gradient of plain −A·logp, valued 0 at ρ = 0
                    eps_clip_high defaults to eps_clip
        L = min(L, c_clip·|A|)            where A < 0, if c_clip is set (dual clip; c_clip > 1)
        L = L·w,  w = exp(prox − old)     if proximal_logprobs are given (behaviour correction)
        w := 0                            where w > behav_imp_weight_cap, if the cap is given
                                          (without proximal log-probs w ≡ 1 and the cap is unused)

    GSPO with the decoupled loss: the trust region (the clip) is taken at sequence level
    against the proximal policy, as GSPO asks, while the behaviour weight stays per token. The
    two correct different things: the clip bounds how far this update moves from π_prox, and
    w re-weights each sampled token from the (stale) policy that drew it to π_prox — each token
    of a sequence may have been drawn by a different server version (chunked or interrupted
    generation), so a per-sequence w would mix versions; per token it stays exact. The gradient
    on token t is then w_t·(∂L/∂s)·s/|y|: each token's score-function term of ∇s, weighted by
    its own w_t (without the decoupled loss, w ≡ 1 and this is exactly ∇ of GSPO's objective).

    Reduction over the mask (capped tokens stay in the token count):
      - `reduce="mean"`: `loss = Σ_mask L / max(count(mask), 1)` (0, not NaN, for an empty mask);
      - `reduce="sum"`:  `loss = Σ_mask L`; divide by the global token count yourself, e.g. the
        all-reduced `stats["n_tokens"]`, to get a token mean across data-parallel ranks;
      - `reduce="none"`: L per token (0 outside the mask), for another aggregation.

    Stats (detached; "mean" = mean over the masked tokens, 0 when there are none):
      - `n_tokens`: number of masked tokens;
      - `importance_ratio`: mean of exp(ρ);
      - `approx_kl`: mean of (den − logp), the k1 estimate of KL(π_den ‖ π_θ);
      - `clip_fraction`: fraction of tokens where the clipped term is the larger (active) one;
      - `dual_clip_fraction`: fraction of tokens where the dual clip lowered L (0 without c_clip);
      - `behav_imp_weight`: mean of w over the tokens that were not capped (1 without proximal);
      - `behav_kl`: mean of (old − prox), the k1 estimate of KL(π_behav ‖ π_prox) (0 without proximal);
      - `behav_capped_fraction`: fraction of tokens whose weight was zeroed by the cap.
    """
    if eps_clip <= 0:
        raise ValueError(f"eps_clip must be > 0, got {eps_clip}")
    eps_clip_high = eps_clip if eps_clip_high is None else eps_clip_high
    if eps_clip_high <= 0:
        raise ValueError(f"eps_clip_high must be > 0, got {eps_clip_high}")
    if c_clip is not None and c_clip <= 1:
        raise ValueError(f"c_clip (dual clip) must be > 1, got {c_clip}; use None to disable it")
    if behav_imp_weight_cap is not None and behav_imp_weight_cap < 1:
        raise ValueError(
            f"behav_imp_weight_cap must be >= 1 (a cap below 1 drops on-policy tokens), "
            f"got {behav_imp_weight_cap}; use None to disable it"
        )
    if reduce not in ("mean", "sum", "none"):
        raise ValueError(f"reduce must be 'mean', 'sum' or 'none', got {reduce!r}")
    spec = get_policy_loss(policy_loss)  # ValueError naming ppo.policy_loss and the choices

    # Compute in float32 at least; only `logprobs` carries gradient.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logp = logprobs.to(dtype)
    old = old_logprobs.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    prox = None if proximal_logprobs is None else proximal_logprobs.detach().to(dtype)
    mask = loss_mask.bool()
    den = old if prox is None else prox

    log_ratio = logp - den
    if spec.sequence_level:
        log_ratio = sequence_log_ratio(log_ratio, mask)
    loss, clip_active = spec.surrogate(log_ratio, adv, eps_clip, eps_clip_high)

    # Dual clip: bound the loss of negative-advantage tokens by c·|A|.
    dual_active = torch.zeros_like(mask)
    if c_clip is not None:
        dual_bound = c_clip * adv.abs()
        dual_active = (adv < 0) & (loss > dual_bound)
        loss = torch.where(dual_active, dual_bound, loss)

    # Behaviour correction: weight by π_prox / π_behav, dropping tokens whose weight is too large.
    capped = torch.zeros_like(mask)
    if prox is not None:
        behav_weight = torch.exp(prox - old)
        if behav_imp_weight_cap is not None:
            capped = behav_weight > behav_imp_weight_cap
            behav_weight = torch.where(capped, torch.zeros_like(behav_weight), behav_weight)
        loss = loss * behav_weight
    else:
        behav_weight = torch.ones_like(old)

    loss = torch.where(mask, loss, torch.zeros_like(loss))
    n_tokens = mask.sum()
    reduced = {"none": loss, "sum": loss.sum(), "mean": loss.sum() / n_tokens.clamp(min=1)}[reduce]

    with torch.no_grad():
        stats: Stats = {
            "n_tokens": n_tokens.detach(),
            "importance_ratio": _masked_mean(torch.exp(log_ratio.detach()), mask),
            "approx_kl": _masked_mean((den - logp).detach(), mask),
            "clip_fraction": _masked_mean(clip_active.to(dtype), mask),
            "dual_clip_fraction": _masked_mean(dual_active.to(dtype), mask),
            "behav_imp_weight": _masked_mean(behav_weight, mask & ~capped),
            "behav_kl": _masked_mean(old - den, mask),
            "behav_capped_fraction": _masked_mean(capped.to(dtype), mask),
        }
    return reduced, stats


# ---------------------------------------------------------------------------------------------
# Clipped value loss (the critic)
# ---------------------------------------------------------------------------------------------


def value_loss_fn(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    eps_clip: float,
    mask: torch.Tensor,
) -> Tuple[torch.Tensor, Stats]:
    """PPO's clipped value loss, summed over `mask` (`[B, L]` each; divide by the global token
    count yourself, as with `actor_loss_fn(reduce="sum")`).

        V_clip = V_old + clip(V − V_old, −ε, ε)
        L      = ½ · max((V − R)², (V_clip − R)²)

    The clip keeps one step from moving a value far from the one the advantages were computed
    with. Stats (sums over the mask): `clip_count` (tokens where the clipped term is the larger),
    `error_sum` (Σ |V − R|), `n_tokens`.
    """
    old_values, returns = old_values.detach(), returns.detach()  # [B, L]
    values = values.float()  # [B, L]
    clipped = old_values + (values - old_values).clamp(-eps_clip, eps_clip)  # [B, L]
    plain_sq = (values - returns) ** 2  # [B, L]
    clipped_sq = (clipped - returns) ** 2  # [B, L]
    loss = 0.5 * torch.maximum(plain_sq, clipped_sq)  # [B, L]
    stats = {
        "clip_count": _masked_sum((clipped_sq > plain_sq).float(), mask).detach(),
        "error_sum": _masked_sum((values - returns).abs(), mask).detach(),
        "n_tokens": mask.sum().detach(),
    }
    return _masked_sum(loss, mask), stats


# ---------------------------------------------------------------------------------------------
# Generalised advantage estimation on the padded batch
# ---------------------------------------------------------------------------------------------


def gae_masked(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns on a padded batch, over the masked tokens of each row.

    `rewards`, `values` and `mask` are `[B, L]`. A row's steps are its masked positions in order;
    unmasked positions (padding, the prompt, inserted feedback between turns) are skipped, so a
    step's successor is the next *masked* position of its row. The value after a row's last step
    is `bootstrap_values[b]` (`[B]`; for a sequence that was cut, not terminated), else 0.

        δ_t = r_t + γ·V_{t+1} − V_t,    A_t = δ_t + γ·λ·A_{t+1},    returns_t = A_t + V_t

    One backward pass over the time axis for all rows at once. Returns `(advantages, returns)`,
    `[B, L]`, 0 outside the mask. Inputs are treated as constants.
    """
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            f"gae_masked expects rewards, values and mask of one [B, L] shape, got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)} and {tuple(mask.shape)}"
        )
    rewards = rewards.detach()  # [B, L]
    values = values.detach().to(rewards.dtype)  # [B, L]
    mask = mask.bool()  # [B, L]
    n_rows, length = rewards.shape
    if bootstrap_values is None:
        next_value = rewards.new_zeros(n_rows)  # [B]
    else:
        if bootstrap_values.shape != (n_rows,):
            raise ValueError(
                f"bootstrap_values must have one entry per row ({n_rows}), got {tuple(bootstrap_values.shape)}"
            )
        next_value = bootstrap_values.detach().to(rewards.dtype).clone()  # [B]
    next_adv = rewards.new_zeros(n_rows)  # [B]

    adv = rewards.new_zeros(n_rows, length)  # [B, L]
    for t in reversed(range(length)):
        m = mask[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        a = delta + gamma * lam * next_adv  # [B]
        # Off the mask the recursion carries the successor's advantage and value through.
        next_adv = torch.where(m, a, next_adv)
        next_value = torch.where(m, values[:, t], next_value)
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
    returns = torch.where(mask, adv + values, torch.zeros_like(adv))  # [B, L]
    return adv, returns


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------


def masked_normalization(
    x: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    all_reduce: bool = False,
) -> torch.Tensor:
    """`(x − mean) / sqrt(var + eps)` with mean and population variance over the masked entries.

    Statistics are computed in float64; the result has `x`'s dtype and is 0 outside the mask
    (everything is 0 when the mask is empty). With `all_reduce=True` and torch.distributed
    initialised, mean and variance are global over all ranks (two all-reduces: sum and count,
    then the sum of squared deviations).
    """
    mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool()
    x64 = torch.where(mask, x.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    sum_count = torch.stack([x64.sum(), mask.sum().to(torch.float64)])
    if all_reduce:
        sum_count = all_reduce_sum(sum_count)
    total, count = sum_count[0], sum_count[1]
    if count == 0:
        return torch.zeros_like(x)
    mean = total / count

    sq_dev = torch.where(mask, (x64 - mean) ** 2, torch.zeros((), dtype=torch.float64)).sum()
    if all_reduce:
        sq_dev = all_reduce_sum(sq_dev)
    var = sq_dev / count

    normed = (x64 - mean) / torch.sqrt(var + eps)
    return torch.where(mask, normed, torch.zeros_like(normed)).to(x.dtype)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-sample GRPO advantages: `(r − mean_g) / (std_g + eps)` within each group g.

    `rewards` and `group_ids` are 1-D, one entry per sample; group ids are arbitrary labels.
    `std_g` is the *population* standard deviation (divide by the group size, not size − 1), so
    a group of one sample gets advantage 0. With `norm_std=False` only the group mean is
    subtracted (Dr.GRPO).
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D of the same length, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    r = rewards.detach().to(torch.float64)
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0

    size = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group, r) / size
    centred = r - mean[group]
    if not norm_std:
        return centred.to(rewards.dtype)
    var = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group, centred**2) / size
    return (centred / (var.sqrt()[group] + eps)).to(rewards.dtype)


# ---------------------------------------------------------------------------------------------
# KL to the reference policy and reward shaping
# ---------------------------------------------------------------------------------------------


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: Literal["k1", "k2", "k3"] = "k1",
) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman's k1/k2/k3).

    With `log_ratio = logp − ref_logp`:
      - k1 = log_ratio                              (unbiased, can be negative)
      - k2 = ½·log_ratio²                           (biased, non-negative)
      - k3 = exp(−log_ratio) − 1 + log_ratio        (unbiased, non-negative)
    Gradient flows through `logprobs` (useful as a loss term); detach it for a reward term.
    """
    log_ratio = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"kl_estimate kind must be one of {KL_ESTIMATORS}, got {kind!r}")


def rewards_with_kl(
    score: torch.Tensor,
    kl: torch.Tensor,
    kl_ctl: float,
    *,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Per-token rewards `[S, T]`: `−kl_ctl·kl` at every masked token, plus each sequence's score
    at its last masked token; 0 outside the mask.

    `score` is `[S]`, `kl` and `mask` are `[S, T]`. Every sequence needs at least one masked
    token (its score has to land somewhere). `kl` is detached.
    """
    rewards = -kl_ctl * kl.detach()  # [S, T]
    score = score.detach().to(rewards.dtype)  # [S]
    mask = mask.bool()  # [S, T]
    if score.numel() != mask.shape[0]:
        raise ValueError(f"score has {score.numel()} entries for {mask.shape[0]} sequences")
    if not mask.any(dim=1).all():
        bad = torch.nonzero(~mask.any(dim=1)).flatten().tolist()
        raise ValueError(f"sequences {bad} have no masked tokens to carry their score")
    positions = torch.arange(mask.shape[1]).expand_as(mask)  # [S, T]
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values  # [S]
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    rewards[torch.arange(mask.shape[0]), last] += score
    return rewards
