"""The actor's two model function calls: log-probs of a batch, and one PPO/GRPO train step.

    compute_logprobs   log π(token) under the current weights, logits divided by the
                       generation temperature (the sampler's log-probs are log_softmax(logits/T))
    ppo_train_step     advantages → `ppo_n_minibatches` optimizer steps with the (decoupled)
                       PPO loss → stats

Data parallelism without a wrapper: every rank holds its own groups; the loss of a minibatch is
its sum over the rank's tokens divided by the token count *summed over all ranks*, and the
gradients are summed across ranks before clipping, so DP=N computes exactly the update of DP=1
on the union of the ranks' minibatches (the loss is a global token mean, docs/architecture.md §7).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from realhf.api.cli_args import PPOHyperparameters
from realhf.impl.model.batching import TrainBatch, minibatch_rows
from realhf.impl.model.utils import ppo_functional as F


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if _distributed():
        dist.all_reduce(t)
    return t


# ---------------------------------------------------------------------------------------------
# Log-probs
# ---------------------------------------------------------------------------------------------


def compute_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """`[N, T-1]` log-probs of tokens 1..T-1 (column t: the token at t+1); 0 on padding.

    Gradients flow when called under grad mode. A temperature ≤ 0 means greedy sampling, whose
    log-probs are not a distribution; it is treated as 1.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.where(batch.attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))


@torch.no_grad()
def inference_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0,
                       micro_batch_tokens: int = 1024, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`compute_logprobs` without gradients for `rows` (default: all; other rows stay 0), in
    length-ordered micro-batches (`micro_batches`)."""
    was_training = model.training
    model.eval()
    try:
        width = batch.input_ids.shape[1]
        out = torch.zeros((batch.n_seqs, width - 1), dtype=torch.float32)
        rows = torch.arange(batch.n_seqs) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        for chunk in micro_batches(batch, rows, micro_batch_tokens):
            mb = batch.select(chunk)
            out[chunk, : mb.input_ids.shape[1] - 1] = compute_logprobs(model, mb, temperature)
        return out
    finally:
        model.train(was_training)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether train-mode and eval-mode forwards differ (then a train forward cannot stand in
    for the proximal log-probs)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, name, 0.0) or 0.0) > 0
               for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop"))


def first_minibatch_rows(n_seqs: int, n_minibatches: int) -> torch.Tensor:
    return minibatch_rows(n_seqs, n_minibatches)[0]


def micro_batches(batch: TrainBatch, rows: torch.Tensor, max_tokens: int) -> List[torch.Tensor]:
    """`rows` in order of length, cut into chunks whose padded size (rows × longest row) stays
    within `max_tokens` (a longer row goes alone; 0: one chunk in arrival order). A forward's
    cost is its padded size, so similar lengths share a chunk and memory stays bounded."""
    if len(rows) == 0:
        return []
    if max_tokens <= 0:
        return [rows]
    lengths = batch.attention_mask[rows].sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    chunks, start = [], 0
    for i, length in enumerate(lengths[order].tolist()):
        if i > start and (i + 1 - start) * length > max_tokens:
            chunks.append(rows[order[start:i]])
            start = i
    chunks.append(rows[order[start:]])
    return chunks


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------


def compute_advantages(batch: TrainBatch, cfg: PPOHyperparameters) -> torch.Tensor:
    """Per-token advantages `[N, T-1]` (0 outside the loss mask).

    - `group_adv_norm`: GRPO, `(r − mean_g)/(std_g + eps)` per prompt group, the same value on
      every token of a sample (a KL penalty, if any, is then a loss term, see ppo_train_step);
    - otherwise: the score at the last token, minus `kl_ctl·KL(old ‖ ref)` at every token when
      a reference is loaded, through GAE (`discount`, `gae_lambda`) with zero values (no critic);
    - then `adv_norm`: normalise over all trained tokens of the step, globally across DP ranks.
    """
    mask = batch.loss_mask  # [N, T-1]
    scores = F.shape_reward(batch.rewards, cfg.reward_output_scaling, cfg.reward_output_bias,
                            cfg.max_reward_clip)  # [N]
    if cfg.group_adv_norm:
        per_sample = F.grpo_advantages(scores, batch.group_ids, norm_std=cfg.group_adv_norm_std)  # [N]
        adv = per_sample[:, None].expand_as(mask).to(torch.float32)  # [N, T-1]
    else:
        adv = _gae_advantages(batch, scores, cfg)  # [N, T-1]
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    if cfg.adv_norm:
        adv = F.masked_normalization(adv, mask, all_reduce=True)
    return adv


def _gae_advantages(batch: TrainBatch, scores: torch.Tensor, cfg: PPOHyperparameters) -> torch.Tensor:
    mask = batch.loss_mask  # [N, T-1]
    kl = torch.zeros_like(batch.behav_logprobs)  # [N, T-1]
    if cfg.kl_ctl > 0:
        if batch.ref_logprobs is None:
            raise ValueError("ppo.kl_ctl > 0 needs reference log-probs: run ref_inf before actor_train")
        old = batch.prox_logprobs if batch.prox_logprobs is not None else batch.behav_logprobs
        kl = F.kl_estimate(old, batch.ref_logprobs, "k1")
    # A sample without a trained token has nowhere to put its score: its row stays 0.
    rows = mask.any(dim=1)  # [N]
    token_rewards = torch.zeros_like(kl)  # [N, T-1]
    token_rewards[rows] = F.rewards_with_kl(scores[rows], kl[rows], cfg.kl_ctl, mask=mask[rows])
    values = torch.zeros_like(token_rewards)  # [N, T-1] no critic
    adv, _ = F.gae_masked(token_rewards, values, mask, cfg.discount, cfg.gae_lambda)  # [N, T-1]
    return adv


# ---------------------------------------------------------------------------------------------
# The train step
# ---------------------------------------------------------------------------------------------


def _sync_gradients(params: List[torch.nn.Parameter]) -> None:
    """Sum gradients over DP ranks in one flat all-reduce."""
    if not _distributed():
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset: offset + n].view_as(p).clone()
        offset += n


def ppo_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Optional[torch.optim.lr_scheduler.LRScheduler],
    batch: TrainBatch,
    cfg: PPOHyperparameters,
    gradient_clipping: float = 1.0,
    prox_from_first_forward: bool = False,
) -> Dict[str, float]:
    """`cfg.ppo_n_minibatches` optimizer steps on `batch`; returns global (all-rank) stats.

    The loss's denominator log-probs: the proximal ones (recomputed by `actor_inf`) with the
    decoupled loss; otherwise the recomputed ones when `recompute_logprob`, else the behaviour
    log-probs. With `prox_from_first_forward`, `actor_inf` left the first minibatch's rows out:
    before the first optimizer step the weights are the proximal ones, so that minibatch's own
    forward gives them (saves that share of actor_inf's forward; needs a model without dropout,
    see `has_dropout`).
    """
    if cfg.use_decoupled_loss and batch.prox_logprobs is None:
        raise ValueError("ppo.use_decoupled_loss needs proximal log-probs: run actor_inf (inference) before actor_train")
    temperature = cfg.gen.temperature
    advantages = compute_advantages(batch, cfg)
    old = batch.behav_logprobs
    prox = None
    if cfg.use_decoupled_loss:
        prox = batch.prox_logprobs
    elif cfg.recompute_logprob and batch.prox_logprobs is not None:
        old = batch.prox_logprobs
    kl_loss = cfg.kl_ctl > 0 and cfg.group_adv_norm
    if kl_loss and batch.ref_logprobs is None:
        raise ValueError("ppo.kl_ctl > 0 needs reference log-probs: run ref_inf before actor_train")

    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    stat_names = ["loss", "importance_ratio", "approx_kl", "clip_fraction", "dual_clip_fraction",
                  "behav_imp_weight", "behav_kl", "behav_capped_fraction", "kl_ref"]
    totals = torch.zeros(len(stat_names), dtype=torch.float64)  # token-weighted sums over all ranks
    grad_norms: List[float] = []
    n_tokens_total = 0.0
    if prox_from_first_forward and batch.prox_logprobs is None:
        raise ValueError("prox_from_first_forward needs the other minibatches' proximal log-probs from actor_inf")
    for i, rows in enumerate(minibatch_rows(batch.n_seqs, cfg.ppo_n_minibatches)):
        n_local = torch.tensor(float(batch.loss_mask[rows].sum()), dtype=torch.float64)
        n_global = float(_all_reduce_sum(n_local.clone()))
        optimizer.zero_grad(set_to_none=True)
        local = torch.zeros(len(stat_names), dtype=torch.float64)
        # Gradients accumulate over the micro-batches: each adds its token sum / the minibatch's
        # global token count, so the step is the one of a single forward over the minibatch.
        for chunk in micro_batches(batch, rows, cfg.micro_batch_tokens):
            mb = batch.select(chunk)
            w = mb.loss_mask.shape[1]
            logp = compute_logprobs(model, mb, temperature)
            if prox_from_first_forward and i == 0:
                batch.prox_logprobs[chunk, :w] = logp.detach()  # `old`/`prox` are views of this tensor
            loss_sum, stats = F.actor_loss_fn(
                logp, old[chunk, :w], advantages[chunk, :w], cfg.eps_clip, mb.loss_mask,
                c_clip=cfg.c_clip, proximal_logprobs=None if prox is None else prox[chunk, :w],
                behav_imp_weight_cap=cfg.behav_imp_weight_cap, eps_clip_high=cfg.eps_clip_high, reduce="sum",
            )  # fmt: skip
            kl_sum = torch.zeros(())
            if kl_loss:
                kl = F.kl_estimate(logp, batch.ref_logprobs[chunk, :w], cfg.kl_estimator)
                kl_sum = torch.where(mb.loss_mask, kl, torch.zeros_like(kl)).sum()
                loss_sum = loss_sum + cfg.kl_ctl * kl_sum
            (loss_sum / max(n_global, 1.0)).backward()
            n = float(stats["n_tokens"])
            local += torch.tensor([float(loss_sum.detach()), *(float(stats[k]) * n for k in stat_names[1:-1]),
                                   float(kl_sum.detach())], dtype=torch.float64)
        _sync_gradients(params)
        if gradient_clipping > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clipping)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))  # the norm only
        grad_norms.append(float(norm))
        optimizer.step()
        if lr_scheduler is not None:
            lr_scheduler.step()
        totals += _all_reduce_sum(local)
        n_tokens_total += n_global

    out = {k: float(v) / max(n_tokens_total, 1.0) for k, v in zip(stat_names, totals)}
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)
    out["lr"] = float(optimizer.param_groups[0]["lr"])
    out["n_tokens"] = n_tokens_total
    adv_sums = torch.tensor([float(advantages[batch.loss_mask].sum()),
                             float((advantages[batch.loss_mask] ** 2).sum())], dtype=torch.float64)
    adv_sums = _all_reduce_sum(adv_sums) / max(n_tokens_total, 1.0)
    out["adv_mean"] = float(adv_sums[0])
    out["adv_std"] = max(float(adv_sums[1]) - float(adv_sums[0]) ** 2, 0.0) ** 0.5
    return out
