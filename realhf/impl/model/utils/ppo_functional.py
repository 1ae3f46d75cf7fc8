"""PPO / GRPO math on tensors: the decoupled actor loss, advantages, normalisation, KL terms.

Pure torch, no state, no processes (DESIGN §7). Every function reads in the order the formula is
written. Shapes are either *padded* (`[batch, time]` with a boolean mask) or *packed* (all
sequences concatenated along one dimension, delimited by `cu_seqlens = [0, n_0, n_0+n_1, ...]`);
each function says which.

Gradients flow only through the current policy's `logprobs`; every other input (behaviour and
proximal log-probs, advantages, rewards, values) is treated as a constant.
"""

from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple

import torch
import torch.distributed as dist

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
# Decoupled PPO actor loss
# ---------------------------------------------------------------------------------------------


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
    reduce: Literal["mean", "sum"] = "mean",
) -> Tuple[torch.Tensor, Stats]:
    """The (decoupled) PPO clipped surrogate loss, per token then reduced over `loss_mask`.

    All tensors have the same shape (padded or packed, any rank). With `den` the proximal
    log-probs when given, else the behaviour (`old`) log-probs:

        r = exp(logp − den)
        L = max(−A·r, −A·clip(r, 1 − eps_clip, 1 + eps_clip_high))      eps_clip_high defaults to eps_clip
        L = min(L, c_clip·|A|)            where A < 0, if c_clip is set (dual clip; c_clip > 1)
        L = L·w,  w = exp(prox − old)     if proximal_logprobs are given (behaviour correction)
        w := 0                            where w > behav_imp_weight_cap, if the cap is given
                                          (without proximal log-probs w ≡ 1 and the cap is unused)

    Reduction over the mask (capped tokens stay in the token count):
      - `reduce="mean"`: `loss = Σ_mask L / max(count(mask), 1)` (0, not NaN, for an empty mask);
      - `reduce="sum"`:  `loss = Σ_mask L`; divide by the global token count yourself, e.g. the
        all-reduced `stats["n_tokens"]`, to get a token mean across data-parallel ranks.

    Stats (detached; "mean" = mean over the masked tokens, 0 when there are none):
      - `n_tokens`: number of masked tokens;
      - `importance_ratio`: mean of r;
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
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")

    # Compute in float32 at least; only `logprobs` carries gradient.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logp = logprobs.to(dtype)
    old = old_logprobs.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    prox = None if proximal_logprobs is None else proximal_logprobs.detach().to(dtype)
    mask = loss_mask.bool()
    den = old if prox is None else prox

    # Clipped surrogate.
    ratio = torch.exp(logp - den)
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * clipped_ratio
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clip_active = loss_clipped > loss_unclipped

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

    loss_sum = _masked_sum(loss, mask)
    n_tokens = mask.sum()
    reduced = loss_sum if reduce == "sum" else loss_sum / n_tokens.clamp(min=1)

    with torch.no_grad():
        stats: Stats = {
            "n_tokens": n_tokens.detach(),
            "importance_ratio": _masked_mean(ratio.detach(), mask),
            "approx_kl": _masked_mean((den - logp).detach(), mask),
            "clip_fraction": _masked_mean(clip_active.to(dtype), mask),
            "dual_clip_fraction": _masked_mean(dual_active.to(dtype), mask),
            "behav_imp_weight": _masked_mean(behav_weight, mask & ~capped),
            "behav_kl": _masked_mean(old - den, mask),
            "behav_capped_fraction": _masked_mean(capped.to(dtype), mask),
        }
    return reduced, stats


# ---------------------------------------------------------------------------------------------
# Generalised advantage estimation on packed sequences
# ---------------------------------------------------------------------------------------------


def gae_1d(
    rewards: torch.Tensor,
    values: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bootstrap: torch.Tensor,
    gamma: float,
    lam: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns for packed sequences.

    `cu_seqlens` (length S+1) delimits the S sequences inside `rewards`: sequence i has
    `n_i = cu_seqlens[i+1] − cu_seqlens[i]` rewards. `values` is packed with one extra entry per
    sequence (n_i + 1 values; sequence i's values start at `cu_seqlens[i] + i`). The extra, last
    value is used only where `bootstrap[i]` is true (the sequence was cut, not terminated);
    otherwise the value after the last step is 0.

        δ_t = r_t + γ·V_{t+1} − V_t,    A_t = δ_t + γ·λ·A_{t+1},    returns_t = A_t + V_t

    Returns `(advantages, returns)`, each shaped like `rewards`. Inputs are treated as constants.
    """
    rewards = rewards.detach()
    values = values.detach().to(rewards.dtype)
    cu_seqlens = cu_seqlens.long()
    n_seqs = cu_seqlens.numel() - 1
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if rewards.dim() != 1 or values.dim() != 1:
        raise ValueError("gae_1d expects packed 1-D rewards and values")
    if rewards.numel() != int(cu_seqlens[-1]):
        raise ValueError(f"rewards has {rewards.numel()} entries but cu_seqlens ends at {int(cu_seqlens[-1])}")
    if values.numel() != rewards.numel() + n_seqs:
        raise ValueError(
            f"values must have one more entry per sequence than rewards: expected "
            f"{rewards.numel() + n_seqs}, got {values.numel()}"
        )
    if bootstrap.numel() != n_seqs:
        raise ValueError(f"bootstrap must have one flag per sequence ({n_seqs}), got {bootstrap.numel()}")

    # Scatter the packed sequences into a [S, T] grid (padding never touches the result).
    max_len = int(lengths.max()) if n_seqs > 0 else 0
    seq_of_token = torch.repeat_interleave(torch.arange(n_seqs), lengths)
    step_of_token = torch.arange(rewards.numel()) - cu_seqlens[:-1][seq_of_token]
    value_start = cu_seqlens[:-1] + torch.arange(n_seqs)

    r = rewards.new_zeros(n_seqs, max_len)
    v = rewards.new_zeros(n_seqs, max_len + 1)
    r[seq_of_token, step_of_token] = rewards
    v[seq_of_token, step_of_token] = values[value_start[seq_of_token] + step_of_token]
    last_value = values[value_start + lengths]
    v[torch.arange(n_seqs), lengths] = torch.where(bootstrap.bool(), last_value, torch.zeros_like(last_value))

    # Backward recursion over time, all sequences at once.
    adv = rewards.new_zeros(n_seqs, max_len)
    running = rewards.new_zeros(n_seqs)
    for t in reversed(range(max_len)):
        delta = r[:, t] + gamma * v[:, t + 1] - v[:, t]
        running = torch.where(t < lengths, delta + gamma * lam * running, torch.zeros_like(running))
        adv[:, t] = running

    advantages = adv[seq_of_token, step_of_token]
    returns = advantages + v[seq_of_token, step_of_token]
    return advantages, returns


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
    global_ = all_reduce and dist.is_available() and dist.is_initialized()

    sum_count = torch.stack([x64.sum(), mask.sum().to(torch.float64)])
    if global_:
        dist.all_reduce(sum_count)
    total, count = sum_count[0], sum_count[1]
    if count == 0:
        return torch.zeros_like(x)
    mean = total / count

    sq_dev = torch.where(mask, (x64 - mean) ** 2, torch.zeros((), dtype=torch.float64)).sum()
    if global_:
        dist.all_reduce(sq_dev)
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
    raise ValueError(f"kl_estimate kind must be one of 'k1', 'k2', 'k3', got {kind!r}")


def rewards_with_kl(
    score: torch.Tensor,
    kl: torch.Tensor,
    kl_ctl: float,
    *,
    cu_seqlens: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-token rewards: `−kl_ctl·kl` at every token, plus each sequence's score at its last token.

    `score` has one entry per sequence. Give exactly one layout:
      - packed: `kl` is 1-D and `cu_seqlens` (length S+1) delimits the sequences;
      - padded: `kl` is `[S, T]` and `mask` marks the real tokens; a sequence's last token is its
        last masked position, and unmasked positions get reward 0.
    Every sequence needs at least one token (its score has to land somewhere). `kl` is detached.
    """
    if (cu_seqlens is None) == (mask is None):
        raise ValueError("rewards_with_kl needs exactly one of cu_seqlens (packed) or mask (padded)")
    rewards = -kl_ctl * kl.detach()
    score = score.detach().to(rewards.dtype)

    if cu_seqlens is not None:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        if score.numel() != lengths.numel():
            raise ValueError(f"score has {score.numel()} entries for {lengths.numel()} sequences")
        if (lengths <= 0).any():
            bad = torch.nonzero(lengths <= 0).flatten().tolist()
            raise ValueError(f"sequences {bad} have no tokens to carry their score")
        last = cu_seqlens[1:].long() - 1
        return rewards.index_add(0, last, score)

    mask = mask.bool()
    if score.numel() != mask.shape[0]:
        raise ValueError(f"score has {score.numel()} entries for {mask.shape[0]} sequences")
    if not mask.any(dim=1).all():
        bad = torch.nonzero(~mask.any(dim=1)).flatten().tolist()
        raise ValueError(f"sequences {bad} have no masked tokens to carry their score")
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    rewards[torch.arange(mask.shape[0]), last] += score
    return rewards


def shape_reward(
    r: torch.Tensor,
    scaling: float = 1.0,
    bias: float = 0.0,
    clip: Optional[float] = None,
) -> torch.Tensor:
    """`(r + bias)·scaling`, then clipped to `[−clip, clip]` when `clip` is given."""
    if clip is not None and clip <= 0:
        raise ValueError(f"reward clip must be > 0, got {clip}; use None to disable it")
    shaped = (r + bias) * scaling
    return shaped if clip is None else shaped.clamp(-clip, clip)
