"""The PPO math of a train step, as the functions a TrainEngine calls back (realhf.api.engine_api).

    token_logprobs        logits → log π(token), logits divided by the generation temperature
                          (the sampler's log-probs are log_softmax(logits/T))
    compute_advantages    rewards (+ KL, + critic values) → per-token advantages and returns
    ActorLoss             one minibatch's (decoupled) PPO loss as an engine `loss_fn`, summing
                          the step's statistics as it goes
    CriticLoss            one minibatch's clipped value loss, likewise

The losses return sums over a micro-batch's tokens; the engine divides by the token count of the
minibatch summed over all DP ranks (docs/architecture.md §7), so DP=N computes exactly the update
of DP=1 on the union of the ranks' samples. Statistics are summed per rank and reduced once per
train step (`StatSums.global_means`).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from realhf.api.cli_args import PPOHyperparameters
from realhf.base.device import all_reduce_sum
from realhf.impl.model.batching import TrainBatch, minibatch_rows
from realhf.impl.model.utils import ppo_functional as F

# ---------------------------------------------------------------------------------------------
# Log-probs
# ---------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, mb: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """`[n, t-1]` log-probs of tokens 1..t-1 of `mb` under `logits` `[n, t, V]` (column j: the token
    at j+1); 0 on padding. A temperature ≤ 0 means greedy sampling, whose log-probs are not a
    distribution; it is treated as 1."""
    logits = logits[:, :-1].float()  # [n, t-1, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = mb.input_ids[:, 1:]  # [n, t-1]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n, t-1]
    return torch.where(mb.attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))


def token_values(output: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """`[n, t-1]` critic values aligned with the predictions: column j is V of the state that
    generates token j+1 (the value head's output at position j); 0 on padding."""
    values = output[:, :-1, 0].float()  # [n, t-1]
    return torch.where(mb.attention_mask[:, 1:].bool(), values, torch.zeros_like(values))


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


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------


def kl_in_loss(cfg: PPOHyperparameters) -> bool:
    """GRPO puts the KL to the reference in the loss; GAE and REINFORCE subtract it from the reward."""
    return cfg.kl_ctl > 0 and cfg.adv_estimator == "grpo"


def compute_advantages(batch: TrainBatch, cfg: PPOHyperparameters) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages and returns, `[N, T-1]` each (0 outside the loss mask).

    - `grpo`: `(r − mean_g)/(std_g + eps)` per prompt group, the same value on every token of a
      sample; returns = advantages (no critic reads them);
    - `gae`: the score at the last token, minus `kl_ctl·KL(old ‖ ref)` at every token when a
      reference is loaded, through GAE (`discount`, `gae_lambda`) over the critic's `values`;
    - `reinforce`: the same with zero values (the reward-to-go);
    - then `adv_norm`: normalise over all trained tokens of the step, globally across DP ranks.
    """
    mask = batch.loss_mask  # [N, T-1]
    scores = F.shape_reward(batch.rewards, cfg.reward_output_scaling, cfg.reward_output_bias,
                            cfg.max_reward_clip)  # [N]
    if cfg.adv_estimator == "grpo":
        per_sample = F.grpo_advantages(scores, batch.group_ids, norm_std=cfg.group_adv_norm_std)  # [N]
        adv = per_sample[:, None].expand_as(mask).to(torch.float32)  # [N, T-1]
        returns = adv
    else:
        adv, returns = _gae(batch, scores, cfg)  # [N, T-1] each
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    if cfg.adv_norm:
        adv = F.masked_normalization(adv, mask, all_reduce=True)
    return adv, torch.where(mask, returns, torch.zeros_like(returns))


def _gae(batch: TrainBatch, scores: torch.Tensor, cfg: PPOHyperparameters) -> Tuple[torch.Tensor, torch.Tensor]:
    mask = batch.loss_mask  # [N, T-1]
    kl = torch.zeros_like(batch.behav_logprobs)  # [N, T-1]
    if cfg.kl_ctl > 0:
        if batch.ref_logprobs is None:
            raise ValueError("ppo.kl_ctl > 0 needs reference log-probs: run ref_inf before the train calls")
        old = batch.prox_logprobs if batch.prox_logprobs is not None else batch.behav_logprobs
        kl = F.kl_estimate(old, batch.ref_logprobs, "k1")
    # A sample without a trained token has nowhere to put its score: its row stays 0.
    rows = mask.any(dim=1)  # [N]
    token_rewards = torch.zeros_like(kl)  # [N, T-1]
    token_rewards[rows] = F.rewards_with_kl(scores[rows], kl[rows], cfg.kl_ctl, mask=mask[rows])
    if cfg.adv_estimator == "gae":
        if batch.values is None:
            raise ValueError("ppo.adv_estimator=gae needs the critic's values: run critic_inf before the train calls")
        values = batch.values  # [N, T-1]
    else:
        values = torch.zeros_like(token_rewards)  # [N, T-1] reinforce: no critic
    return F.gae_masked(token_rewards, values, mask, cfg.discount, cfg.gae_lambda)


# ---------------------------------------------------------------------------------------------
# Losses as engine callbacks
# ---------------------------------------------------------------------------------------------


class StatSums:
    """Token-weighted sums of named statistics over one rank's micro-batches."""

    def __init__(self, names: List[str]):
        self.names = names
        self.sums = torch.zeros(len(names), dtype=torch.float64)  # [S]

    def add(self, values: List[float]) -> None:
        self.sums += torch.tensor(values, dtype=torch.float64)

    def global_means(self, n_tokens: float) -> Dict[str, float]:
        """Collective: Σ over ranks / `n_tokens` (the global token count)."""
        total = all_reduce_sum(self.sums.clone())
        return {k: float(v) / max(n_tokens, 1.0) for k, v in zip(self.names, total)}


class ActorLoss:
    """The (decoupled) PPO loss of one step's minibatches, in the engine's `loss_fn` form.

    The denominator log-probs: the proximal ones (`actor_inf`) with the decoupled loss;
    otherwise the recomputed ones when `recompute_logprob`, else the behaviour log-probs. With
    `fill_prox` (the deferral, realhf.impl.model.ppo_actor), a minibatch's proximal log-probs
    were left to its own train forward, which runs before any optimizer step of the train step,
    with the proximal weights: `loss_fn` writes them into `batch.prox_logprobs` before using them.
    """

    STATS = ["loss", "importance_ratio", "approx_kl", "clip_fraction", "dual_clip_fraction",
             "behav_imp_weight", "behav_kl", "behav_capped_fraction", "kl_ref"]

    def __init__(self, batch: TrainBatch, cfg: PPOHyperparameters):
        if cfg.use_decoupled_loss and batch.prox_logprobs is None:
            raise ValueError("ppo.use_decoupled_loss needs proximal log-probs: run actor_inf (inference) before actor_train")
        if kl_in_loss(cfg) and batch.ref_logprobs is None:
            raise ValueError("ppo.kl_ctl > 0 needs reference log-probs: run ref_inf before actor_train")
        if batch.advantages is None:
            raise ValueError("actor_train needs the step's advantages (realhf.impl.model.ppo_actor.ensure_advantages)")
        self.batch, self.cfg = batch, cfg
        self.old = batch.behav_logprobs  # [N, T-1]
        self.prox = batch.prox_logprobs if cfg.use_decoupled_loss else None  # [N, T-1] or None
        if not cfg.use_decoupled_loss and cfg.recompute_logprob and batch.prox_logprobs is not None:
            self.old = batch.prox_logprobs
        self.stats = StatSums(self.STATS)

    def for_rows(self, mb_rows: torch.Tensor, fill_prox: bool = False):
        """`loss_fn(logits, mb, rows)` for the minibatch of batch rows `mb_rows` (the engine's
        `rows` index that minibatch)."""

        def loss_fn(logits: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
            cfg, chunk = self.cfg, mb_rows[rows]  # chunk: rows of the whole batch
            w = mb.loss_mask.shape[1]
            dev = logits.device
            logp = token_logprobs(logits, mb, cfg.gen.temperature)  # [n, w]
            if fill_prox:
                # `old`/`prox` are views of this tensor: the loss below reads what is written here.
                self.batch.prox_logprobs[chunk, :w] = logp.detach().cpu()
            prox = None if self.prox is None else self.prox[chunk, :w].to(dev)
            loss_sum, stats = F.actor_loss_fn(
                logp, self.old[chunk, :w].to(dev), self.batch.advantages[chunk, :w].to(dev), cfg.eps_clip,
                mb.loss_mask, c_clip=cfg.c_clip, proximal_logprobs=prox,
                behav_imp_weight_cap=cfg.behav_imp_weight_cap, eps_clip_high=cfg.eps_clip_high, reduce="sum",
            )  # fmt: skip
            kl_sum = torch.zeros((), device=dev)
            if kl_in_loss(cfg):
                kl = F.kl_estimate(logp, self.batch.ref_logprobs[chunk, :w].to(dev), cfg.kl_estimator)  # [n, w]
                kl_sum = torch.where(mb.loss_mask, kl, torch.zeros_like(kl)).sum()
                loss_sum = loss_sum + cfg.kl_ctl * kl_sum
            n = float(stats["n_tokens"])
            self.stats.add([float(loss_sum.detach()), *(float(stats[k]) * n for k in self.STATS[1:-1]),
                            float(kl_sum.detach())])
            return loss_sum

        return loss_fn


class CriticLoss:
    """The clipped value loss of one step's minibatches, in the engine's `loss_fn` form."""

    STATS = ["value_loss", "value_clip_fraction", "value_abs_error"]

    def __init__(self, batch: TrainBatch, cfg: PPOHyperparameters):
        if batch.values is None or batch.returns is None:
            raise ValueError("critic_train needs the values of critic_inf and the step's returns "
                             "(run critic_inf first)")
        self.batch, self.cfg = batch, cfg
        self.stats = StatSums(self.STATS)

    def for_rows(self, mb_rows: torch.Tensor):
        def loss_fn(output: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
            chunk, w, dev = mb_rows[rows], mb.loss_mask.shape[1], output.device
            values = token_values(output, mb)  # [n, w]
            loss_sum, stats = F.value_loss_fn(values, self.batch.values[chunk, :w].to(dev),
                                              self.batch.returns[chunk, :w].to(dev), self.cfg.value_eps_clip,
                                              mb.loss_mask)
            self.stats.add([float(loss_sum.detach()), float(stats["clip_count"]), float(stats["error_sum"])])
            return loss_sum

        return loss_fn


def loss_weight(mb: TrainBatch) -> float:
    """Both losses are token sums: a micro-batch weighs its trained tokens."""
    return float(mb.loss_mask.sum())
