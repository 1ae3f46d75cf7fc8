"""The PPO math of a train step, as the functions a TrainEngine calls back (realhf.api.engine_api).

    token_logprobs        logits → log π(token), logits divided by the generation temperature
                          (the sampler's log-probs are log_softmax(logits/T)); with
                          `token_logprobs_and_entropy` also the entropy of that distribution
    compute_advantages    rewards (+ KL, + critic values) → per-token advantages and returns
    ActorLoss             one minibatch's (decoupled) policy loss (+ KL term, − entropy bonus)
                          as an engine `loss_fn` and its `weight`, summing the step's statistics
    CriticLoss            one minibatch's clipped value loss, likewise

The losses return sums over a micro-batch (per token, or per sequence with `ppo.loss_agg_mode`,
realhf.impl.model.algorithms); the engine divides by the matching weight of the minibatch summed
over all DP ranks (docs/architecture.md §7), so DP=N computes exactly the update of DP=1 on the
union of the ranks' samples. Statistics are summed per rank and reduced once per train step.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from realhf.api.agent import shape_reward
from realhf.api.cli_args import PPOHyperparameters
from realhf.api.train_batch import TrainBatch
from realhf.base.device import all_reduce_sum
from realhf.impl.model.algorithms import aggregation, estimator
from realhf.impl.model.batching import minibatch_rows
from realhf.impl.model.utils import ppo_functional as F

# ---------------------------------------------------------------------------------------------
# Log-probs
# ---------------------------------------------------------------------------------------------


def _scaled_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits[:, :-1].float()  # [n, t-1, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)  # [n, t-1, V]


def _gather_tokens(log_softmax: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    logp = log_softmax.gather(-1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [n, t-1]
    return torch.where(mb.attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))


def token_logprobs(logits: torch.Tensor, mb: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """`[n, t-1]` log-probs of tokens 1..t-1 of `mb` under `logits` `[n, t, V]` (column j: the token
    at j+1); 0 on padding. A temperature ≤ 0 means greedy sampling, whose log-probs are not a
    distribution; it is treated as 1."""
    return _gather_tokens(_scaled_log_softmax(logits, temperature), mb)


def token_logprobs_and_entropy(
    logits: torch.Tensor, mb: TrainBatch, temperature: float = 1.0, entropy_grad: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` and `[n, t-1]` the entropy −Σ_v p·log p of the same temperature-scaled
    distribution at each position (0 on padding), from one log-softmax. Without `entropy_grad`
    the entropy is computed without autograd (a statistic only: no `[n, t-1, V]` kept for backward).
    Cheap enough to log always: ~3 ms per 64-row micro-batch of the tiny model, ~0.3% of its
    forward and backward (it costs O(V) per token, the LM head O(hidden·V))."""
    log_softmax = _scaled_log_softmax(logits, temperature)  # [n, t-1, V]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)  # [n, t-1]
    entropy = torch.where(mb.attention_mask[:, 1:].bool(), entropy, torch.zeros_like(entropy))
    return _gather_tokens(log_softmax, mb), entropy


def token_values(output: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """`[n, t-1]` critic values aligned with the predictions: column j is V of the state that
    generates token j+1 (the value head's output at position j); 0 on padding."""
    values = output[:, :-1, 0].float()  # [n, t-1]
    return torch.where(mb.attention_mask[:, 1:].bool(), values, torch.zeros_like(values))


def sequence_scores(output: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """`[n]`: a value head's output at each row's last real token (a reward model's score of the
    prompt and answer, realhf.experiments.rm)."""
    last = mb.attention_mask.sum(dim=1) - 1  # [n]
    return output[torch.arange(output.shape[0], device=output.device), last.to(output.device), 0].float()


def implicit_scores(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, loss_mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """`[n]`: an implicit reward model's score of each row, beta * the sum over its answer's
    tokens (`loss_mask` `[n, t-1]`) of log pi - log pi_ref (realhf.impl.model.reward_card)."""
    return beta * ((logprobs - ref_logprobs) * loss_mask).sum(dim=-1)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether train-mode and eval-mode forwards differ (then a train forward cannot stand in
    for the proximal log-probs)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(
        float(getattr(config, name, 0.0) or 0.0) > 0
        for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop")
    )


def first_minibatch_rows(batch: TrainBatch, n_minibatches: int) -> torch.Tensor:
    return minibatch_rows(batch, n_minibatches)[0]


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------


def kl_in_loss(cfg: PPOHyperparameters) -> bool:
    """The per-sample estimators (grpo, dr_grpo, batch_norm) put the KL to the reference in the
    loss; GAE and REINFORCE subtract it from the reward."""
    return cfg.kl_ctl > 0 and not estimator(cfg.adv_estimator).kl_in_reward


def compute_advantages(
    batch: TrainBatch, cfg: PPOHyperparameters, kl_coef: Optional[float] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages and returns, `[N, T-1]` each (0 outside the loss mask).

    - `grpo`: `(r − mean_g)/(std_g + eps)` per prompt group, the same value on every token of a
      sample; returns = advantages (no critic reads them); `dr_grpo`: `r − mean_g`;
      `batch_norm`: `(r − mean)/std` over every sample of the step on all DP ranks;
    - `gae`: the score at the last token, minus `kl_coef·KL(old ‖ ref)` at every token when a
      reference is loaded, through GAE (`discount`, `gae_lambda`) over the critic's `values`;
    - `reinforce`: the same with zero values (the reward-to-go);
    - then `adv_norm`: normalise over all trained tokens of the step, globally across DP ranks.
    `kl_coef` is the step's KL coefficient (realhf.impl.model.algorithms.KLController); None: `kl_ctl`.
    """
    mask = batch.loss_mask  # [N, T-1]
    scores = shape_reward(batch.rewards, cfg.reward_output_scaling, cfg.reward_output_bias, cfg.max_reward_clip)  # [N]
    per_sample_fn = estimator(cfg.adv_estimator).per_sample
    if per_sample_fn is not None:
        per_sample = per_sample_fn(scores, batch.group_ids)  # [N]
        adv = per_sample[:, None].expand_as(mask).to(torch.float32)  # [N, T-1]
        returns = adv
    else:
        adv, returns = _gae(batch, scores, cfg, cfg.kl_ctl if kl_coef is None else kl_coef)  # [N, T-1] each
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    if cfg.adv_norm:
        adv = F.masked_normalization(adv, mask, all_reduce=True)
    return adv, torch.where(mask, returns, torch.zeros_like(returns))


def _gae(
    batch: TrainBatch, scores: torch.Tensor, cfg: PPOHyperparameters, kl_coef: float
) -> Tuple[torch.Tensor, torch.Tensor]:
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
    token_rewards[rows] = F.rewards_with_kl(scores[rows], kl[rows], kl_coef, mask=mask[rows])
    if estimator(cfg.adv_estimator).needs_critic:
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
    """Sums of named statistics over one rank's micro-batches."""

    def __init__(self, names: List[str]):
        self.names = names
        self.sums = torch.zeros(len(names), dtype=torch.float64)  # [S]

    def add(self, values: List[float]) -> None:
        self.sums += torch.tensor(values, dtype=torch.float64)

    def global_sums(self) -> Dict[str, float]:
        """Collective: Σ over ranks."""
        total = all_reduce_sum(self.sums.clone())
        return {k: float(v) for k, v in zip(self.names, total)}

    def global_means(self, n_tokens: float) -> Dict[str, float]:
        """Collective: Σ over ranks / `n_tokens` (the global token count)."""
        return {k: v / max(n_tokens, 1.0) for k, v in self.global_sums().items()}


class ActorLoss:
    """The (decoupled) policy loss of one step's minibatches, in the engine's `loss_fn` form.

    Per trained token: the `ppo.policy_loss` surrogate (ppo_functional.actor_loss_fn), plus
    `kl_coef`·KL(π_θ ‖ π_ref) when the KL is a loss term, minus `entropy_coef`·H(π_θ); summed
    by `ppo.loss_agg_mode`, whose `weight` the engine divides by.

    The denominator log-probs: the proximal ones (`actor_inf`) with the decoupled loss;
    otherwise the recomputed ones when `recompute_logprob`, else the behaviour log-probs. With
    `fill_prox` (the deferral, realhf.system.trainer.ppo_actor), a minibatch's proximal log-probs
    were left to its own train forward, which runs before any optimizer step of the train step,
    with the proximal weights: `loss_fn` writes them into `batch.prox_logprobs` before using them.

    With `ppo.prox_logp=loglinear` no forward computes them (no `actor_inf`): the first minibatch
    is filled as above and every later one approximates them (AReaL's log-linear interpolation)
    from the behaviour log-probs and the current ones, by how many versions each token is stale
    against `version`, the weights' version at the start of the step (the proximal policy's):

        lag = version − behav_version,  a = lag / (lag + 1),  prox ≈ behav + a·(logp − behav)

    (the current policy counted one version past the proximal one; a fresh token, lag 0, takes its
    behaviour log-prob, which the proximal weights did produce).
    """

    # Token sums, except `loss` (the aggregated sum) and `n_tokens` (the count).
    STATS = [
        "loss",
        "importance_ratio",
        "approx_kl",
        "clip_fraction",
        "dual_clip_fraction",
        "behav_imp_weight",
        "behav_kl",
        "behav_capped_fraction",
        "kl_ref",
        "entropy",
        "n_tokens",
    ]

    def __init__(
        self, batch: TrainBatch, cfg: PPOHyperparameters, kl_coef: Optional[float] = None, version: Optional[int] = None
    ):
        self.loglinear = cfg.use_decoupled_loss and cfg.prox_logp == "loglinear"
        if self.loglinear:
            if version is None or batch.behav_versions is None:
                raise ValueError("ppo.prox_logp=loglinear needs the step's version and the batch's behav_versions")
            if batch.prox_logprobs is None:  # the first minibatch's, written by its train forward
                batch.prox_logprobs = torch.zeros_like(batch.behav_logprobs)
            lag = (version - batch.behav_versions).clamp(min=0).float()  # [N, T-1]
            self.alpha = lag / (lag + 1.0)  # [N, T-1]
        if cfg.use_decoupled_loss and batch.prox_logprobs is None:
            raise ValueError(
                "ppo.use_decoupled_loss needs proximal log-probs: run actor_inf (inference) before actor_train"
            )
        if cfg.kl_ctl > 0 and batch.ref_logprobs is None:
            raise ValueError("ppo.kl_ctl > 0 needs reference log-probs: run ref_inf before actor_train")
        if batch.advantages is None:
            raise ValueError(
                "actor_train needs the step's advantages (realhf.system.trainer.ppo_actor.ensure_advantages)"
            )
        self.batch, self.cfg = batch, cfg
        self.kl_coef = cfg.kl_ctl if kl_coef is None else kl_coef
        self.agg = aggregation(cfg.loss_agg_mode)
        self.old = batch.behav_logprobs  # [N, T-1]
        self.prox = batch.prox_logprobs if cfg.use_decoupled_loss else None  # [N, T-1] or None
        if not cfg.use_decoupled_loss and cfg.recompute_logprob and batch.prox_logprobs is not None:
            self.old = batch.prox_logprobs
        self.stats = StatSums(self.STATS)

    def weight(self, mb: TrainBatch) -> float:
        """The engine's `loss_weight_fn`: what this micro-batch adds to the step's denominator."""
        return self.agg.weight(mb.loss_mask)

    def for_rows(self, mb_rows: torch.Tensor, fill_prox: bool = False):
        """`loss_fn(logits, mb, rows)` for the minibatch of batch rows `mb_rows` (the engine's
        `rows` index that minibatch)."""

        def loss_fn(logits: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
            cfg, chunk = self.cfg, mb_rows[rows]  # chunk: rows of the whole batch
            w, mask = mb.loss_mask.shape[1], mb.loss_mask
            dev = logits.device
            logp, entropy = token_logprobs_and_entropy(
                logits, mb, cfg.gen.temperature, entropy_grad=cfg.entropy_coef > 0
            )  # [n, w] each
            if fill_prox:
                # `old`/`prox` are views of this tensor: the loss below reads what is written here.
                self.batch.prox_logprobs[chunk, :w] = logp.detach().cpu()
            prox = None if self.prox is None else self.prox[chunk, :w].to(dev)
            if self.loglinear and not fill_prox:
                old, a = self.old[chunk, :w].to(dev), self.alpha[chunk, :w].to(dev)
                prox = old + a * (logp.detach() - old)
            loss, stats = F.actor_loss_fn(
                logp,
                self.old[chunk, :w].to(dev),
                self.batch.advantages[chunk, :w].to(dev),
                cfg.eps_clip,
                mask,
                c_clip=cfg.c_clip,
                proximal_logprobs=prox,
                behav_imp_weight_cap=cfg.behav_imp_weight_cap,
                eps_clip_high=cfg.eps_clip_high,
                reduce="none",
                policy_loss=cfg.policy_loss,
            )  # fmt: skip  [n, w]
            kl = torch.zeros_like(loss)  # [n, w]
            if cfg.kl_ctl > 0:
                kl = F.kl_estimate(logp, self.batch.ref_logprobs[chunk, :w].to(dev), cfg.kl_estimator)  # [n, w]
                kl = torch.where(mask, kl, torch.zeros_like(kl))
                if kl_in_loss(cfg):
                    loss = loss + self.kl_coef * kl
            entropy = torch.where(mask, entropy, torch.zeros_like(entropy))
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * entropy
            loss_sum = self.agg.loss_sum(loss, mask)
            n = float(stats["n_tokens"])
            self.stats.add(
                [
                    float(loss_sum.detach()),
                    *(float(stats[k]) * n for k in self.STATS[1:-3]),
                    float(kl.detach().sum()),
                    float(entropy.detach().sum()),
                    n,
                ]
            )
            return loss_sum

        return loss_fn

    def global_stats(self, total_weight: float) -> Dict[str, float]:
        """Collective: the step's statistics over all ranks: `loss` per unit of weight (the loss
        the engine minimised, averaged over the minibatches by weight), the rest per token."""
        sums = self.stats.global_sums()
        n_tokens = sums.pop("n_tokens")
        out = {k: v / max(n_tokens, 1.0) for k, v in sums.items()}
        out["loss"] = sums["loss"] / total_weight if total_weight > 0 else 0.0
        out["n_tokens"] = n_tokens
        return out


class CriticLoss:
    """The clipped value loss of one step's minibatches, in the engine's `loss_fn` form."""

    STATS = ["value_loss", "value_clip_fraction", "value_abs_error"]

    def __init__(self, batch: TrainBatch, cfg: PPOHyperparameters):
        if batch.values is None or batch.returns is None:
            raise ValueError(
                "critic_train needs the values of critic_inf and the step's returns (run critic_inf first)"
            )
        self.batch, self.cfg = batch, cfg
        self.stats = StatSums(self.STATS)
        self.weight = loss_weight

    def for_rows(self, mb_rows: torch.Tensor):
        def loss_fn(output: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
            chunk, w, dev = mb_rows[rows], mb.loss_mask.shape[1], output.device
            values = token_values(output, mb)  # [n, w]
            loss_sum, stats = F.value_loss_fn(
                values,
                self.batch.values[chunk, :w].to(dev),
                self.batch.returns[chunk, :w].to(dev),
                self.cfg.value_eps_clip,
                mb.loss_mask,
            )
            self.stats.add([float(loss_sum.detach()), float(stats["clip_count"]), float(stats["error_sum"])])
            return loss_sum

        return loss_fn


def loss_weight(mb: TrainBatch) -> float:
    """A token sum's weight (the critic's loss, the actor's with token-mean): a micro-batch
    weighs its trained tokens."""
    return float(mb.loss_mask.sum())
